package io.unstall.agent.bench;

import io.unstall.agent.bootstrap.IoBridge;
import io.unstall.agent.bootstrap.Sink;
import io.unstall.agent.bootstrap.ThreadState;
import java.util.concurrent.TimeUnit;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OperationsPerInvocation;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;

/**
 * The agent's bookkeeping per read call alone, without the system call: what the advice in
 * FileInputStream.read adds ({@code readEnter} then {@code readExit} of a 4 KiB read at the
 * stream's position), in ns per read. {@link AgentOverhead} divides it by the CPU time of a real
 * read to give the overhead with far less noise than the end-to-end ratio on a loaded machine.
 */
@State(Scope.Thread)
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.NANOSECONDS)
public class BridgeBenchmark {
  static final int READS = 4096;

  final Object stream = new Object();
  final String path = "/unstall-bench/data.bin";

  @Setup(Level.Trial)
  public void start() {
    IoBridge.configure(new String[0], new String[0]);
    IoBridge.start(
        new Sink() {
          @Override
          public void stall(Object it, String m, long s, long d, ThreadState w, long p, Throwable e) {}
        },
        (where, t) -> {
          throw new IllegalStateException("agent failed in " + where, t);
        });
  }

  @TearDown(Level.Trial)
  public void stop() {
    IoBridge.stop();
  }

  /** 4096 tracked 4 KiB reads of one stream; the score is per read. */
  @Benchmark
  @OperationsPerInvocation(READS)
  public void trackedRead() {
    for (int i = 0; i < READS; i++) {
      IoBridge.readExit(IoBridge.readEnter(), stream, path, 4096, -1L);
    }
  }
}
