package io.unstall.flight.cache;

import java.io.IOException;
import java.util.concurrent.atomic.AtomicReferenceArray;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;

/**
 * The off-heap address space a cache keeps its entries in: chunks (pages, or shared-memory segments) allocated
 * lazily from the allocator it is given (the data plane's "cache" child, its limit the capacity). The arena
 * frees its chunks on close; the allocator is its builder's to close (the data plane's, or a test's).
 */
abstract class Arena implements AutoCloseable {
  protected final BufferAllocator allocator;
  protected final AtomicReferenceArray<ArrowBuf> chunks;

  Arena(BufferAllocator allocator, int chunkCount) {
    this.allocator = allocator;
    this.chunks = new AtomicReferenceArray<>(chunkCount);
  }

  /** Where an entry of {@code length} bytes goes at or after address {@code end} (arenas may skip a gap). */
  abstract long place(long end, int length);

  /** Makes sure the memory under {@code [from, to)} exists. Callers serialise calls. */
  abstract void ensure(long from, long to) throws IOException;

  /** Copies between the arena at {@code addr} and {@code buf}, in the given direction. */
  abstract void transfer(long addr, ArrowBuf buf, long bufIndex, long length, boolean intoArena);

  /** Off-heap bytes held, for accounting tests. */
  final long allocatedBytes() {
    return allocator.getAllocatedMemory();
  }

  @Override
  public final void close() {
    for (int i = 0; i < chunks.length(); i++) {
      ArrowBuf b = chunks.getAndSet(i, null);
      if (b != null) {
        b.close();
      }
    }
  }
}
