package io.unstall.flight.cache;

import io.unstall.flight.shm.SharedMemory;
import io.unstall.flight.shm.ShmRef;
import java.io.IOException;
import java.util.concurrent.ConcurrentHashMap;
import org.slf4j.LoggerFactory;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;

/**
 * CoorDL's MinIO cache: samples are admitted until the capacity is reached and are never evicted, so every
 * epoch gets the same hits however the sampler orders it (LRU and the page cache thrash under random order).
 *
 * <p>Never evicting makes the cache an append-only arena: entries are laid end to end in lazily allocated
 * pages, admission is a pointer bump, nothing fragments, and used bytes are exactly the entries' bytes.
 */
public final class MinioCache extends ArenaCache {
  public static final int PAGE = PagedArena.PAGE;

  private static final class Entry extends SharedEntry {
    final long address;

    Entry(long address, int length, String owner) {
      super(length, owner);
      this.address = address;
    }
  }

  private final ConcurrentHashMap<Digest, Entry> entries = new ConcurrentHashMap<>();
  private final ConcurrentHashMap<Digest, Boolean> pending = new ConcurrentHashMap<>();
  private long end; // guarded by this: next free address
  private volatile long used;

  /** Keeps its entries in memory from {@code allocator} (the data plane's "cache" child; not closed here). */
  public MinioCache(BufferAllocator allocator, long capacityBytes) {
    this(allocator, capacityBytes, null);
  }

  /**
   * With {@code shm}, the arena lives in shared-memory segments of that directory, which clients on this host
   * map and read entries from in place ({@link #locate}); without, in off-heap pages.
   */
  public MinioCache(BufferAllocator allocator, long capacityBytes, SharedMemory shm) {
    super("minio", shm == null ? new PagedArena(allocator, capacityBytes)
        : new ShmArena(allocator, shm, capacityBytes), capacityBytes);
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
  public boolean contains(Digest key) {
    return entries.containsKey(key);
  }

  @Override
  public boolean copyTo(Digest key, ArrowBuf dst, long dstIndex, String dataset) {
    Entry e = entries.get(key);
    if (e == null) {
      return false;
    }
    arena.transfer(e.address, dst, dstIndex, e.length, false);
    e.usedBy(dataset, sharedBytes);
    return true;
  }

  @Override
  public ShmRef locate(Digest key, String dataset) {
    if (!(arena instanceof ShmArena shm)) {
      return null;
    }
    Entry e = entries.get(key);
    if (e == null) {
      return null;
    }
    e.usedBy(dataset, sharedBytes);
    return new ShmRef(ShmArena.segmentName(shm.segmentOf(e.address)), shm.offsetOf(e.address), e.length);
  }

  @Override
  public Admission admit(Digest key, ArrowBuf src, long srcIndex, int length, String dataset) {
    Entry present = entries.get(key);
    if (present != null) {
      present.usedBy(dataset, sharedBytes);
      return Admission.PRESENT;
    }
    if (pending.putIfAbsent(key, Boolean.TRUE) != null) {
      return Admission.PRESENT; // another stream is admitting the same bytes right now
    }
    try {
      long addr;
      synchronized (this) {
        addr = arena.place(end, length);
        if (addr + length > capacity) {
          return Admission.REFUSED; // full for this sample: MinIO never evicts to make room
        }
        try {
          arena.ensure(addr, addr + length);
        } catch (IOException e) {
          warnOnce(e);
          return Admission.REFUSED;
        }
        end = addr + length;
      }
      arena.transfer(addr, src, srcIndex, length, true);
      entries.put(key, new Entry(addr, length, dataset));
      synchronized (this) {
        used += length;
      }
      return Admission.ADMITTED;
    } finally {
      pending.remove(key);
    }
  }

  private volatile boolean warned;

  private void warnOnce(IOException e) {
    if (!warned) {
      warned = true;
      LoggerFactory.getLogger(MinioCache.class).warn("the cache stops admitting: {}", e.getMessage());
    }
  }

  @Override
  protected synchronized void clearEntries() {
    entries.clear();
  }
}
