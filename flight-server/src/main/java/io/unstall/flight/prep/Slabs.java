package io.unstall.flight.prep;

import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.OutOfMemoryException;

/**
 * Append-only memory for entries that are never evicted (the cache forms): {@link #SLAB}-byte slabs of an
 * allocator, filled in order, freed together at close. Readers may hold an entry's buffer until then.
 */
final class Slabs implements AutoCloseable {
  /** Bytes per slab: a power of two, which Arrow's allocator does not round up. */
  static final int SLAB = 4 << 20;

  private final BufferAllocator memory;
  // Guarded by this.
  private final List<ArrowBuf> slabs = new ArrayList<>();
  private ArrowBuf slab;
  private long slabUsed;
  private long bytes;
  private volatile boolean full;

  Slabs(BufferAllocator memory) {
    this.memory = memory;
  }

  /**
   * Room for n bytes in the current slab or a new one, within {@code quota} bytes placed in all; null when the
   * quota is reached, or (full from now on) when the allocator is used up.
   */
  synchronized ByteBuffer place(int n, long quota) {
    if (full || bytes + n > quota) {
      return null;
    }
    if (slab == null || slabUsed + n > slab.capacity()) {
      ArrowBuf next;
      try {
        next = memory.buffer(Math.max(SLAB, n));
      } catch (OutOfMemoryException e) {
        full = true;
        return null;
      }
      slabs.add(next);
      slab = next;
      slabUsed = 0;
    }
    ByteBuffer b = slab.nioBuffer(slabUsed, n);
    slabUsed += n;
    bytes += n;
    return b;
  }

  boolean full() {
    return full;
  }

  /** Bytes placed. */
  synchronized long bytes() {
    return bytes;
  }

  @Override
  public synchronized void close() {
    slabs.forEach(ArrowBuf::close);
    slabs.clear();
    slab = null;
    full = true;
  }
}
