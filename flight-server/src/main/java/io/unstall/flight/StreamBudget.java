package io.unstall.flight;

import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import org.apache.arrow.flight.CallStatus;
import org.apache.arrow.memory.BufferAllocator;

/**
 * Back-pressure for batches in flight: a stream waits here until its batch fits in the streams' allocator
 * (bytes already allocated plus bytes other streams have reserved), so load makes clients wait instead of
 * making the sidecar exceed its memory budget.
 */
public final class StreamBudget {
  /** Offsets, validity bits, ids, labels and keys of a row, on top of its payload (a generous bound). */
  static final long ROW_OVERHEAD = 512;

  private final BufferAllocator allocator;
  private final long timeoutNanos;
  private long reserved; // guarded by this

  public StreamBudget(BufferAllocator allocator, long timeout, TimeUnit unit) {
    this.allocator = allocator;
    this.timeoutNanos = unit.toNanos(timeout);
  }

  public long limit() {
    return allocator.getLimit();
  }

  /** Bytes a batch may take in the allocator, allocation rounding included. */
  public long cost(long payloadBytes, int rows) {
    return allocator.getRoundingPolicy().getRoundedSize(Math.max(1, payloadBytes)) + rows * ROW_OVERHEAD;
  }

  /** A reservation to close once the batch's memory is released. */
  public interface Reservation extends AutoCloseable {
    @Override
    void close();
  }

  /**
   * Waits until {@code bytes} fit. Fails at once if they could never fit, and after the timeout if other
   * streams keep the budget full.
   */
  public Reservation acquire(long bytes) throws InterruptedException {
    return acquire(bytes, () -> false);
  }

  /** {@link #acquire(long)}, giving up (CANCELLED) as soon as {@code cancelled} says the client went away. */
  public Reservation acquire(long bytes, BooleanSupplier cancelled) throws InterruptedException {
    if (bytes > limit()) {
      throw new BudgetExceededException(
          "a batch needs " + bytes + " bytes but the sidecar's stream budget is " + limit()
              + " bytes; lower batch_size or raise --memory-budget");
    }
    long deadline = System.nanoTime() + timeoutNanos;
    synchronized (this) {
      boolean fits = MemoryWait.until(this, deadline,
          () -> reserved + allocator.getAllocatedMemory() + bytes <= limit(), () -> {
            if (cancelled.getAsBoolean()) {
              throw CallStatus.CANCELLED.withDescription("the client went away while its batch waited for memory")
                  .toRuntimeException();
            }
          });
      if (!fits) {
        throw new BudgetExceededException(
            "timed out after " + TimeUnit.NANOSECONDS.toSeconds(timeoutNanos) + " s waiting for " + bytes
                + " bytes of the sidecar's stream budget (" + limit() + " bytes) while other streams hold it"
                + " (--batch-timeout; --memory-budget sets the budget)");
      }
      reserved += bytes;
    }
    return () -> release(bytes);
  }

  /** Waits for room for a checked batch ({@link BatchAssembler#checkedIds}): {@link #cost} of its payload and rows. */
  public Reservation acquire(BatchAssembler.CheckedIds batch, BooleanSupplier cancelled) throws InterruptedException {
    return acquire(cost(batch.payloadBytes(), batch.ids().length), cancelled);
  }

  private synchronized void release(long bytes) {
    reserved -= bytes;
    notifyAll();
  }

  /** The batch does not fit in the stream budget. */
  public static final class BudgetExceededException extends RuntimeException {
    BudgetExceededException(String message) {
      super(message);
    }
  }
}
