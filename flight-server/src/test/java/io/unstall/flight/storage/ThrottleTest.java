package io.unstall.flight.storage;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.unstall.flight.WaitTimeoutException;
import java.time.Duration;
import org.junit.jupiter.api.Test;

/** The storage throttle never holds a request thread for longer than its bound. */
class ThrottleTest {
  @Test
  void aReadThatWouldWaitPastTheBoundFailsAtOnceAndGivesItsBytesBack() {
    Throttle t = new Throttle(1000, Duration.ofSeconds(1));
    WaitTimeoutException e = assertThrows(WaitTimeoutException.class, () -> t.acquire(100_000));
    assertTrue(e.getMessage().contains("--storage-bandwidth 1000 bytes/s")
        && e.getMessage().contains("--wait-timeout 1 s"), e.getMessage());
    assertEquals(0, t.requests());
    t.acquire(10); // the refused read booked nothing: a small one passes within its bound
    assertEquals(1, t.requests());
  }
}
