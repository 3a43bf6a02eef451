package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.lang.management.ManagementFactory;
import java.util.ArrayDeque;
import java.util.HashMap;
import java.util.Map;
import java.util.function.BooleanSupplier;
import java.util.function.IntSupplier;

/**
 * Online tuning of one group, in the spirit of tf.data's AUTOTUNE, from what the group measures each period: the
 * production rate (batches staged per second), the consumption rate (batches members read per second), member
 * stalls (a member asked for a batch not staged yet) and each batch's CPU and wall time.
 * <ul>
 *   <li>Window: grows by one when members stalled and staging has room for one more step (a batch, or one per
 *       rank of the widest data-parallel job: {@link Membership#aheadEnd}; within the group's staging limit and the
 *       sidecar's prep budget); shrinks by one after {@link #QUIET_PERIODS} periods in which
 *       no member waited.
 *   <li>Threads (sidecar prep: decode chunks of a batch in flight on the prep pool): when members stall and the
 *       machine's CPU is not saturated, tries one more and keeps it only if production improved by
 *       {@link #GAIN}; gives one back when production outpaces consumption by {@link #SLACK} with nobody waiting.
 *       Never more than the pool's {@code --prep-threads}.
 *   <li>Split (a hybrid source with {@code cpu_load="auto"}): from the members' reports of their device's decode
 *       seconds per sample and their training step ({@link #report}) and the sidecar's own seconds per sample
 *       (the time any of its producers was preparing, over the samples they prepared),
 *       toward {@link SplitModel}'s target, at most a quarter of a batch a period; without fresh reports, by who
 *       waited (fewer samples for the sidecar when members waited, more when its producers idle).
 * </ul>
 * Either is pinned by the joiner ({@code window=}, or {@code autotune=false} for both). Guarded by the group lock;
 * the threads it picks reach the source's {@link BatchSource#parallelism} for the next batch.
 */
final class Autotuner {
  static final long PERIOD_NANOS = 500_000_000L;
  static final int QUIET_PERIODS = 4;
  static final double GAIN = 1.05;
  static final double SLACK = 1.5;
  static final double SPLIT_BUSY = 0.6;
  /** A member's report counts this long, or four of its steps when longer (a report comes with each batch). */
  static final long REPORT_TTL_NANOS = 4 * PERIOD_NANOS;
  private static final int DECISIONS = 16;

  private final boolean tuneWindow;
  private final boolean tuneThreads;
  private final int maxThreads;
  private final Staging staging;
  private final BatchSource source;
  private final PrepCounts counts;
  private final IntSupplier world; // the widest rank job's world size: a window step is that many batches
  private int threads;
  private int maxWindowUsed;
  private final BooleanSupplier cpuAvailable;
  private long periodStart;
  private long preparedAt;
  private long servedAt;
  private long cpuAt;
  private long wallAt;
  private long stalls;
  private long stallsTotal;
  private volatile long lastStalls; // in the last period
  private long periods;
  private int quiet;
  private int hold;
  private int trialFrom = -1; // threads before a trial of one more; -1: no trial running
  private double trialBase;
  private double productionRate;
  private double consumptionRate;
  private double cpuPerBatch;
  private double wallPerBatch;
  private long cpuSamplesAt;
  private long busyAt;
  private double sidecarPerSample; // a: the sidecar's seconds per sample it prepares, the last measured
  private final Map<Long, Report> reports = new HashMap<>(); // member -> its latest rates
  private double devicePerSample; // d, S and the target of the last period with fresh reports
  private double step;
  private int reporting;
  private int splitTarget = -1;
  private final ArrayDeque<ObjectNode> decisions = new ArrayDeque<>();
  private long decisionsTotal;

  /** {@code world}: the largest world size among the group's rank members ({@link Membership#maxWorld}). */
  Autotuner(boolean tuneWindow, boolean tuneThreads, int maxThreads, Staging staging, BatchSource source,
      PrepCounts counts, IntSupplier world) {
    this(tuneWindow, tuneThreads, maxThreads, staging, source, counts, world, System.nanoTime(),
        Autotuner::cpuAvailable);
  }

  /**
   * {@code start}: when the first period starts ({@link System#nanoTime} of the reaper's ticks); {@code
   * cpuAvailable}: whether the machine's CPU has room for one more thread.
   */
  Autotuner(boolean tuneWindow, boolean tuneThreads, int maxThreads, Staging staging, BatchSource source,
      PrepCounts counts, IntSupplier world, long start, BooleanSupplier cpuAvailable) {
    this.world = world;
    this.tuneWindow = tuneWindow;
    this.tuneThreads = tuneThreads && source.parallel();
    this.periodStart = start;
    this.cpuAvailable = cpuAvailable;
    this.maxThreads = Math.max(1, maxThreads);
    this.threads = this.maxThreads; // today's parallelism first: tuning gives back what does not help
    this.staging = staging;
    this.source = source;
    this.counts = counts;
    this.maxWindowUsed = staging.window();
  }

  /**
   * Batches per second the members can read, as far as measured: the last period's rate when nobody waited for a
   * batch; 0 (unknown) when someone did, since then the rate was prep's, not theirs.
   */
  double consumerCapacity() {
    return lastStalls > 0 ? 0 : consumptionRate;
  }

  /** The largest window used so far: no more batches were ever staged ahead. Caller holds the lock. */
  int maxWindowUsed() {
    return maxWindowUsed;
  }

  /** A member's rates, as it reported them with a batch request. */
  private record Report(double decodePerSample, double step, long at) {}

  /**
   * Member {@code member}'s device decode seconds per sample and training step seconds (its moving averages),
   * reported at {@code now}. Caller holds the lock.
   */
  void report(long member, double decodePerSample, double stepSeconds, long now) {
    reports.put(member, new Report(decodePerSample, stepSeconds, now));
  }

  /** A member asked for a batch that was not staged yet. Caller holds the lock. */
  void stalled() {
    stalls++;
    stallsTotal++;
  }

  /** Measures the period that ended and decides; called on the reaper's tick. Caller holds the lock. */
  void tick(long now) {
    long dt = now - periodStart;
    if (dt < PERIOD_NANOS) {
      return;
    }
    long prepared = counts.batchesPrepared - preparedAt;
    long served = counts.batchesServed - servedAt;
    double secs = dt / 1e9;
    productionRate = prepared / secs;
    consumptionRate = served / secs;
    if (prepared > 0) {
      cpuPerBatch = (counts.prepCpuNanos.get() - cpuAt) / 1e9 / prepared;
      wallPerBatch = (counts.prepNanos - wallAt) / 1e9 / prepared;
    }
    long cpuSamples = source.cpuSamples() - cpuSamplesAt;
    long busy = counts.busyNanos(now);
    if (cpuSamples > 0) { // the time the producers were preparing (any of them), spread over the samples they prepared
      sidecarPerSample = (busy - busyAt) / 1e9 / cpuSamples;
    }
    boolean active = prepared > 0 || served > 0 || stalls > 0;
    if (active) {
      periods++;
      if (tuneWindow) {
        tuneWindow();
      }
      if (tuneThreads) {
        tuneThreads();
      }
      if (source.tunesSplit()) {
        tuneSplit(dt, now);
      }
    }
    periodStart = now;
    preparedAt = counts.batchesPrepared;
    servedAt = counts.batchesServed;
    cpuAt = counts.prepCpuNanos.get();
    wallAt = counts.prepNanos;
    cpuSamplesAt = source.cpuSamples();
    busyAt = busy;
    lastStalls = stalls;
    stalls = 0;
  }

  private void tuneWindow() {
    int w = staging.window();
    if (stalls > 0) {
      quiet = 0;
      if (staging.roomForWindow(w + 1, source, world.getAsInt())) {
        staging.window(w + 1);
        maxWindowUsed = Math.max(maxWindowUsed, w + 1);
        decide("window", w, w + 1, "members waited " + stalls + " times for batches; staging has room");
      }
    } else if (++quiet >= QUIET_PERIODS) {
      quiet = 0;
      if (w > 1) {
        staging.window(w - 1);
        decide("window", w, w - 1, "no member waited for a batch in " + QUIET_PERIODS + " periods");
      }
    }
  }

  private void tuneThreads() {
    int t = threads;
    if (trialFrom >= 0) {
      if (productionRate < trialBase * GAIN) {
        threads = trialFrom;
        source.parallelism(threads);
        decide("threads", t, trialFrom, String.format("production %.2f/s did not improve on %.2f/s", productionRate,
            trialBase));
      }
      trialFrom = -1;
      hold = QUIET_PERIODS;
    } else if (hold > 0) {
      hold--;
    } else if (stalls > 0 && t < maxThreads && cpuAvailable.getAsBoolean()) {
      trialFrom = t;
      trialBase = productionRate;
      threads = t + 1;
      source.parallelism(threads);
      decide("threads", t, t + 1, "members waited " + stalls + " times and CPU is available");
    } else if (stalls == 0 && t > 1 && productionRate > SLACK * consumptionRate && consumptionRate > 0) {
      threads = t - 1;
      source.parallelism(threads);
      hold = QUIET_PERIODS;
      decide("threads", t, t - 1, String.format("production %.2f/s outpaces consumption %.2f/s", productionRate,
          consumptionRate));
    }
  }

  /**
   * A hybrid source's split: toward {@link SplitModel}'s target from the fresh reports (the slowest device, the
   * fastest step) and the sidecar's measured seconds per sample, at most a quarter of a batch at once; a target
   * within a tuning step of the split is left alone (noise). Without fresh reports, {@link #tuneSplitByWaits}.
   */
  private void tuneSplit(long dt, long now) {
    reports.values().removeIf(r -> now - r.at > Math.max(REPORT_TTL_NANOS, (long) (4e9 * r.step)));
    reporting = reports.size();
    if (reports.isEmpty() || !(sidecarPerSample > 0)) {
      splitTarget = -1;
      tuneSplitByWaits(dt);
      return;
    }
    devicePerSample = reports.values().stream().mapToDouble(Report::decodePerSample).max().orElseThrow();
    step = reports.values().stream().mapToDouble(Report::step).min().orElseThrow();
    int b = source.batchSize();
    SplitModel.Split target = SplitModel.target(b, sidecarPerSample, devicePerSample, step);
    splitTarget = target.cpuRows();
    int rows = source.cpuRows();
    int move = splitTarget - rows;
    if (Math.abs(move) < source.splitStep() && splitTarget != 0 && splitTarget != b) {
      return;
    }
    int bound = Math.max(1, b / 4);
    int to = source.cpuRows(rows + Math.max(-bound, Math.min(bound, move)));
    if (to != rows) {
      decide("cpu_rows", rows, to, String.format("rates: sidecar a=%.3f ms/sample, device d=%.3f ms/sample (slowest"
          + " of %d reporting), step S=%.1f ms (fastest): target %d, %s", 1e3 * sidecarPerSample, 1e3 * devicePerSample,
          reporting, 1e3 * step, splitTarget, target.why()));
    }
  }

  /**
   * The split without reports: members that waited for batches get fewer samples prepared by the sidecar (their
   * device decodes more); producers busy less than {@link #SPLIT_BUSY} of the period with nobody waiting get more
   * (the CPU takes work off the device). Steps of a sixteenth of a batch.
   */
  private void tuneSplitByWaits(long dt) {
    int rows = source.cpuRows();
    int step = source.splitStep();
    double busy = (counts.prepNanos - wallAt) / (double) dt / Production.PRODUCERS;
    if (stalls > 0 && rows > 0) {
      source.cpuRows(rows - step);
      decide("cpu_rows", rows, source.cpuRows(), "members waited " + stalls + " times for batches: their device"
          + " decodes more of each");
    } else if (stalls == 0 && busy < SPLIT_BUSY && consumptionRate > 0) {
      if (source.cpuRows(rows + step) == rows) {
        return; // the sidecar already prepares whole batches
      }
      decide("cpu_rows", rows, source.cpuRows(), String.format("nobody waited and the producers were busy %.0f%% of"
          + " the period: the sidecar prepares more of each batch", 100 * busy));
    }
  }

  /** The machine's CPU is not saturated (other groups and processes included). */
  private static boolean cpuAvailable() {
    if (ManagementFactory.getOperatingSystemMXBean() instanceof com.sun.management.OperatingSystemMXBean os) {
      double load = os.getCpuLoad();
      return load >= 0 && load < 0.9;
    }
    return true;
  }

  private void decide(String what, int from, int to, String why) {
    decisionsTotal++;
    decisions.addLast(JsonNodeFactory.instance.objectNode().put("period", periods).put("what", what)
        .put("from", from).put("to", to).put("why", why));
    if (decisions.size() > DECISIONS) {
      decisions.removeFirst();
    }
  }

  /** Caller holds the lock. */
  void stats(ObjectNode o) {
    ObjectNode a = o.putObject("autotune");
    a.put("window_tuned", tuneWindow);
    a.put("threads_tuned", tuneThreads);
    a.put("threads", threads);
    a.put("max_threads", maxThreads);
    a.put("window", staging.window());
    a.put("max_window", staging.maxWindow(source, world.getAsInt()));
    a.put("periods", periods);
    a.put("production_rate", productionRate);
    a.put("consumption_rate", consumptionRate);
    a.put("stalls", stallsTotal);
    a.put("cpu_seconds_per_batch", cpuPerBatch);
    a.put("wall_seconds_per_batch", wallPerBatch);
    a.put("decisions_total", decisionsTotal);
    ArrayNode d = a.putArray("decisions");
    decisions.forEach(d::add);
    if (source.tunesSplit()) { // beside the source's own fields of the split
      ObjectNode h = o.get("hybrid") instanceof ObjectNode x ? x : o.putObject("hybrid");
      h.put("split_rule", splitTarget >= 0 ? "rates" : "waits");
      h.put("sidecar_s_per_sample", sidecarPerSample);
      h.put("device_s_per_sample", devicePerSample);
      h.put("step_s", step);
      h.put("members_reporting", reporting);
      h.put("target_cpu_rows", splitTarget);
    }
  }
}
