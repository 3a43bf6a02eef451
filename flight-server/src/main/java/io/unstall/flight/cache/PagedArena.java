package io.unstall.flight.cache;

import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;

/**
 * Off-heap memory of a cache as one address space of 1 MiB pages, allocated lazily from the cache's allocator
 * (the data plane gives it a limit of the capacity rounded up to a page). Pages are powers of two, so Arrow's
 * rounding wastes nothing, and a cache never holds more than its capacity plus less than a page.
 */
final class PagedArena extends Arena {
  static final int PAGE = 1 << 20;

  PagedArena(BufferAllocator allocator, long capacityBytes) {
    super(allocator, pageCount(capacityBytes));
  }

  private static int pageCount(long capacityBytes) {
    if (capacityBytes < 0) {
      throw new IllegalArgumentException("cache capacity must be >= 0, got " + capacityBytes);
    }
    long pageCount = (capacityBytes + PAGE - 1) / PAGE;
    if (pageCount > Integer.MAX_VALUE) {
      throw new IllegalArgumentException("cache capacity " + capacityBytes + " is too large");
    }
    return (int) pageCount;
  }

  @Override
  long place(long end, int length) {
    return end; // entries may span pages: transfer copies page by page
  }

  @Override
  void ensure(long from, long to) {
    for (long p = from / PAGE; p * PAGE < to; p++) {
      if (chunks.get((int) p) == null) {
        chunks.set((int) p, allocator.buffer(PAGE));
      }
    }
  }

  @Override
  void transfer(long addr, ArrowBuf buf, long bufIndex, long length, boolean intoArena) {
    while (length > 0) {
      ArrowBuf page = chunks.get((int) (addr / PAGE));
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
}
