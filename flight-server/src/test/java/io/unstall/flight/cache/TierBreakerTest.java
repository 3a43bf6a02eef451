package io.unstall.flight.cache;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.time.Duration;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.Test;

class TierBreakerTest {
  final AtomicLong clock = new AtomicLong();
  final Duration coolDown = Duration.ofSeconds(30);
  final TierBreaker breaker = new TierBreaker("disk tier /x", 3, coolDown, clock::get);
  final AtomicInteger tried = new AtomicInteger();

  private boolean fail() {
    return breaker.run(() -> "reading sample 1", () -> {
      tried.incrementAndGet();
      throw new IOException("Input/output error");
    });
  }

  private boolean succeed() {
    return breaker.run(() -> "reading sample 1", () -> {
      tried.incrementAndGet();
      return true;
    });
  }

  @Test
  void onlyConsecutiveErrorsOpenIt() {
    for (int i = 0; i < 10; i++) {
      assertFalse(fail());
      assertFalse(fail());
      assertTrue(succeed(), "a success resets the run of errors");
    }
    assertEquals(TierBreaker.State.CLOSED, breaker.state());
    assertEquals(20, breaker.errors());
  }

  @Test
  void openBypassesUntilTheCoolDownThenOneSuccessCloses() {
    fail();
    fail();
    fail();
    assertEquals(TierBreaker.State.OPEN, breaker.state());
    assertTrue(breaker.bypassing());
    int before = tried.get();
    assertFalse(succeed(), "bypassed: the operation is not run");
    assertEquals(before, tried.get());

    clock.addAndGet(coolDown.toNanos());
    assertFalse(breaker.bypassing());
    assertFalse(fail(), "half-open: tried, fails");
    assertEquals(TierBreaker.State.OPEN, breaker.state(), "one error re-opens it");
    assertEquals(4, breaker.errors());

    clock.addAndGet(coolDown.toNanos());
    assertFalse(breaker.run(() -> "admitting sample 1", () -> false), "no I/O done: neither success nor error");
    assertEquals(TierBreaker.State.HALF_OPEN, breaker.state());
    assertTrue(succeed());
    assertEquals(TierBreaker.State.CLOSED, breaker.state());
  }
}
