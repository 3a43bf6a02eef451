package io.unstall.flight.cache;

import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.Map;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;

/**
 * A least-recently-used cache of the same capacity, for comparison with {@link MinioCache}
 * ({@code --cache-policy lru}). Entries occupy 16 KiB blocks of the same paged arena; evicting returns their
 * blocks to a free list. Used bytes count whole blocks (the rounding is the honest price of eviction).
 */
public final class LruCache extends ArenaCache {
  static final int BLOCK = 16 * 1024;

  private static final class Entry extends SharedEntry {
    final int[] blocks;

    Entry(int[] blocks, int length, String owner) {
      super(length, owner);
      this.blocks = blocks;
    }
  }

  private final PagedArena pages; // the arena, typed: blocks are ensured page by page
  private final int totalBlocks;
  private final LinkedHashMap<Digest, Entry> entries = new LinkedHashMap<>(1024, 0.75f, true); // guarded by this
  private int[] free; // guarded by this: stack of free block numbers
  private int freeTop;
  private int nextFresh;

  /** Keeps its entries in memory from {@code allocator} (the data plane's "cache" child; not closed here). */
  public LruCache(BufferAllocator allocator, long capacityBytes) {
    this(new PagedArena(allocator, capacityBytes), capacityBytes);
  }

  private LruCache(PagedArena pages, long capacityBytes) {
    super("lru", pages, capacityBytes);
    this.pages = pages;
    this.totalBlocks = (int) Math.min(Integer.MAX_VALUE, capacityBytes / BLOCK);
    this.free = new int[0];
  }

  @Override
  public synchronized long usedBytes() {
    return (long) (nextFresh - freeTop) * BLOCK;
  }

  @Override
  public synchronized long entries() {
    return entries.size();
  }

  @Override
  public synchronized boolean contains(Digest key) {
    return entries.containsKey(key);
  }

  @Override
  public synchronized boolean copyTo(Digest key, ArrowBuf dst, long dstIndex, String dataset) {
    Entry e = entries.get(key); // also moves it to the most-recently-used end
    if (e == null) {
      return false;
    }
    blockTransfer(e, dst, dstIndex, false);
    e.usedBy(dataset, sharedBytes);
    return true;
  }

  @Override
  public synchronized Admission admit(Digest key, ArrowBuf src, long srcIndex, int length, String dataset) {
    Entry present = entries.get(key);
    if (present != null) {
      present.usedBy(dataset, sharedBytes);
      return Admission.PRESENT;
    }
    int need = Math.max(1, (length + BLOCK - 1) / BLOCK);
    if (need > totalBlocks) {
      return Admission.REFUSED;
    }
    Iterator<Map.Entry<Digest, Entry>> lru = entries.entrySet().iterator();
    while (freeTop + (totalBlocks - nextFresh) < need) {
      Entry victim = lru.next().getValue();
      lru.remove();
      for (int b : victim.blocks) {
        push(b);
      }
    }
    int[] blocks = new int[need];
    for (int i = 0; i < need; i++) {
      blocks[i] = freeTop > 0 ? free[--freeTop] : nextFresh++;
      pages.ensure((long) blocks[i] * BLOCK, (long) blocks[i] * BLOCK + BLOCK);
    }
    Entry e = new Entry(blocks, length, dataset);
    blockTransfer(e, src, srcIndex, true);
    entries.put(key, e);
    return Admission.ADMITTED;
  }

  private void push(int block) {
    if (freeTop == free.length) {
      free = java.util.Arrays.copyOf(free, Math.max(64, free.length * 2));
    }
    free[freeTop++] = block;
  }

  private void blockTransfer(Entry e, ArrowBuf buf, long bufIndex, boolean intoArena) {
    long remaining = e.length;
    for (int i = 0; remaining > 0; i++) {
      int n = (int) Math.min(BLOCK, remaining);
      arena.transfer((long) e.blocks[i] * BLOCK, buf, bufIndex + (long) i * BLOCK, n, intoArena);
      remaining -= n;
    }
  }

  @Override
  protected synchronized void clearEntries() {
    entries.clear();
  }
}
