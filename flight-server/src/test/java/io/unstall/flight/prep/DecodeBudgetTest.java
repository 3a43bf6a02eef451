package io.unstall.flight.prep;

import static org.awaitility.Awaitility.await;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.unstall.flight.prep.ImageHeader.Format;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * Decode memory is reserved in the allocator tree: prep threads wait for it, never exceed it, and never wait while
 * they hold some (a nested reservation only tries).
 */
class DecodeBudgetTest {
  static final long MIB = 1 << 20;
  static final ImageHeader IMAGE = new ImageHeader(Format.JPEG, 1000, 1000, 3, false, false);

  BufferAllocator root;
  BufferAllocator streams;
  BufferAllocator decode;
  DecodeBudget budget;

  @BeforeEach
  void start() {
    root = new RootAllocator(64 * MIB);
    streams = root.newChildAllocator("streams", 0, 64 * MIB);
    decode = streams.newChildAllocator("decode", 0, 10 * MIB);
    budget = new DecodeBudget(decode, 2, TimeUnit.SECONDS);
  }

  @AfterEach
  void stop() {
    budget.close();
    decode.close(); // throws if a reservation was not given back
    streams.close();
    root.close();
  }

  @Test
  void fourThreadsDecodeOneAtATimeWhenOnlyOneFits() throws Exception {
    AtomicInteger holders = new AtomicInteger();
    AtomicInteger most = new AtomicInteger();
    Semaphore done = new Semaphore(0);
    ExecutorService pool = Executors.newFixedThreadPool(4);
    try {
      List<Future<?>> fs = new ArrayList<>();
      for (int t = 0; t < 4; t++) {
        fs.add(pool.submit(() -> {
          try (DecodeBudget.Reservation r = budget.acquire(6 * MIB, IMAGE)) {
            most.accumulateAndGet(holders.incrementAndGet(), Math::max);
            assertEquals(6 * MIB, streams.getAllocatedMemory(), "counted in the parent allocator too");
            done.acquire();
            holders.decrementAndGet();
          }
          return null;
        }));
      }
      await("three decodes waiting behind the first").atMost(Duration.ofSeconds(10))
          .until(() -> budget.waits() == 3 && holders.get() == 1);
      done.release(4);
      for (Future<?> f : fs) {
        f.get(10, TimeUnit.SECONDS);
      }
    } finally {
      pool.shutdownNow();
    }
    assertEquals(1, most.get(), "never two 6 MiB decodes in a 10 MiB budget");
    assertTrue(budget.peakBytes() <= 10 * MIB, "peak " + budget.peakBytes());
    assertEquals(0, budget.reservedBytes());
  }

  @Test
  void aDecodeThatCouldNeverFitIsRefusedAtOnce() {
    BadImageException e = assertThrows(BadImageException.class, () -> budget.acquire(11 * MIB, IMAGE));
    assertTrue(e.getMessage().contains("decoding the JPEG 1000x1000 image takes about 11534336 bytes of native"
        + " memory, more than the sidecar's decode memory of 10485760 bytes (--decode-memory)"), e.getMessage());
  }

  @Test
  void decodesWaitForBatchesInFlightInTheSameBudget() throws Exception {
    try (ArrowBuf batches = streams.buffer(60 * MIB)) { // the streams budget is nearly full
      DecodeBudget.ExhaustedException e = assertThrows(DecodeBudget.ExhaustedException.class,
          () -> budget.acquire(6 * MIB, IMAGE));
      assertTrue(e.getMessage().startsWith("timed out after 2 s waiting for 6291456 bytes of decode memory"),
          e.getMessage());
    }
    try (DecodeBudget.Reservation r = budget.acquire(6 * MIB, IMAGE)) {
      assertEquals(6 * MIB, root.getAllocatedMemory(), "exactly the bytes asked for, not rounded to a power of two");
    }
  }

  @Test
  void tryAcquireTakesOnlyWhatFitsNowAndNeverGoesAheadOfAWaiter() throws Exception {
    ExecutorService pool = Executors.newSingleThreadExecutor();
    try (DecodeBudget.Reservation held = budget.acquire(6 * MIB, IMAGE)) {
      assertNull(budget.tryAcquire(5 * MIB), "6 + 5 MiB do not fit in 10");
      try (DecodeBudget.Reservation more = budget.tryAcquire(4 * MIB)) {
        assertNotNull(more, "6 + 4 MiB fit, tried on a thread that holds a reservation");
        assertEquals(10 * MIB, budget.reservedBytes());
      }
      Future<?> waiter = pool.submit(() -> {
        try (DecodeBudget.Reservation r = budget.acquire(6 * MIB, IMAGE)) {
          return null;
        }
      });
      await("a decode waiting for 6 MiB").atMost(Duration.ofSeconds(10)).until(() -> budget.waits() == 1);
      assertNull(budget.tryAcquire(MIB), "1 MiB would fit, but a decode waits first");
      held.close();
      waiter.get(10, TimeUnit.SECONDS);
    } finally {
      pool.shutdownNow();
    }
    assertNull(budget.tryAcquire(11 * MIB), "more than the budget: no, and no refusal");
    assertEquals(0, budget.reservedBytes());
    assertTrue(budget.peakBytes() <= 10 * MIB, "peak " + budget.peakBytes());
  }

  @Test
  void anAcquireOnAThreadThatHoldsDecodeMemoryIsAProgrammingError() throws Exception {
    for (boolean tried : new boolean[] {false, true}) {
      try (DecodeBudget.Reservation r = tried ? budget.tryAcquire(MIB) : budget.acquire(MIB, IMAGE)) {
        IllegalStateException e = assertThrows(IllegalStateException.class, () -> budget.acquire(MIB, IMAGE));
        assertTrue(e.getMessage().startsWith("a thread that holds decode memory would wait for 1048576 bytes more"
            + " to decode the JPEG 1000x1000 image: hold-and-wait"), e.getMessage());
      }
      assertEquals(0, budget.reservedBytes());
      try (DecodeBudget.Reservation r = budget.acquire(MIB, IMAGE)) {
        assertEquals(MIB, budget.reservedBytes(), "once given back, the thread may wait again");
      }
    }
    assertEquals(0, budget.waits());
  }

  /**
   * Two threads each need a 3 MiB copy and a 6 MiB decode at once, in a 10 MiB budget. Held one after the other,
   * each thread held its copy and waited for a decode only the other's copy kept from fitting, until the timeout;
   * the nested wait is now refused at once, and the two as one reservation take turns.
   */
  @Test
  void twoThreadsThatNeedACopyAndADecodeTakeTurnsInsteadOfWaitingOutTheTimeout() throws Exception {
    CyclicBarrier bothHoldACopy = new CyclicBarrier(2);
    Semaphore oneWaits = new Semaphore(0);
    ExecutorService pool = Executors.newFixedThreadPool(2);
    try {
      List<Future<?>> nested = new ArrayList<>();
      for (int t = 0; t < 2; t++) {
        nested.add(pool.submit(() -> {
          try (DecodeBudget.Reservation copy = budget.acquire(3 * MIB, IMAGE)) {
            bothHoldACopy.await(10, TimeUnit.SECONDS);
            assertThrows(IllegalStateException.class, () -> budget.acquire(6 * MIB, IMAGE));
          }
          return null;
        }));
      }
      for (Future<?> f : nested) {
        f.get(10, TimeUnit.SECONDS);
      }
      assertEquals(0, budget.waits(), "the nested acquires never waited");
      List<Future<?>> together = new ArrayList<>();
      for (int t = 0; t < 2; t++) {
        together.add(pool.submit(() -> {
          try (DecodeBudget.Reservation copyAndDecode = budget.acquire(9 * MIB, IMAGE)) {
            oneWaits.acquire(); // the first holds its 9 MiB until the second waits
          }
          return null;
        }));
      }
      await("the second copy and decode waiting").atMost(Duration.ofSeconds(10)).until(() -> budget.waits() == 1);
      oneWaits.release(2);
      for (Future<?> f : together) {
        f.get(10, TimeUnit.SECONDS);
      }
    } finally {
      pool.shutdownNow();
    }
    assertEquals(1, budget.waits());
    assertEquals(9 * MIB, budget.peakBytes(), "one copy and decode at a time");
    assertEquals(0, budget.reservedBytes());
  }
}
