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
    return stats(t, "autotune");
  }

  /** The autotuner's {@code part} of the group's stats: "autotune", or "hybrid" for a split. */
  JsonNode stats(Autotuner t, String part) {
    ObjectNode o = JsonNodeFactory.instance.objectNode();
    t.stats(o);
    return o.get(part);
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
    long samples; // prepared by the sidecar so far

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

    @Override
    public int batchSize() {
      return 64;
    }

    @Override
    public long cpuSamples() {
      return samples;
    }
  }

  /**
   * A period in which the sidecar prepared 4 batches of the split, at {@code a} seconds per sample: both producers
   * busy together for that long.
   */
  void splitPeriod(Autotuner t, SplitSource split, double a) {
    split.samples += 4L * split.rows;
    long busy = (long) (a * 1e9 * 4 * split.rows);
    counts.prepNanos += busy * Production.PRODUCERS;
    counts.producers(1, now);
    counts.producers(2, now);
    counts.producers(1, now + busy);
    counts.producers(0, now + busy);
    period(t, 4, 4, 0);
  }

  @Test
  void theSidecarsSecondsPerSampleCountTheTimeAnyProducerWasPreparing() {
    SplitSource split = new SplitSource();
    split.rows = 64;
    source = split;
    Autotuner t = tuner(false, false, 4);
    long ms = 1_000_000L;
    // one producer at a time: 4 batches of 64 samples, 40 ms each, idle between them (nobody waited)
    for (int i = 0; i < 4; i++) {
      counts.producers(1, now + i * 100 * ms);
      counts.producers(0, now + i * 100 * ms + 40 * ms);
    }
    counts.prepNanos += 4 * 40 * ms;
    split.samples += 4 * 64;
    period(t, 4, 4, 0);
    assertEquals(160e-3 / 256, stats(t, "hybrid").get("sidecar_s_per_sample").asDouble(), 1e-12,
        "160 ms busy for 256 samples, not half of it (the producers' summed wall over both)");
    // both at once, overlapping by half: batches [0, 100] and [50, 150] ms; a third starts at 400 ms, still
    // running at the tick (500 ms): its 100 ms so far count, its samples next period
    counts.producers(1, now);
    counts.producers(2, now + 50 * ms);
    counts.producers(1, now + 100 * ms);
    counts.producers(0, now + 150 * ms);
    counts.producers(1, now + 400 * ms);
    split.samples += 2 * 64;
    period(t, 2, 2, 0);
    assertEquals(250e-3 / 128, stats(t, "hybrid").get("sidecar_s_per_sample").asDouble(), 1e-12);
    counts.producers(0, now + 20 * ms); // the third batch ends 20 ms into the next period
    split.samples += 64;
    period(t, 1, 1, 0);
    assertEquals(20e-3 / 64, stats(t, "hybrid").get("sidecar_s_per_sample").asDouble(), 1e-12);
  }

  @Test
  void theSplitMovesTowardTheRatesTargetAQuarterBatchAPeriod() {
    SplitSource split = new SplitSource();
    source = split;
    Autotuner t = tuner(false, false, 4);
    t.report(1, 0.0005, 0.1, now); // device 0.5 ms a sample, step 100 ms
    t.report(2, 0.001, 0.2, now); // a slower device, a slower job: d from this one, S from the other
    splitPeriod(t, split, 0.001); // the sidecar: 1 ms a sample, 64 ms a batch: it keeps up with whole batches
    assertEquals(48, split.rows, "at most a quarter of the batch at once");
    JsonNode h = stats(t, "hybrid");
    assertEquals("rates", h.get("split_rule").asText());
    assertEquals(64, h.get("target_cpu_rows").asInt());
    assertEquals(0.001, h.get("device_s_per_sample").asDouble(), 1e-12);
    assertEquals(0.1, h.get("step_s").asDouble(), 1e-12);
    assertEquals(0.001, h.get("sidecar_s_per_sample").asDouble(), 1e-9);
    assertEquals(2, h.get("members_reporting").asInt());
    String why = stats(t).get("decisions").get(0).get("why").asText();
    assertTrue(why.contains("a=1.000 ms/sample") && why.contains("d=1.000 ms/sample (slowest of 2 reporting)")
        && why.contains("S=100.0 ms (fastest): target 64"), why);
    t.report(1, 0.0005, 0.1, now);
    t.report(2, 0.001, 0.2, now);
    splitPeriod(t, split, 0.001);
    assertEquals(64, split.rows);
    t.report(1, 0.0005, 0.1, now);
    splitPeriod(t, split, 0.0025); // the sidecar slowed down: it sustains 36 samples a step
    assertEquals(48, split.rows);
    t.report(1, 0.0005, 0.1, now);
    splitPeriod(t, split, 0.0025);
    assertEquals(36, split.rows);
    assertEquals(36, stats(t, "hybrid").get("target_cpu_rows").asInt());
    t.report(1, 0.0005, 0.1, now);
    splitPeriod(t, split, 0.0025); // at the target: nothing to decide
    assertEquals(4, stats(t).get("decisions").size());
  }

  @Test
  void withoutFreshReportsTheSplitFollowsTheWaits() {
    SplitSource split = new SplitSource();
    source = split;
    Autotuner t = tuner(false, false, 4);
    t.report(1, 0.0005, 0.1, now);
    splitPeriod(t, split, 0.001);
    assertEquals(48, split.rows);
    now += Autotuner.REPORT_TTL_NANOS; // the report ages past its time to live
    period(t, 4, 4, 3); // members waited
    assertEquals(44, split.rows, "a sixteenth of the batch, as without reports");
    JsonNode h = stats(t, "hybrid");
    assertEquals("waits", h.get("split_rule").asText());
    assertEquals(0, h.get("members_reporting").asInt());
    assertEquals(-1, h.get("target_cpu_rows").asInt());
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
