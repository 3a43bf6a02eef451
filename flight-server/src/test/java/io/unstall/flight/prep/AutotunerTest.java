package io.unstall.flight.prep;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** The autotuner's decisions, period by period, on a clock the test moves. */
class AutotunerTest {
  static final long PERIOD = Autotuner.PERIOD_NANOS;

  BufferAllocator root;
  GroupLock lock = new GroupLock();
  Staging staging;
  PrepCounts counts;
  StagingTest.FakeSource source;
  long now = 1_000_000_000L;
  boolean cpuFree = true;
  int world = 1; // the widest rank job's world size

  @BeforeEach
  void start() {
    root = new RootAllocator(1 << 20);
    source = new StagingTest.FakeSource(1000, 0, true);
    staging = new Staging("g", "prep-group-g", root, new Staging.Size(10_000, 2), null, lock);
    counts = new PrepCounts(4);
  }

  @AfterEach
  void stop() {
    staging.free();
    root.close();
  }

  Autotuner tuner(boolean window, boolean threads, int maxThreads) {
    return new Autotuner(window, threads, maxThreads, staging, source, counts, () -> world, now, () -> cpuFree);
  }

  /** One period ends: {@code prepared} and {@code served} batches in it, {@code stalls} member waits. */
  void period(Autotuner t, int prepared, int served, int stalls) {
    counts.batchesPrepared += prepared;
    counts.batchesServed += served;
    for (int i = 0; i < stalls; i++) {
      t.stalled();
    }
    now += PERIOD;
    synchronized (lock) {
      t.tick(now);
    }
  }

  JsonNode stats(Autotuner t) {
    ObjectNode o = JsonNodeFactory.instance.objectNode();
    t.stats(o);
    return o.get("autotune");
  }

  @Test
  void nothingIsDecidedBeforeAPeriodEnds() {
    Autotuner t = tuner(true, true, 4);
    t.stalled();
    synchronized (lock) {
      t.tick(now + PERIOD - 1);
    }
    assertEquals(0, stats(t).get("periods").asLong());
    assertEquals(2, staging.window());
  }

  @Test
  void windowGrowsWhenMembersStallAndShrinksAfterQuietPeriods() {
    Autotuner t = tuner(true, false, 4);
    period(t, 1, 1, 3);
    assertEquals(3, staging.window(), "members waited and staging has room");
    assertEquals(3, t.maxWindowUsed());
    for (int i = 0; i < Autotuner.QUIET_PERIODS; i++) {
      period(t, 1, 1, 0);
    }
    assertEquals(2, staging.window(), "no member waited for " + Autotuner.QUIET_PERIODS + " periods");
    assertEquals(3, t.maxWindowUsed(), "the largest window used is remembered");
    JsonNode d = stats(t).get("decisions");
    assertEquals(2, d.size());
    assertEquals("window", d.get(0).get("what").asText());
    assertEquals(2, d.get(0).get("from").asInt());
    assertEquals(3, d.get(0).get("to").asInt());
  }

  @Test
  void windowStaysWithinStaging() {
    Autotuner t = tuner(true, false, 4);
    for (int i = 0; i < 20; i++) {
      period(t, 1, 1, 1);
    }
    assertEquals(staging.maxWindow(source, 1), staging.window());
    assertEquals(10, staging.window(), "10,000 bytes of staging hold 10 batches of 1,000");
  }

  @Test
  void aWindowStepOfRanksIsABatchPerRank() {
    world = 4; // a job of 4 data-parallel ranks: a step of the window is 4 batches
    Autotuner t = tuner(true, false, 4);
    for (int i = 0; i < 20; i++) {
      period(t, 1, 1, 1);
    }
    assertEquals(2, staging.window(), "10,000 bytes of staging hold 2 steps of 4 batches of 1,000");
    ObjectNode o = JsonNodeFactory.instance.objectNode();
    t.stats(o);
    assertEquals(2, o.path("autotune").path("max_window").asInt());
  }

  @Test
  void idlePeriodsDecideNothing() {
    Autotuner t = tuner(true, true, 4);
    for (int i = 0; i < 10; i++) {
      period(t, 0, 0, 0);
    }
    assertEquals(0, stats(t).get("periods").asLong());
    assertEquals(2, staging.window());
  }

  @Test
  void anExtraThreadIsKeptOnlyIfProductionImproves() {
    Autotuner t = tuner(false, true, 4);
    // Start at the pool's size; production outpaces consumption: one thread is given back.
    period(t, 20, 4, 0);
    assertEquals(3, source.parallelism, "production 40/s outpaces consumption 8/s");
    for (int i = 0; i < Autotuner.QUIET_PERIODS; i++) {
      period(t, 4, 4, 0); // the hold after a decision, then balance
    }
    // Members stall with CPU free: a trial of one more thread, which does not improve production: undone.
    period(t, 4, 4, 2);
    assertEquals(4, source.parallelism);
    period(t, 4, 4, 2);
    assertEquals(3, source.parallelism, "8/s did not improve on 8/s");
    for (int i = 0; i < Autotuner.QUIET_PERIODS; i++) {
      period(t, 4, 4, 0);
    }
    // Another trial that does improve production by more than GAIN: kept.
    period(t, 4, 4, 2);
    assertEquals(4, source.parallelism);
    period(t, 6, 4, 2);
    assertEquals(4, source.parallelism, "12/s improved on 8/s");
    assertEquals(4, stats(t).get("decisions_total").asLong());
  }

  @Test
  void noTrialWhenTheCpuIsBusy() {
    Autotuner t = tuner(false, true, 4);
    period(t, 20, 4, 0);
    assertEquals(3, source.parallelism);
    for (int i = 0; i < Autotuner.QUIET_PERIODS; i++) {
      period(t, 4, 4, 0);
    }
    cpuFree = false;
    period(t, 4, 4, 2);
    assertEquals(3, source.parallelism, "no thread is added on a saturated machine");
  }

  @Test
  void threadsOfASourceWithoutParallelismAreNotTuned() {
    source = new StagingTest.FakeSource(1000, 0, false);
    Autotuner t = tuner(false, true, 4);
    period(t, 20, 4, 0);
    assertTrue(!stats(t).get("threads_tuned").asBoolean());
    assertEquals(0, source.parallelism, "never set");
  }

  /** A hybrid source's split: {@code rows} of a batch of 64 prepared by the sidecar, tuned in steps of 4. */
  static final class SplitSource extends StagingTest.FakeSource {
    int rows = 32;

    SplitSource() {
      super(1000, 0, true);
    }

    @Override
    public boolean tunesSplit() {
      return true;
    }

    @Override
    public int cpuRows() {
      return rows;
    }

    @Override
    public int cpuRows(int n) {
      rows = Math.max(0, Math.min(64, n));
      return rows;
    }

    @Override
    public int splitStep() {
      return 4;
    }
  }

  @Test
  void theSplitGivesTheDeviceMoreWhenMembersWaitAndTheSidecarMoreWhenItIdles() {
    SplitSource split = new SplitSource();
    source = split;
    Autotuner t = tuner(false, false, 4);
    period(t, 4, 4, 2); // members waited: the sidecar is behind
    assertEquals(28, split.rows);
    counts.prepNanos += PERIOD / 10; // producers busy 5% of the next period, nobody waited
    period(t, 4, 4, 0);
    assertEquals(32, split.rows);
    counts.prepNanos += 2 * PERIOD; // both producers busy the whole period: no more for the sidecar
    period(t, 4, 4, 0);
    assertEquals(32, split.rows);
    JsonNode d = stats(t).get("decisions");
    assertEquals(2, d.size());
    assertEquals("cpu_rows", d.get(0).get("what").asText());
    assertTrue(d.get(0).get("why").asText().contains("members waited 2 times"), d.toString());
    assertTrue(d.get(1).get("why").asText().contains("busy 5%"), d.toString());
    split.rows = 64;
    counts.prepNanos += PERIOD / 10;
    period(t, 4, 4, 0); // already all of each batch: nothing to decide
    assertEquals(2, stats(t).get("decisions").size());
  }
}
