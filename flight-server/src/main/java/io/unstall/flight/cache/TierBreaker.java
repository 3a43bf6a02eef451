package io.unstall.flight.cache;

import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.time.Duration;
import java.util.Locale;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.LongSupplier;
import java.util.function.Supplier;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A circuit breaker in front of one cache tier (the disk tier, the memory cache's admission). A tier error
 * (disk full, EIO, an allocation that fails) never fails a batch: the operation reports "not done" and the
 * caller reads the sample from storage. After {@code threshold} consecutive errors the breaker opens and the
 * tier is bypassed for {@code coolDown}; then it is half-open: operations are tried again, the first success
 * closes it and the first error opens it for another cool-down. The first error of a run is logged with what
 * failed (the tier names its directory, the caller the sample), then only the transitions.
 */
public final class TierBreaker {
  private static final Logger LOG = LoggerFactory.getLogger(TierBreaker.class);
  /** Consecutive errors that open a breaker. */
  public static final int THRESHOLD = 5;
  /** How long an open breaker bypasses its tier before it tries it again. */
  public static final Duration COOL_DOWN = Duration.ofSeconds(30);

  public enum State {
    CLOSED,
    OPEN,
    HALF_OPEN;

    /** The name in stats JSON: {@code closed}, {@code open}, {@code half_open}. */
    public String wireName() {
      return name().toLowerCase(Locale.ROOT);
    }
  }

  /** One operation on the tier; true when it did its I/O (a hit read, an entry written). */
  @FunctionalInterface
  public interface Op {
    boolean run() throws IOException;
  }

  private final String tier;
  private final int threshold;
  private final long coolDownNanos;
  private final LongSupplier clock;
  private final AtomicLong errors = new AtomicLong();
  private final AtomicLong bypassed = new AtomicLong();
  // Written under this; read without it on the fast paths (a closed breaker with no errors takes no lock).
  private volatile State state = State.CLOSED;
  private volatile int consecutive;
  private long openedAt; // guarded by this

  /** A breaker with the default threshold and cool-down; {@code tier} names it in logs ("disk tier /dir"). */
  public TierBreaker(String tier) {
    this(tier, THRESHOLD, COOL_DOWN, System::nanoTime);
  }

  /** {@code clock} gives nanoseconds, like {@link System#nanoTime}. */
  public TierBreaker(String tier, int threshold, Duration coolDown, LongSupplier clock) {
    if (threshold < 1) {
      throw new IllegalArgumentException("a tier breaker's threshold must be >= 1, got " + threshold);
    }
    this.tier = tier;
    this.threshold = threshold;
    this.coolDownNanos = coolDown.toNanos();
    this.clock = clock;
  }

  /**
   * Runs {@code op} unless the tier is bypassed; an error is counted, logged as described above (naming
   * {@code what}, e.g. "reading dataset 'imgs' sample 3") and reported as false, for the caller to fall back
   * to storage. Direct memory exhausted ({@link OutOfMemoryError}) is a tier error too.
   */
  public boolean run(Supplier<String> what, Op op) {
    if (!allow()) {
      return false;
    }
    try {
      boolean done = op.run();
      if (done) {
        succeeded();
      }
      return done;
    } catch (IOException | RuntimeException | OutOfMemoryError e) {
      failed(what.get(), e);
      return false;
    }
  }

  /** Whether the tier is bypassed right now (open, within its cool-down). */
  public boolean bypassing() {
    if (state != State.OPEN) {
      return false;
    }
    synchronized (this) {
      return state == State.OPEN && clock.getAsLong() - openedAt < coolDownNanos;
    }
  }

  private boolean allow() {
    return state == State.CLOSED || allowSlow();
  }

  private synchronized boolean allowSlow() {
    if (state == State.OPEN) {
      if (clock.getAsLong() - openedAt < coolDownNanos) {
        bypassed.incrementAndGet();
        return false;
      }
      state = State.HALF_OPEN;
      LOG.info("{}: trying it again after a cool-down of {} s", tier, coolDownNanos / 1_000_000_000L);
    }
    return true;
  }

  private void succeeded() {
    if (state == State.CLOSED && consecutive == 0) {
      return;
    }
    succeededSlow();
  }

  private synchronized void succeededSlow() {
    consecutive = 0;
    if (state == State.HALF_OPEN) {
      state = State.CLOSED;
      LOG.info("{}: recovered; serving from it again", tier);
    }
  }

  private synchronized void failed(String what, Throwable e) {
    errors.incrementAndGet();
    if (state == State.HALF_OPEN) {
      open();
      LOG.warn("{}: still failing ({}: {}); bypassed for another {} s, samples are read from storage", tier, what,
          e.toString(), coolDownNanos / 1_000_000_000L);
      return;
    }
    if (state == State.OPEN) {
      return; // an operation allowed before the breaker opened
    }
    if (consecutive++ == 0) {
      LOG.warn("{}: error {}: {}; reading it from storage", tier, what, e.toString());
    }
    if (consecutive >= threshold) {
      LOG.warn("{}: {} consecutive errors (the last {}: {}); bypassed for {} s, samples are read from storage",
          tier, consecutive, what, e.toString(), coolDownNanos / 1_000_000_000L);
      open();
    }
  }

  private void open() {
    state = State.OPEN;
    openedAt = clock.getAsLong();
    consecutive = 0;
  }

  public State state() {
    return state;
  }

  /** Tier errors so far. */
  public long errors() {
    return errors.get();
  }

  /** Operations skipped because the breaker was open. */
  public long bypassed() {
    return bypassed.get();
  }

  /** Adds {@code "breaker":{"state","errors","bypassed"}} to a tier's stats object. */
  public void toJson(ObjectNode tierStats) {
    ObjectNode b = tierStats.putObject("breaker");
    b.put("state", state().wireName());
    b.put("errors", errors());
    b.put("bypassed", bypassed());
  }
}
