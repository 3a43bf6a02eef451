package io.unstall.flight.prep;

import static org.awaitility.Awaitility.await;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.dataset.DatasetRegistry;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.flight.FlightStatusCode;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** What a group prepares next, within the window and staging memory, and its producer threads. */
class ProductionTest {
  static final long MS = 1_000_000L;

  @TempDir
  Path dir;
  DatasetRegistry registry;
  BufferAllocator root;
  GroupLock lock = new GroupLock();
  AtomicLong clock = new AtomicLong(); // moved by the source as it prepares
  AtomicInteger remote = new AtomicInteger(); // positions remote workers prepare
  PrepCounts counts = new PrepCounts(4);
  Membership members;
  Staging staging;
  StagingTest.FakeSource source;
  Production production;

  /** Ten samples in batches of two: five batches an epoch; staging of {@code limit} bytes, window 3. */
  @BeforeEach
  void start() throws Exception {
    Path c0 = Files.createDirectories(dir.resolve("imgs").resolve("c0"));
    for (int i = 0; i < 10; i++) {
      Files.write(c0.resolve("s" + i + ".jpg"), new byte[] {(byte) i});
    }
    registry = new DatasetRegistry();
    Dataset d = registry.register("imgs", "imagefolder", dir.resolve("imgs").toString());
    root = new RootAllocator(1 << 20);
    PrepGroup.Key key = new PrepGroup.Key("imgs", "fake", 7, 2, false, false);
    BatchOrder order = new BatchOrder("g", key, d);
    members = new Membership(order, StagingTest.settings(3, 0, false), lock, "");
    source = new StagingTest.FakeSource(1000, 500, false);
    staging = new Staging("g", "prep-group-g", root, new Staging.Size(4000, 3), null, lock);
    production = new Production(order, members, staging, source, counts, lock, remote::get, clock::get);
  }

  @AfterEach
  void stop() throws Exception {
    synchronized (lock) {
      members.close();
    }
    production.join();
    if (!production.runsThreads()) {
      staging.free();
    }
    root.close(); // throws if staging was not freed
    registry.close();
  }

  Membership.Member join() {
    synchronized (lock) {
      Membership.Member m = members.join(1, "a", 1, -1, -1, null);
      members.maybeStart(clock.get());
      return m;
    }
  }

  @Test
  void positionsInOrderWithinTheWindowGivenBackFirst() {
    Membership.Member m = join();
    synchronized (lock) {
      assertEquals(0, production.take());
      assertEquals(1, production.take());
      assertEquals(2, production.take());
      assertEquals(-1, production.take(), "the window is 3 ahead of the slowest member");
      production.giveBack(1);
      assertEquals(1, production.take(), "a position a worker gave back comes first");
      m.cursor = 2;
      production.giveBack(0); // every member is past it: never prepared again
      assertEquals(3, production.take());
      assertEquals(4, production.take());
      assertEquals(-1, production.take(), "one epoch has five batches: the member's end");
    }
  }

  @Test
  void theWindowCountsStepsOfTheWidestRankJob() {
    synchronized (lock) {
      // four ranks of one job, each at its first batch: rank r reads r, r + 4, ... of 20 positions (four epochs)
      Membership.Member[] ranks = new Membership.Member[4];
      for (int r = 0; r < 4; r++) {
        ranks[r] = members.join(r + 1, "rank" + r, 4, -1, -1, new RankShare.Spec(4, r, new long[0][], 0).of(5, -1));
      }
      members.maybeStart(clock.get());
      assertEquals(4, members.maxWorld());
      for (long p = 0; p < 12; p++) {
        assertEquals(p, production.take());
      }
      assertEquals(-1, production.take(), "window 3 steps of 4 ranks: 12 positions ahead of the slowest cursor;"
          + " 3 would leave rank 3 waiting for rank 0, which waits for it at the step's allreduce");
      ranks[0].cursor = ranks[0].next(1); // rank 0 read batch 0: its next is 4, the slowest cursor rank 1's
      assertEquals(12, production.take());
      assertEquals(-1, production.take());
    }
  }

  @Test
  void roomCountsBatchesInPreparationHereAndRemotely() {
    synchronized (lock) {
      assertTrue(production.roomFor(2, 0), "2 x (1000 + 500) of 4000");
      assertTrue(production.roomFor(2, 1), "and one batch of 1000 a worker makes");
      assertFalse(production.roomFor(2, 2));
      assertFalse(production.roomFor(3, 0));
    }
  }

  @Test
  void producersStageTheWindowTimedOnTheClock() {
    source.producers = 1; // one thread: nothing else reads the clock while a batch is made
    source.onPrepare = () -> clock.addAndGet(7 * MS);
    join();
    production.start();
    await().atMost(Duration.ofSeconds(30)).until(() -> {
      synchronized (lock) {
        return staging.has(0) && staging.has(1) && staging.has(2);
      }
    });
    synchronized (lock) {
      assertEquals(3, counts.batchesPrepared);
      assertEquals(21 * MS, counts.prepNanos, "three batches of 7 ms on the clock");
      assertEquals(3L, counts.preparedBy.get("local"));
      assertFalse(staging.has(3), "the window is full");
    }
  }

  @Test
  void aFailedBatchIsStagedAsItsFailure() {
    source.failAt = 1;
    join();
    production.start();
    await().atMost(Duration.ofSeconds(30)).until(() -> {
      synchronized (lock) {
        return staging.failure(1) != null && staging.has(0) && staging.has(2);
      }
    });
    synchronized (lock) {
      FlightRuntimeException f = staging.failure(1);
      assertNotNull(f);
      assertEquals(FlightStatusCode.INTERNAL, f.status().code());
      assertEquals("cannot read batch 1", f.getMessage());
    }
  }

  @Test
  void theLastProducerFreesStagingWhenTheGroupCloses() throws Exception {
    join();
    production.start();
    await().atMost(Duration.ofSeconds(30)).until(() -> {
      synchronized (lock) {
        return staging.has(2);
      }
    });
    synchronized (lock) {
      members.close();
    }
    production.join();
    assertEquals(0, root.getAllocatedMemory());
    assertTrue(root.getChildAllocators().isEmpty(), "staging's allocator is closed");
  }
}
