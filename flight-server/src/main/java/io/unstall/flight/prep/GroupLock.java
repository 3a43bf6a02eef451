package io.unstall.flight.prep;

/**
 * The one monitor of a prep group. The group's parts ({@link Membership}, {@link Staging}, {@link Production}, its
 * {@link BatchSource}, {@link RemoteWorkers}, {@link PrepCounts}) keep their mutable state guarded by it and wait on
 * it; their methods marked "caller holds the group lock" run inside {@code synchronized (lock)}.
 *
 * <p>Lock order, outer first: {@link PrepGroups}' monitor, then the group lock, then {@link BatchOrder}'s (a
 * leaf), then the Arrow allocators' own. Nothing that holds the group lock calls into {@code PrepGroups}, the prep
 * pool, the batch assembler or a Flight listener: fetching, decoding and sending run outside it. One exception: a
 * cache-first order's snapshot ({@code BatchAssembler.cached}, lookups in the caches' indexes, once per epoch).
 */
final class GroupLock {
  /** Wakes every wait on the group (a batch staged, a cursor moved, a member gone). Caller holds the lock. */
  void changed() {
    notifyAll();
  }

  /** Waits up to {@code millis} for a change. Caller holds the lock. */
  void await(long millis) throws InterruptedException {
    wait(millis);
  }
}
