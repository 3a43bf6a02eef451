package io.unstall.agent.bench;

import java.io.File;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import org.openjdk.jmh.results.RunResult;
import org.openjdk.jmh.runner.Runner;
import org.openjdk.jmh.runner.options.ChainedOptionsBuilder;
import org.openjdk.jmh.runner.options.OptionsBuilder;
import org.openjdk.jmh.runner.options.TimeValue;
import org.openjdk.jmh.runner.options.VerboseMode;

/**
 * Runs {@link ReadBenchmark} without and with the agent in <b>interleaved forks</b>: for each
 * round, every benchmark runs one fork without and one fork with the agent, back to back, the
 * order alternating between rounds, so that drift in the machine's load hits both sides alike.
 * Each fork's score is the mean of its measurement iterations; the table gives, per side, the mean
 * over forks with a 95% confidence interval (Student t), and the overhead as the mean of the
 * per-round ratios agent/none, with its 95% confidence interval. It does so twice: for the wall
 * time per op (JMH's score) and for the benchmark thread's CPU time per op ({@link
 * ReadBenchmark.Cpu}), which a loaded machine distorts much less.
 *
 * <p>Arguments: path of unstall-agent.jar, then optionally rounds (forks per side), warm-up and
 * measurement iterations (defaults 5, 3, 5; one second each), and benchmark names.
 */
public final class AgentOverhead {
  private static final Map<String, String> WHAT =
      Map.of(
          "read4k", "16 MiB via FileInputStream, 4096 reads of 4 KiB",
          "read64k", "16 MiB via FileInputStream, 256 reads of 64 KiB",
          "iterator64k",
              "256 iterator next() calls (256 stall spans), each a 64 KiB positional FileChannel read");

  public static void main(String[] args) throws Exception {
    String agentJar =
        new File(args.length > 0 ? args[0] : "target/unstall-agent.jar").getAbsolutePath();
    int rounds = args.length > 1 ? Integer.parseInt(args[1]) : 5;
    int warmups = args.length > 2 ? Integer.parseInt(args[2]) : 3;
    int iterations = args.length > 3 ? Integer.parseInt(args[3]) : 5;
    List<String> benches =
        args.length > 4
            ? List.of(args).subList(4, args.length)
            : List.of("read4k", "read64k", "iterator64k");
    String agent =
        "-javaagent:" + agentJar + "=method=" + ReadBenchmark.BatchIterator.class.getName()
            + "#next,profile=off,otel.traces.exporter=none";

    Map<String, double[][]> scores = new LinkedHashMap<>(); // bench -> [side][round]
    Map<String, double[][]> cpu = new LinkedHashMap<>();
    for (String bench : benches) {
      scores.put(bench, new double[2][rounds]);
      cpu.put(bench, new double[2][rounds]);
    }
    for (int round = 0; round < rounds; round++) {
      for (String bench : benches) {
        for (int i = 0; i < 2; i++) {
          int withAgent = (round % 2 == 0) ? i : 1 - i;
          ChainedOptionsBuilder o =
              new OptionsBuilder()
                  .include(ReadBenchmark.class.getName() + "." + bench + "$")
                  .forks(1)
                  .warmupIterations(warmups)
                  .warmupTime(TimeValue.seconds(1))
                  .measurementIterations(iterations)
                  .measurementTime(TimeValue.seconds(1))
                  .verbosity(VerboseMode.SILENT)
                  .jvmArgsAppend("-Xshare:off", "-Xmx1g");
          if (withAgent == 1) {
            o = o.jvmArgsAppend("-Xshare:off", "-Xmx1g", agent);
          }
          RunResult r = new Runner(o.build()).runSingle();
          double score = r.getPrimaryResult().getScore();
          double cpuPerOp =
              r.getSecondaryResults().get("cpuNanos").getScore()
                  / r.getSecondaryResults().get("cpuOps").getScore()
                  / 1000;
          scores.get(bench)[withAgent][round] = score;
          cpu.get(bench)[withAgent][round] = cpuPerOp;
          System.err.printf(
              Locale.ROOT, "round %d %s %s: %.1f us/op wall, %.1f us/op cpu%n",
              round + 1, bench, withAgent == 1 ? "agent" : "none", score, cpuPerOp);
        }
      }
    }

    System.out.println();
    System.out.printf(
        Locale.ROOT, "%d interleaved rounds (one fork per side per round), %d x 1 s warm-up, %d x 1 s"
            + " measurement iterations per fork%n", rounds, warmups, iterations);
    table("wall time per op (JMH score)", scores, rounds);
    table("CPU time of the benchmark thread per op", cpu, rounds);
    bookkeeping(rounds, warmups, iterations, cpu);
  }

  /** The agent's cost per read call alone (BridgeBenchmark), against the CPU time of a read. */
  private static void bookkeeping(
      int forks, int warmups, int iterations, Map<String, double[][]> cpu) throws Exception {
    RunResult r =
        new Runner(
                new OptionsBuilder()
                    .include(BridgeBenchmark.class.getName() + ".trackedRead$")
                    .forks(forks)
                    .warmupIterations(warmups)
                    .warmupTime(TimeValue.seconds(1))
                    .measurementIterations(iterations)
                    .measurementTime(TimeValue.seconds(1))
                    .verbosity(VerboseMode.SILENT)
                    .jvmArgsAppend("-Xshare:off", "-Xmx1g")
                    .build())
            .runSingle();
    double ns = r.getPrimaryResult().getScore();
    double err = r.getPrimaryResult().getScoreError();
    System.out.println();
    System.out.printf(
        Locale.ROOT,
        "**bookkeeping per read call** (BridgeBenchmark, %d forks, JMH 99.9%% error): %.1f ± %.1f ns%n%n",
        forks, ns, Double.isNaN(err) ? 0 : err);
    System.out.println("| reads of | CPU time per read without the agent (ns) | bookkeeping / read |");
    System.out.println("|---|---|---|");
    for (String bench : List.of("read4k", "read64k")) {
      if (!cpu.containsKey(bench)) {
        continue;
      }
      int reads = bench.equals("read4k") ? 4096 : 256;
      double perRead = mean(cpu.get(bench)[0]) * 1000 / reads;
      System.out.printf(
          Locale.ROOT, "| %s | %.0f | **%.2f%%** |%n",
          bench.equals("read4k") ? "4 KiB" : "64 KiB", perRead, 100 * ns / perRead);
    }
  }

  private static void table(String title, Map<String, double[][]> scores, int rounds) {
    List<String> out = new ArrayList<>();
    out.add("");
    out.add("**" + title + "**");
    out.add("");
    out.add(
        "| benchmark | what one op is | no agent (µs/op, mean ± 95% CI over forks) | agent (µs/op) |"
            + " overhead (mean of per-round ratios − 1, ± 95% CI) |");
    out.add("|---|---|---|---|---|");
    for (Map.Entry<String, double[][]> e : scores.entrySet()) {
      double[] none = e.getValue()[0];
      double[] with = e.getValue()[1];
      double[] ratio = new double[rounds];
      for (int i = 0; i < rounds; i++) {
        ratio[i] = with[i] / none[i];
      }
      out.add(
          String.format(
              Locale.ROOT,
              "| %s | %s | %.0f ± %.0f | %.0f ± %.0f | **%+.1f%% ± %.1f%%** |",
              e.getKey(), WHAT.get(e.getKey()), mean(none), ci95(none), mean(with), ci95(with),
              100 * (mean(ratio) - 1), 100 * ci95(ratio)));
    }
    out.add("");
    out.add("per-round ratios agent/none:");
    for (Map.Entry<String, double[][]> e : scores.entrySet()) {
      StringBuilder sb = new StringBuilder("  " + e.getKey() + ":");
      for (int i = 0; i < rounds; i++) {
        sb.append(String.format(Locale.ROOT, " %.3f", e.getValue()[1][i] / e.getValue()[0][i]));
      }
      out.add(sb.toString());
    }
    out.forEach(System.out::println);
  }

  static double mean(double[] v) {
    double s = 0;
    for (double x : v) {
      s += x;
    }
    return s / v.length;
  }

  /** Half-width of the 95% confidence interval of the mean (Student t, n - 1 degrees of freedom). */
  static double ci95(double[] v) {
    int n = v.length;
    if (n < 2) {
      return Double.NaN;
    }
    double m = mean(v);
    double ss = 0;
    for (double x : v) {
      ss += (x - m) * (x - m);
    }
    double sd = Math.sqrt(ss / (n - 1));
    return T975[Math.min(n - 1, T975.length) - 1] * sd / Math.sqrt(n);
  }

  /** Student t quantiles 0.975 for 1..30 degrees of freedom (30+ uses the last). */
  private static final double[] T975 = {
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
    2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
    2.052, 2.048, 2.045, 2.042
  };
}
