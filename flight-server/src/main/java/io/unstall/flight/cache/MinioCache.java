package io.unstall.flight.cache;

import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicReferenceArray;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;

/**
 * CoorDL's MinIO cache: samples are admitted until the capacity is reached and are never evicted, so every
 * epoch gets the same hits however the sampler orders it (LRU and the page cache thrash under random order).
 *
 * <p>Never evicting makes the cache an append-only arena: entries are laid end to end in 1 MiB off-heap pages
 * allocated lazily from the cache's own child allocator. Admission only bumps a pointer, nothing fragments,
 * and the memory held is at most the capacity rounded up to a page.
 */
public final class MinioCache implements SampleCache {
  public static final int PAGE = 1 << 20;

  private record Entry(long address, int length) {}

  private final BufferAllocator allocator;
  private final long capacity;
  private final AtomicReferenceArray<ArrowBuf> pages;
  private final ConcurrentHashMap<CacheKey, Entry> entries = new ConcurrentHashMap<>();
  private final ConcurrentHashMap<CacheKey, Boolean> pending = new ConcurrentHashMap<>();
  private long end; // guarded by this: next free address
  private volatile long used;

  /** Takes ownership of a child allocator of {@code parent} named "cache", limited to the capacity. */
  public MinioCache(BufferAllocator parent, long capacityBytes) {
    if (capacityBytes < 0) {
      throw new IllegalArgumentException("cache capacity must be >= 0, got " + capacityBytes);
    }
    long pageCount = (capacityBytes + PAGE - 1) / PAGE;
    if (pageCount > Integer.MAX_VALUE) {
      throw new IllegalArgumentException("cache capacity " + capacityBytes + " is too large");
    }
    this.capacity = capacityBytes;
    this.allocator = parent.newChildAllocator("cache", 0, pageCount * PAGE);
    this.pages = new AtomicReferenceArray<>((int) pageCount);
  }

  @Override
  public String policy() {
    return "minio";
  }

  @Override
  public long capacityBytes() {
    return capacity;
  }

  @Override
  public long usedBytes() {
    return used;
  }

  @Override
  public long entries() {
    return entries.size();
  }

  @Override
  public boolean copyTo(CacheKey key, ArrowBuf dst, long dstIndex) {
    Entry e = entries.get(key);
    if (e == null) {
      return false;
    }
    transfer(e.address(), dst, dstIndex, e.length(), false);
    return true;
  }

  @Override
  public boolean admit(CacheKey key, ArrowBuf src, long srcIndex, int length) {
    if (entries.containsKey(key) || pending.putIfAbsent(key, Boolean.TRUE) != null) {
      return false;
    }
    try {
      long addr;
      synchronized (this) {
        if (end + length > capacity) {
          return false; // full for this sample: MinIO never evicts to make room
        }
        addr = end;
        end += length;
        for (long p = addr / PAGE; p * PAGE < end; p++) {
          if (pages.get((int) p) == null) {
            pages.set((int) p, allocator.buffer(PAGE));
          }
        }
      }
      transfer(addr, src, srcIndex, length, true);
      entries.put(key, new Entry(addr, length));
      synchronized (this) {
        used += length;
      }
      return true;
    } finally {
      pending.remove(key);
    }
  }

  /** Copies between the arena at {@code addr} and {@code buf}, page by page, in the given direction. */
  private void transfer(long addr, ArrowBuf buf, long bufIndex, long length, boolean intoCache) {
    while (length > 0) {
      ArrowBuf page = pages.get((int) (addr / PAGE));
      int inPage = (int) (addr % PAGE);
      int n = (int) Math.min(length, PAGE - inPage);
      if (intoCache) {
        page.setBytes(inPage, buf, bufIndex, n);
      } else {
        buf.setBytes(bufIndex, page, inPage, n);
      }
      addr += n;
      bufIndex += n;
      length -= n;
    }
  }

  /** Off-heap bytes held (whole pages), for accounting tests. */
  public long allocatedBytes() {
    return allocator.getAllocatedMemory();
  }

  @Override
  public synchronized void close() {
    entries.clear();
    for (int i = 0; i < pages.length(); i++) {
      ArrowBuf b = pages.getAndSet(i, null);
      if (b != null) {
        b.close();
      }
    }
    allocator.close();
  }
}
