package io.unstall.agent.bench;

import java.io.File;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import org.openjdk.jmh.results.RunResult;
import org.openjdk.jmh.runner.Runner;
import org.openjdk.jmh.runner.options.ChainedOptionsBuilder;
import org.openjdk.jmh.runner.options.OptionsBuilder;
import org.openjdk.jmh.runner.options.TimeValue;

/**
 * Runs {@link ReadBenchmark} without and with the agent and prints a Markdown table of the
 * ratio. Arguments: path of unstall-agent.jar, then optionally forks, warm-up and measurement
 * iterations (defaults 2, 3, 5; one second each).
 */
public final class AgentOverhead {
  public static void main(String[] args) throws Exception {
    String agentJar = new File(args.length > 0 ? args[0] : "target/unstall-agent.jar").getAbsolutePath();
    int forks = args.length > 1 ? Integer.parseInt(args[1]) : 2;
    int warmups = args.length > 2 ? Integer.parseInt(args[2]) : 3;
    int iterations = args.length > 3 ? Integer.parseInt(args[3]) : 5;
    String agent =
        "-javaagent:" + agentJar + "=method=" + ReadBenchmark.BatchIterator.class.getName()
            + "#next,profile=off,otel.traces.exporter=none";
    Map<String, double[]> rows = new LinkedHashMap<>();
    for (String bench : List.of("read4k", "read64k", "iterator64k")) {
      double[] row = new double[4];
      for (int withAgent = 0; withAgent < 2; withAgent++) {
        ChainedOptionsBuilder o =
            new OptionsBuilder()
                .include(ReadBenchmark.class.getName() + "." + bench + "$")
                .forks(forks)
                .warmupIterations(warmups)
                .warmupTime(TimeValue.seconds(1))
                .measurementIterations(iterations)
                .measurementTime(TimeValue.seconds(1))
                .jvmArgsAppend("-Xshare:off", "-Xmx1g");
        if (withAgent == 1) {
          o = o.jvmArgsAppend("-Xshare:off", "-Xmx1g", agent);
        }
        Collection<RunResult> results = new Runner(o.build()).run();
        RunResult r = results.iterator().next();
        row[withAgent * 2] = r.getPrimaryResult().getScore();
        row[withAgent * 2 + 1] = r.getPrimaryResult().getScoreError();
      }
      rows.put(bench, row);
    }
    List<String> out = new ArrayList<>();
    out.add("| benchmark | what one op is | no agent (µs/op) | agent (µs/op) | ratio |");
    out.add("|---|---|---|---|---|");
    Map<String, String> what =
        Map.of(
            "read4k", "16 MiB via FileInputStream, 4096 reads of 4 KiB",
            "read64k", "16 MiB via FileInputStream, 256 reads of 64 KiB",
            "iterator64k", "256 iterator next() calls (256 stall spans), each a 64 KiB positional FileChannel read");
    for (Map.Entry<String, double[]> e : rows.entrySet()) {
      double[] r = e.getValue();
      out.add(
          String.format(
              Locale.ROOT,
              "| %s | %s | %.0f ± %.0f | %.0f ± %.0f | **%.3f** |",
              e.getKey(), what.get(e.getKey()), r[0], r[1], r[2], r[3], r[2] / r[0]));
    }
    System.out.println();
    out.forEach(System.out::println);
  }
}
