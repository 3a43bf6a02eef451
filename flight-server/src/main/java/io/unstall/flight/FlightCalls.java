package io.unstall.flight;

import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.Semaphore;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.LongAdder;
import org.apache.arrow.flight.CallStatus;
import org.apache.arrow.flight.FlightRuntimeException;

/**
 * The Flight server's threads, bounded. gRPC runs every call and every callback of a call (its start, its
 * messages, its cancellation) on this executor: a fixed pool of {@code --flight-threads} threads behind a queue
 * of {@code --flight-queue} tasks. Flight's default, an unbounded cached pool, grows a thread per call that
 * blocks, and our calls block: on the stream budget, on storage, on a prep batch.
 *
 * <p>Admission control keeps the pool live. A call that may wait first takes one of {@link Bounds#waitingCalls()}
 * permits, or is refused at once with RESOURCE_EXHAUSTED naming the option: waiting for a permit would hold a
 * thread, which is what the bound is for. The other threads are never held by a waiting call, so quick calls
 * (stats, heartbeats), refusals and cancellations always find one, and a client that goes away is noticed.
 *
 * <p>A task the full queue cannot take runs at once on the thread that submitted it (a gRPC transport thread),
 * where every call that would wait is refused: so a rejection reaches the client as RESOURCE_EXHAUSTED through
 * the call's own status, never as a reset stream, and a transport thread never blocks.
 */
public final class FlightCalls implements AutoCloseable {
  /** Set while a rejected task runs on its submitter's thread: nothing there may wait. */
  private static final ThreadLocal<Boolean> OVERFLOW = ThreadLocal.withInitial(() -> false);

  private final int threads;
  private final int queue;
  private final int permits;
  private final ThreadPoolExecutor executor;
  private final Semaphore waiting;
  private final LongAdder refused = new LongAdder();

  public FlightCalls(Bounds bounds) {
    this.threads = bounds.flightThreads();
    this.queue = bounds.flightQueue();
    this.permits = bounds.waitingCalls();
    this.waiting = new Semaphore(permits);
    AtomicInteger n = new AtomicInteger();
    this.executor = new ThreadPoolExecutor(threads, threads, 60, TimeUnit.SECONDS, new ArrayBlockingQueue<>(queue),
        r -> new PoolThread(this, r, "unstall-flight-" + n.incrementAndGet()),
        (r, pool) -> {
          if (pool.isShutdown()) {
            throw new RejectedExecutionException("the sidecar's Flight server is stopping");
          }
          boolean outer = !OVERFLOW.get();
          OVERFLOW.set(true);
          try {
            r.run();
          } finally {
            if (outer) {
              OVERFLOW.set(false);
            }
          }
        });
    executor.allowCoreThreadTimeOut(true);
  }

  private static final class PoolThread extends Thread {
    final FlightCalls owner;

    PoolThread(FlightCalls owner, Runnable r, String name) {
      super(r, name);
      this.owner = owner;
      setDaemon(true);
    }
  }

  /** The executor to give {@code FlightServer.Builder.executor}; closed here, not by Flight. */
  public ExecutorService executor() {
    return executor;
  }

  /** A held permit of a call that may wait; close it when the call ends (idempotent). */
  public interface Permit extends AutoCloseable {
    @Override
    void close();
  }

  /**
   * Admits a call that may wait ({@code what} names it in the refusal), or throws RESOURCE_EXHAUSTED at once.
   */
  public Permit admit(String what) {
    boolean onPool = Thread.currentThread() instanceof PoolThread t && t.owner == this && !OVERFLOW.get();
    if (!onPool) {
      refused.increment();
      throw CallStatus.RESOURCE_EXHAUSTED.withDescription(what + " refused: the sidecar's Flight executor is full ("
          + threads + " threads busy and " + queue + " tasks queued); retry later, or raise --flight-threads or"
          + " --flight-queue").toRuntimeException();
    }
    if (!waiting.tryAcquire()) {
      refused.increment();
      throw refusal(what);
    }
    AtomicBoolean closed = new AtomicBoolean();
    return () -> {
      if (closed.compareAndSet(false, true)) {
        waiting.release();
      }
    };
  }

  private FlightRuntimeException refusal(String what) {
    return CallStatus.RESOURCE_EXHAUSTED.withDescription(what + " refused: the sidecar already runs " + permits
        + " Flight calls that wait (fetches, prep reads and claims, uploads, plans); retry later, or raise"
        + " --flight-threads (" + threads + "; a quarter of them only serve calls that never wait)")
        .toRuntimeException();
  }

  /** Calls that hold a permit now. */
  public int waiting() {
    return permits - waiting.availablePermits();
  }

  public int permits() {
    return permits;
  }

  /** Calls refused so far. */
  public long refused() {
    return refused.sum();
  }

  /** Stops the threads (after the Flight server has stopped). */
  @Override
  public void close() throws InterruptedException {
    executor.shutdown();
    if (!executor.awaitTermination(10, TimeUnit.SECONDS)) {
      executor.shutdownNow();
    }
  }
}
