package io.unstall.flight.cache;

import java.util.concurrent.atomic.AtomicLong;

/** What the cache policies share: their paged off-heap arena, capacity, policy name and sharing counter. */
abstract class ArenaCache implements SampleCache {
  protected final Arena arena;
  protected final long capacity;
  protected final AtomicLong sharedBytes = new AtomicLong();
  private final String policy;

  ArenaCache(String policy, Arena arena, long capacityBytes) {
    this.policy = policy;
    this.arena = arena;
    this.capacity = capacityBytes;
  }

  @Override
  public final String policy() {
    return policy;
  }

  @Override
  public final long capacityBytes() {
    return capacity;
  }

  @Override
  public final long sharedBytes() {
    return sharedBytes.get();
  }

  /** Off-heap bytes held (whole pages), for accounting tests. */
  public final long allocatedBytes() {
    return arena.allocatedBytes();
  }

  /** Drops the entries; the arena's pages go back to the allocator. */
  protected abstract void clearEntries();

  @Override
  public final synchronized void close() {
    clearEntries();
    arena.close();
  }
}
