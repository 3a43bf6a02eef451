package io.unstall.flight.storage;

import io.unstall.flight.WaitTimeoutException;
import java.time.Duration;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;

/**
 * A token bucket on storage bytes, shared by every dataset of a sidecar: it stands in for a constrained link
 * to remote storage in benchmarks and experiments ({@code --storage-bandwidth}). Reads wait for their bytes;
 * at most 100 ms worth of burst accumulates, so short epochs see the stated bandwidth. A read that would wait
 * longer than {@code maxWait} ({@code --wait-timeout}) for its turn gives up at once instead, and its bytes go
 * back: under a backlog no request thread is held for longer than that.
 */
public final class Throttle {
  private final double bytesPerNano;
  private final double burst;
  private final long maxWaitNanos;
  private double tokens; // guarded by this
  private long last; // guarded by this
  private long requests; // guarded by this

  public Throttle(long bytesPerSecond) {
    this(bytesPerSecond, Duration.ofDays(1));
  }

  public Throttle(long bytesPerSecond, Duration maxWait) {
    if (bytesPerSecond <= 0) {
      throw new IllegalArgumentException("storage bandwidth must be > 0 bytes/s, got " + bytesPerSecond);
    }
    this.bytesPerNano = bytesPerSecond / 1e9;
    this.burst = bytesPerSecond / 10.0;
    this.last = System.nanoTime();
    this.maxWaitNanos = maxWait.toNanos();
  }

  /** Blocks until {@code bytes} may pass; a {@link WaitTimeoutException} if that would take longer than the bound. */
  public void acquire(long bytes) {
    long waitNanos;
    synchronized (this) {
      long now = System.nanoTime();
      tokens = Math.min(burst, tokens + (now - last) * bytesPerNano);
      last = now;
      tokens -= bytes; // may go negative: the debt is the wait
      requests++;
      waitNanos = tokens >= 0 ? 0 : (long) (-tokens / bytesPerNano);
      if (waitNanos > maxWaitNanos) {
        tokens += bytes;
        requests--;
        throw new WaitTimeoutException("a storage read of " + bytes + " bytes would wait "
            + TimeUnit.NANOSECONDS.toSeconds(waitNanos) + " s for storage bandwidth (--storage-bandwidth "
            + bytesPerSecond() + " bytes/s is booked that far ahead), more than --wait-timeout "
            + TimeUnit.NANOSECONDS.toSeconds(maxWaitNanos) + " s");
      }
    }
    long deadline = System.nanoTime() + waitNanos;
    while (waitNanos > 0) {
      LockSupport.parkNanos(waitNanos);
      waitNanos = deadline - System.nanoTime();
    }
  }

  /** Storage requests that passed so far (each ranged read is one). */
  public synchronized long requests() {
    return requests;
  }

  public long bytesPerSecond() {
    return (long) (bytesPerNano * TimeUnit.SECONDS.toNanos(1));
  }
}
