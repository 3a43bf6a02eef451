package io.unstall.flight.prep;

import io.unstall.flight.format.CorruptRecordException;
import java.util.ArrayList;
import java.util.List;
import java.util.TreeSet;
import java.util.concurrent.TimeUnit;
import java.util.function.IntSupplier;
import java.util.function.LongSupplier;
import org.apache.arrow.flight.CallStatus;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * What a group prepares next and who prepares it: hands out positions in order, within the window's span ahead of
 * the slowest member ({@link Membership#aheadEnd}) and within staging memory (positions given back by remote workers
 * first), and runs the producer threads that have the {@link BatchSource} make them and stage them. When the last
 * producer thread ends (the group closed) it frees staging. Guarded by the group lock.
 */
final class Production {
  private static final Logger LOG = LoggerFactory.getLogger(Production.class);
  /** Batches prepared concurrently: one's serial fetch overlaps another's parallel decode. */
  static final int PRODUCERS = 2;

  private final BatchOrder order;
  private final Membership members;
  private final Staging staging;
  private final BatchSource source;
  private final PrepCounts counts;
  private final GroupLock lock;
  private final List<Thread> threads = new ArrayList<>();
  // Guarded by the group lock.
  private final TreeSet<Long> returned = new TreeSet<>(); // given back by remote workers: prepare again
  private final IntSupplier remoteClaims; // positions remote workers are preparing now
  private final LongSupplier clock;
  private long next; // the next new position to prepare
  private int preparing;
  private int live;

  /**
   * {@code remoteClaims}: positions remote workers are preparing now (asked with the lock held, only once the threads
   * run); {@code clock}: {@link System#nanoTime}, or a fake one in tests.
   */
  Production(BatchOrder order, Membership members, Staging staging, BatchSource source, PrepCounts counts,
      GroupLock lock, IntSupplier remoteClaims, LongSupplier clock) {
    this.remoteClaims = remoteClaims;
    this.clock = clock;
    this.order = order;
    this.members = members;
    this.staging = staging;
    this.source = source;
    this.counts = counts;
    this.lock = lock;
  }

  /** Starts the source's producer threads. */
  void start() {
    synchronized (lock) {
      live = source.producers();
    }
    for (int i = 0; i < source.producers(); i++) {
      Thread t = new Thread(this::produceLoop, "unstall-prep-" + order.group + "-" + i);
      t.setDaemon(true);
      threads.add(t);
      t.start();
    }
  }

  /** Whether the source's batches are made here (false: members upload them and free nothing on exit). */
  boolean runsThreads() {
    return !threads.isEmpty();
  }

  /**
   * Whether staging has room for {@code local} more batches made here and {@code remote} made by remote workers:
   * what is allocated (staged, being sent, partly prepared) plus a whole batch for each one in preparation;
   * conservative, so an allocation never fails. Caller holds the lock.
   */
  boolean roomFor(int local, int remote) {
    return staging.allocated() - staging.reusableBytes()
        + (preparing + local) * (source.batchBytes() + source.workingBytes())
        + remote * source.batchBytes() <= staging.limit();
  }

  /**
   * {@link #roomFor} one more batch made here, after retiring shared-memory slots that members still map but no
   * member's cursor needs (their memory becomes theirs, as with a file per batch). Caller holds the lock.
   */
  private boolean roomOrReclaim(int remote) {
    while (!roomFor(1, remote)) {
      if (!staging.reclaim()) {
        return false;
      }
    }
    return true;
  }

  /**
   * The next position to prepare (here or by a remote worker), or -1: first one a worker gave back (its claim
   * expired, it left, or it failed), then the next new one within the window. Caller holds the lock.
   */
  long take() {
    long min = members.minCursor();
    while (!returned.isEmpty() && returned.first() < min) {
      returned.pollFirst(); // every member skipped past it
    }
    if (!returned.isEmpty()) {
      return returned.pollFirst();
    }
    next = Math.max(next, min);
    if (next < members.aheadEnd(staging.window()) && next < members.maxEnd()) {
      return next++;
    }
    return -1;
  }

  /** Prepares {@code pos} again (here or by another worker). Caller holds the lock. */
  void giveBack(long pos) {
    returned.add(pos);
    lock.changed();
  }

  private void produceLoop() {
    try {
      while (true) {
        long pos;
        synchronized (lock) {
          while (true) {
            if (members.closed()) {
              return;
            }
            members.maybeStart(clock.getAsLong());
            if (members.running()) {
              // Every member is past what lies below the slowest cursor (resumed members, skips): never prepared.
              next = Math.max(next, members.minCursor());
              if (roomOrReclaim(remoteClaims.getAsInt())) {
                long p = take();
                if (p >= 0) {
                  pos = p;
                  break;
                }
              }
            }
            lock.await(10); // sends release memory without telling us: look again soon
          }
          preparing++;
          counts.producers(preparing, clock.getAsLong());
        }
        long t0 = clock.getAsLong();
        VectorSchemaRoot root = null;
        FlightRuntimeException failure = null;
        try {
          root = source.prepare(pos, staging);
        } catch (FlightRuntimeException e) {
          failure = e;
        } catch (CorruptRecordException e) { // a bad sample: the members are told which, as a fetch would be
          failure = e.dataError().toStatus(e.getMessage(), e);
        } catch (Exception e) {
          failure = CallStatus.INTERNAL.withDescription(e.getMessage() == null ? e.toString() : e.getMessage())
              .withCause(e).toRuntimeException();
        }
        synchronized (lock) {
          preparing--;
          counts.producers(preparing, clock.getAsLong());
          if (failure != null) {
            LOG.warn("prep group {}: batch {} of epoch {} failed: {}", order.group, pos % order.numBatches,
                pos / order.numBatches, failure.getMessage());
            staging.fail(pos, failure);
          } else {
            counts.prepNanos += clock.getAsLong() - t0;
            counts.preparedBy.merge("local", 1L, Long::sum);
            counts.prepared(pos / order.numBatches, root.getRowCount());
            staging.put(pos, root, members.minCursor(), members.closed());
          }
        }
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    } catch (Throwable e) {
      LOG.error("prep group {}: producer failed", order.group, e);
    } finally {
      boolean last;
      synchronized (lock) {
        members.close();
        last = --live == 0;
      }
      if (last) {
        staging.free();
      }
    }
  }

  /** Waits for the producer threads to end (the group is closed); the last one frees staging. */
  void join() throws InterruptedException {
    for (Thread t : threads) {
      t.join(TimeUnit.SECONDS.toMillis(40));
    }
  }
}
