package io.unstall.flight;

import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.dataset.DatasetStats;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Future;
import org.apache.arrow.memory.ArrowBuf;

/**
 * Reads the samples of a batch that no tier holds from the dataset's storage, straight into their slices of the
 * batch buffer: neighbours in one file coalesced into ranged requests, the requests run in parallel, and every
 * sample read offered to the cache tiers through an {@link Admission}.
 */
final class StorageReader {
  /** Requests larger than this are not coalesced further (a few MiB amortise a request to remote storage). */
  static final int MAX_RUN = 4 << 20;
  /** Neighbours of one file this close are read with the bytes between them rather than in two requests. */
  static final int MAX_GAP = 64 << 10;

  /** A sample to read from storage into the batch buffer at {@code off}. */
  record Miss(int id, long off, int len) {}

  /** Offers bytes just read from storage to the cache tiers (learning their digest). */
  interface Admission {
    void admit(Dataset d, int id, ArrowBuf data, long off, int len, DatasetStats.Epoch stats);
  }

  private final ExecutorService io;
  private final Admission admission;

  /** Reads on {@code io} (shared with the batch's peer fetches); every sample read goes to {@code admission}. */
  StorageReader(ExecutorService io, Admission admission) {
    this.io = io;
    this.admission = admission;
  }

  /** Reads {@code misses} into {@code data}, coalesced ({@link #MAX_RUN}, {@link #MAX_GAP}) and in parallel. */
  void read(Dataset d, List<Miss> misses, ArrowBuf data, DatasetStats.Epoch stats) throws IOException {
    readAll(readTasks(d, misses, data, stats));
  }

  /**
   * Plans the storage requests of a batch's misses: samples of one file that lie close together (TFRecord
   * records of a shard read in order) are coalesced into one ranged request of up to {@link #MAX_RUN} bytes,
   * data and checksums together; a lone sample without a trailer is read straight into the batch buffer.
   */
  private List<Runnable> readTasks(Dataset d, List<Miss> misses, ArrowBuf data, DatasetStats.Epoch stats) {
    List<Runnable> tasks = new ArrayList<>();
    if (misses.isEmpty()) {
      return tasks;
    }
    int trailer = d.trailer();
    misses.sort(java.util.Comparator.comparing((Miss m) -> d.file(m.id())).thenComparingLong(m -> d.offset(m.id())));
    int from = 0;
    for (int i = 1; i <= misses.size(); i++) {
      boolean ends = i == misses.size();
      if (!ends) {
        Miss first = misses.get(from);
        Miss prev = misses.get(i - 1);
        Miss next = misses.get(i);
        long prevEnd = d.offset(prev.id()) + prev.len() + trailer;
        long nextEnd = d.offset(next.id()) + next.len() + trailer;
        ends = !d.file(next.id()).equals(d.file(first.id()))
            || d.offset(next.id()) - prevEnd > MAX_GAP
            || nextEnd - d.offset(first.id()) > MAX_RUN;
      }
      if (ends) {
        List<Miss> run = misses.subList(from, i);
        if (!d.format().coalesces()) { // samples decoded from larger units: each read on its own
          run.forEach(m -> tasks.add(() -> readMiss(d, m.id(), data, m.off(), m.len(), stats)));
        } else if (run.size() == 1 && trailer == 0) {
          Miss m = run.get(0);
          tasks.add(() -> readMiss(d, m.id(), data, m.off(), m.len(), stats));
        } else {
          tasks.add(() -> readRun(d, List.copyOf(run), data, stats));
        }
        from = i;
      }
    }
    return tasks;
  }

  private void readRun(Dataset d, List<Miss> run, ArrowBuf data, DatasetStats.Epoch stats) {
    Miss first = run.get(0);
    long start = d.offset(first.id());
    long end = start;
    for (Miss m : run) {
      end = Math.max(end, d.offset(m.id()) + m.len() + d.trailer());
    }
    try {
      ByteBuffer bytes = ByteBuffer.allocate((int) (end - start)).order(java.nio.ByteOrder.LITTLE_ENDIAN);
      try {
        d.readRun(d.file(first.id()), start, bytes);
      } catch (java.nio.file.NoSuchFileException e) {
        throw notFound(d, first.id(), e);
      }
      bytes.clear();
      for (Miss m : run) {
        d.extract(m.id(), bytes, start, data.nioBuffer(m.off(), m.len()));
        stats.miss(m.len());
        admission.admit(d, m.id(), data, m.off(), m.len(), stats);
      }
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  private void readMiss(Dataset d, int id, ArrowBuf data, long off, int len, DatasetStats.Epoch stats) {
    try {
      readFromStorage(d, id, data, off, len);
      stats.miss(len);
      admission.admit(d, id, data, off, len, stats);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /**
   * Reads a batch's misses from storage in parallel (remote storage answers many requests at once far
   * faster than one after another); each read lands in its own slice of the batch buffer. Waits for every
   * read before returning or throwing, so nothing writes into a buffer after it is released.
   */
  private void readAll(List<Runnable> misses) throws IOException {
    if (misses.size() <= 1) {
      for (Runnable r : misses) {
        runUnchecked(r);
      }
      return;
    }
    List<Future<?>> running = new ArrayList<>(misses.size());
    for (Runnable r : misses) {
      running.add(io.submit(r));
    }
    Throwable first = null;
    for (Future<?> f : running) {
      try {
        f.get();
      } catch (ExecutionException e) {
        first = first == null ? e.getCause() : first;
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        first = first == null ? e : first;
      }
    }
    if (first != null) {
      rethrow(first);
    }
  }

  private static void runUnchecked(Runnable r) throws IOException {
    try {
      r.run();
    } catch (UncheckedIOException e) {
      throw e.getCause();
    }
  }

  private static void rethrow(Throwable t) throws IOException {
    if (t instanceof UncheckedIOException u) {
      throw u.getCause();
    }
    if (t instanceof IOException io) {
      throw io;
    }
    if (t instanceof RuntimeException r) {
      throw r;
    }
    if (t instanceof Error e) {
      throw e;
    }
    throw new IOException(t);
  }

  static void readFromStorage(Dataset d, int id, ArrowBuf data, long off, int len) throws IOException {
    try {
      d.read(id, data.nioBuffer(off, len));
    } catch (java.nio.file.NoSuchFileException e) {
      throw notFound(d, id, e);
    }
  }

  private static SampleNotFoundException notFound(Dataset d, int id, Exception e) {
    return new SampleNotFoundException(
        "dataset '" + d.name() + "' sample " + id + ": file '" + d.fileOf(id)
            + "' no longer exists (deleted after registration?)",
        e);
  }
}
