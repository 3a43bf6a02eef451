package io.unstall.flight.cache;

import io.unstall.flight.shm.SharedMemory;
import io.unstall.flight.shm.ShmBuffer;
import java.io.IOException;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;

/**
 * A never-evict cache's arena in shared memory: segments of up to 1 GiB, files {@code cache-<k>} in the
 * sidecar's /dev/shm directory, that clients on this host map read-only and read entries from in place. An
 * entry never spans two segments (so a client sees it as one contiguous view); the gap at a segment's end
 * is the price, at most one entry per GiB. Segments are created lazily and counted by the cache's allocator;
 * their tmpfs pages are committed a MiB at a time as entries are appended, so a full /dev/shm refuses an
 * admission instead of faulting.
 */
final class ShmArena extends Arena {
  static final long SEGMENT = 1L << 30;
  private static final long COMMIT = 1 << 20;

  private final SharedMemory shm;
  private final long capacity; // rounded up to a MiB
  private final long segment;
  private final ShmBuffer[] files;
  private long committed; // guarded by the caller (ensure is serialised): high-water mark of committed bytes

  ShmArena(BufferAllocator allocator, SharedMemory shm, long capacityBytes) {
    this(allocator, shm, roundedCapacity(capacityBytes), segmentSize(roundedCapacity(capacityBytes)));
  }

  private ShmArena(BufferAllocator allocator, SharedMemory shm, long capacity, long segment) {
    super(allocator, (int) ((capacity + segment - 1) / segment));
    this.capacity = capacity;
    this.segment = segment;
    this.shm = shm;
    this.files = new ShmBuffer[chunks.length()];
  }

  private static long roundedCapacity(long capacityBytes) {
    if (capacityBytes < 0) {
      throw new IllegalArgumentException("cache capacity must be >= 0, got " + capacityBytes);
    }
    return (capacityBytes + COMMIT - 1) / COMMIT * COMMIT;
  }

  private static long segmentSize(long capacity) {
    return Math.max(COMMIT, Math.min(SEGMENT, capacity));
  }

  /** The file name of segment {@code k} in the shared-memory directory. */
  static String segmentName(int k) {
    return "cache-" + k;
  }

  /** Segment and offset of an entry at {@code addr}. */
  int segmentOf(long addr) {
    return (int) (addr / segment);
  }

  long offsetOf(long addr) {
    return addr % segment;
  }

  @Override
  long place(long end, int length) {
    long inSegment = end % segment;
    if (inSegment != 0 && inSegment + length > segment) {
      return end - inSegment + segment; // the next segment's start: entries never span two
    }
    return end;
  }

  @Override
  void ensure(long from, long to) throws IOException {
    if (to > capacity) {
      throw new IllegalArgumentException("arena range [" + from + ", " + to + ") beyond capacity " + capacity);
    }
    long target = Math.min(capacity, (to + COMMIT - 1) / COMMIT * COMMIT);
    while (committed < target) {
      int k = segmentOf(committed);
      if (chunks.get(k) == null) {
        long size = Math.min(segment, capacity - (long) k * segment);
        ShmBuffer f = ShmBuffer.create(shm.resolve(segmentName(k)), size, false);
        files[k] = f;
        chunks.set(k, allocator.wrapForeignAllocation(f));
      }
      long segEnd = Math.min(capacity, (long) (k + 1) * segment);
      long upTo = Math.min(target, segEnd);
      files[k].commit(offsetOf(committed), upTo - (long) k * segment);
      committed = upTo;
    }
  }

  @Override
  void transfer(long addr, ArrowBuf buf, long bufIndex, long length, boolean intoArena) {
    ArrowBuf seg = chunks.get(segmentOf(addr));
    long off = offsetOf(addr);
    if (intoArena) {
      seg.setBytes(off, buf, bufIndex, length);
    } else {
      buf.setBytes(bufIndex, seg, off, length);
    }
  }
}
