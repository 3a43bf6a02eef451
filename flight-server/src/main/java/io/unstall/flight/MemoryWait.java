package io.unstall.flight;

import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;

/**
 * The wait of a memory budget ({@link StreamBudget}, the prep decode budget): on the budget's monitor until the
 * memory can be taken or a deadline passes. Memory is also freed without notice (gRPC lets go of sent buffers),
 * so a waiter looks again every few milliseconds as well as when notified.
 */
public final class MemoryWait {
  private static final long POLL_MILLIS = 5;

  private MemoryWait() {}

  /**
   * Waits on {@code monitor}, which the caller holds, until {@code take} succeeds (true) or {@code deadlineNanos}
   * ({@link System#nanoTime}) passes (false). {@code beforeWait} runs before each wait; it may throw to give up.
   */
  public static boolean until(Object monitor, long deadlineNanos, BooleanSupplier take, Runnable beforeWait)
      throws InterruptedException {
    while (!take.getAsBoolean()) {
      long left = deadlineNanos - System.nanoTime();
      if (left <= 0) {
        return false;
      }
      beforeWait.run();
      monitor.wait(Math.max(1, Math.min(TimeUnit.NANOSECONDS.toMillis(left), POLL_MILLIS)));
    }
    return true;
  }
}
