package io.unstall.flight.cache;

import java.io.IOException;
import org.apache.arrow.memory.ArrowBuf;

/** The off-heap address space a cache keeps its entries in, allocated lazily from the cache's own allocator. */
interface Arena extends AutoCloseable {

  /** Where an entry of {@code length} bytes goes at or after address {@code end} (arenas may skip a gap). */
  long place(long end, int length);

  /** Makes sure the memory under {@code [from, to)} exists. Callers serialise calls. */
  void ensure(long from, long to) throws IOException;

  /** Copies between the arena at {@code addr} and {@code buf}, in the given direction. */
  void transfer(long addr, ArrowBuf buf, long bufIndex, long length, boolean intoArena);

  /** Off-heap bytes held, for accounting tests. */
  long allocatedBytes();

  @Override
  void close();
}
