package io.unstall.agent.it;

import io.opentelemetry.api.trace.Span;
import io.opentelemetry.api.trace.SpanContext;
import io.opentelemetry.api.trace.TraceFlags;
import io.opentelemetry.api.trace.TraceState;
import io.opentelemetry.context.Scope;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.RandomAccessFile;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.Iterator;

/**
 * A tiny "trainer" run in a forked JVM with the agent attached. Each scenario reads its data file
 * in a known way inside {@link Batches#next()}, which the tests name with
 * {@code method=io.unstall.agent.it.ReaderApp$Batches#next}.
 */
public final class ReaderApp {
  public static final String TRACE_ID = "0af7651916cd43dd8448eb211c80319c";
  public static final String PARENT_SPAN_ID = "b7ad6b7169203331";

  interface Step {
    void run(int batch) throws IOException;
  }

  /** The data iterator: each next() runs one step of the scenario. */
  public static final class Batches implements Iterator<Integer> {
    private final int count;
    private final Step step;
    private int next;

    Batches(int count, Step step) {
      this.count = count;
      this.step = step;
    }

    @Override
    public boolean hasNext() {
      return next < count;
    }

    @Override
    public Integer next() {
      int batch = next++;
      try {
        step.run(batch);
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
      return batch;
    }
  }

  public static void main(String[] args) throws Exception {
    String scenario = args[0];
    Path file = Paths.get(args[1]);
    Batches batches = scenario(scenario, file);
    if (scenario.equals("parent")) {
      SpanContext parent =
          SpanContext.create(
              TRACE_ID, PARENT_SPAN_ID, TraceFlags.getSampled(), TraceState.getDefault());
      try (Scope ignored = Span.wrap(parent).makeCurrent()) {
        drain(batches);
      }
    } else {
      drain(batches);
    }
    System.out.println("done " + scenario);
  }

  private static void drain(Batches batches) {
    while (batches.hasNext()) {
      try {
        batches.next();
      } catch (IllegalStateException e) {
        // The application's own exception must arrive unchanged.
        System.out.println("caught " + e.getClass().getName() + " " + e.getMessage());
      }
    }
  }

  static Batches scenario(String name, Path file) throws IOException {
    switch (name) {
      case "fis":
      case "failure":
        // 5 batches, each reopens the file and reads it in 4 KiB requests.
        return new Batches(5, b -> readAll(file, 4096));
      case "parent":
        return new Batches(1, b -> readAll(file, 4096));
      case "fis-single":
        return new Batches(
            1,
            b -> {
              try (InputStream in = new FileInputStream(file.toFile())) {
                for (int i = 0; i < 100; i++) {
                  in.read();
                }
              }
            });
      case "raf": {
        RandomAccessFile raf = new RandomAccessFile(file.toFile(), "r");
        byte[] record = new byte[16384];
        // Records in reverse order: 3, 2, 1, 0.
        return new Batches(
            4,
            b -> {
              raf.seek((3 - b) * 16384L);
              raf.readFully(record);
              if (b == 3) {
                raf.close();
              }
            });
      }
      case "channel": {
        FileChannel ch = FileChannel.open(file, StandardOpenOption.READ);
        return new Batches(
            3,
            b -> {
              if (b == 0) {
                ByteBuffer buf = ByteBuffer.allocate(8192);
                while (ch.read(buf) != -1) {
                  buf.clear();
                }
              } else if (b == 1) {
                ByteBuffer buf = ByteBuffer.allocate(8192);
                ch.read(buf, 0);
                buf.clear();
                ch.read(buf, 16384);
              } else {
                ch.position(4096);
                ch.read(new ByteBuffer[] {ByteBuffer.allocate(4096), ByteBuffer.allocate(4096)});
                ch.close();
              }
            });
      }
      case "files":
        return new Batches(
            2,
            b -> {
              if (b == 0) {
                Files.readAllBytes(file);
              } else {
                try (InputStream in = Files.newInputStream(file)) {
                  byte[] buf = new byte[8192];
                  while (in.read(buf) != -1) {
                    // drain
                  }
                }
              }
            });
      case "error":
        return new Batches(
            3,
            b -> {
              readAll(file, 4096);
              if (b == 1) {
                throw new IllegalStateException("boom-" + b);
              }
            });
      default:
        throw new IllegalArgumentException(name);
    }
  }

  static void readAll(Path file, int chunk) throws IOException {
    try (FileInputStream in = new FileInputStream(file.toFile())) {
      byte[] buf = new byte[chunk];
      while (in.read(buf) != -1) {
        // drain
      }
    }
  }
}
