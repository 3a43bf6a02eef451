package io.unstall.agent.bench;

import java.io.FileInputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Iterator;
import java.util.Random;
import java.util.concurrent.TimeUnit;
import org.openjdk.jmh.annotations.AuxCounters;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;

/**
 * Read loops over a 16 MiB page-cached file. {@link AgentOverhead} runs them in JVMs with and
 * without {@code -javaagent:target/unstall-agent.jar} and reports the ratio. Besides the wall
 * time (the primary score), each op's CPU time on its thread (user + system, so the read system
 * call too) is counted in {@link Cpu}: on a loaded machine it is not inflated by the time the
 * thread waits for a core.
 */
@State(Scope.Benchmark)
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.MICROSECONDS)
public class ReadBenchmark {
  static final int FILE_BYTES = 16 << 20;
  static final int BATCH_BYTES = 64 << 10;

  Path file;
  byte[] buf4k = new byte[4 << 10];
  byte[] buf64k = new byte[64 << 10];
  ByteBuffer batch = ByteBuffer.allocateDirect(BATCH_BYTES);
  FileChannel channel;

  private static final ThreadMXBean THREADS = ManagementFactory.getThreadMXBean();

  /** CPU nanoseconds of the benchmark thread and ops, summed per iteration (their ratio: CPU/op). */
  @State(Scope.Thread)
  @AuxCounters(AuxCounters.Type.EVENTS)
  public static class Cpu {
    public long cpuNanos;
    public long cpuOps;

    long start() {
      return THREADS.getCurrentThreadCpuTime();
    }

    void end(long start) {
      cpuNanos += THREADS.getCurrentThreadCpuTime() - start;
      cpuOps++;
    }
  }

  /** A data iterator: each next() reads one 64 KiB batch with a positional channel read. */
  public static final class BatchIterator implements Iterator<ByteBuffer> {
    private final FileChannel ch;
    private final ByteBuffer buf;
    private long position;

    BatchIterator(FileChannel ch, ByteBuffer buf) {
      this.ch = ch;
      this.buf = buf;
    }

    @Override
    public boolean hasNext() {
      return position < FILE_BYTES;
    }

    @Override
    public ByteBuffer next() {
      buf.clear();
      try {
        while (buf.hasRemaining()) {
          int n = ch.read(buf, position + buf.position());
          if (n < 0) {
            break;
          }
        }
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
      position += BATCH_BYTES;
      buf.flip();
      return buf;
    }
  }

  @Setup(Level.Trial)
  public void setUp() throws IOException {
    file = Files.createTempFile("unstall-bench-", ".bin");
    byte[] data = new byte[FILE_BYTES];
    new Random(1).nextBytes(data);
    Files.write(file, data);
    channel = FileChannel.open(file, StandardOpenOption.READ);
  }

  @TearDown(Level.Trial)
  public void tearDown() throws IOException {
    channel.close();
    Files.deleteIfExists(file);
  }

  static long drain(Path file, byte[] buf) throws IOException {
    long total = 0;
    try (FileInputStream in = new FileInputStream(file.toFile())) {
      int n;
      while ((n = in.read(buf)) != -1) {
        total += n;
      }
    }
    return total;
  }

  /** FileInputStream over the whole file in 4 KiB reads (4096 reads per op). */
  @Benchmark
  public long read4k(Cpu cpu) throws IOException {
    long t = cpu.start();
    long n = drain(file, buf4k);
    cpu.end(t);
    return n;
  }

  /** FileInputStream over the whole file in 64 KiB reads (256 reads per op). */
  @Benchmark
  public long read64k(Cpu cpu) throws IOException {
    long t = cpu.start();
    long n = drain(file, buf64k);
    cpu.end(t);
    return n;
  }

  /** 256 next() calls on a batch iterator, each one stall span and one 64 KiB read. */
  @Benchmark
  public long iterator64k(Cpu cpu) {
    long t = cpu.start();
    BatchIterator it = new BatchIterator(channel, batch);
    long sum = 0;
    while (it.hasNext()) {
      sum += it.next().remaining();
    }
    cpu.end(t);
    return sum;
  }
}
