package io.unstall.flight.cache;

import java.util.concurrent.atomic.AtomicReferenceArray;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;

/**
 * Off-heap memory of a cache as one address space of 1 MiB pages, allocated lazily from the cache's own child
 * allocator (limit: the capacity rounded up to a page). Pages are powers of two, so Arrow's rounding wastes
 * nothing, and a cache never holds more than its capacity plus less than a page.
 */
final class PagedArena implements Arena {
  static final int PAGE = 1 << 20;

  private final BufferAllocator allocator;
  private final AtomicReferenceArray<ArrowBuf> pages;

  PagedArena(BufferAllocator parent, String name, long capacityBytes) {
    if (capacityBytes < 0) {
      throw new IllegalArgumentException("cache capacity must be >= 0, got " + capacityBytes);
    }
    long pageCount = (capacityBytes + PAGE - 1) / PAGE;
    if (pageCount > Integer.MAX_VALUE) {
      throw new IllegalArgumentException("cache capacity " + capacityBytes + " is too large");
    }
    this.allocator = parent.newChildAllocator(name, 0, pageCount * PAGE);
    this.pages = new AtomicReferenceArray<>((int) pageCount);
  }

  @Override
  public long place(long end, int length) {
    return end; // entries may span pages: transfer copies page by page
  }

  @Override
  public void ensure(long from, long to) {
    for (long p = from / PAGE; p * PAGE < to; p++) {
      if (pages.get((int) p) == null) {
        pages.set((int) p, allocator.buffer(PAGE));
      }
    }
  }

  @Override
  public void transfer(long addr, ArrowBuf buf, long bufIndex, long length, boolean intoArena) {
    while (length > 0) {
      ArrowBuf page = pages.get((int) (addr / PAGE));
      int inPage = (int) (addr % PAGE);
      int n = (int) Math.min(length, PAGE - inPage);
      if (intoArena) {
        page.setBytes(inPage, buf, bufIndex, n);
      } else {
        buf.setBytes(bufIndex, page, inPage, n);
      }
      addr += n;
      bufIndex += n;
      length -= n;
    }
  }

  @Override
  public long allocatedBytes() {
    return allocator.getAllocatedMemory();
  }

  @Override
  public void close() {
    for (int i = 0; i < pages.length(); i++) {
      ArrowBuf b = pages.getAndSet(i, null);
      if (b != null) {
        b.close();
      }
    }
    allocator.close();
  }
}
