package io.unstall.agent.bootstrap;

import java.io.File;
import java.io.RandomAccessFile;
import java.nio.channels.FileChannel;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.WeakHashMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.LongAdder;

/**
 * The one class advice calls. Every entry point is static, cheap when the agent is quiet, never
 * throws, and allocates nothing on the per-read path once a stream has been seen.
 *
 * <p>A read is: {@link #readEnter()} returns the thread's state (null = do not track, for example
 * when nested inside another tracked read or inside the agent's own code), then {@link #readExit}
 * records it. A wait for the next batch is {@link #iteratorEnter()} / {@link #iteratorExit}.
 */
public final class IoBridge {
  private IoBridge() {}

  /** False until the agent installs a sink, and forever after the agent fails once. */
  private static volatile boolean active;

  private static volatile Sink sink;
  private static volatile long startNanos = System.nanoTime();
  private static volatile String[] excludePrefixes = new String[0];
  private static volatile String[] excludeSuffixes = new String[0];

  private static final ThreadLocal<ThreadState> STATE =
      new ThreadLocal<ThreadState>() {
        @Override
        protected ThreadState initialValue() {
          ThreadState ts = new ThreadState();
          synchronized (THREADS) {
            if (THREADS.size() >= pruneAt) {
              pruneFinishedThreads();
              pruneAt = Math.max(1024, THREADS.size() * 2);
            }
            THREADS.add(ts);
          }
          return ts;
        }
      };

  /** Every thread's state, so that finished threads' pending reads are not lost. */
  private static final List<ThreadState> THREADS = new ArrayList<ThreadState>();
  private static int pruneAt = 1024;

  /** A burst of at least this many writes, or this many bytes, is a checkpoint. */
  public static final long CHECKPOINT_MIN_WRITES = 16;
  public static final long CHECKPOINT_MIN_BYTES = 1 << 20;
  static final int MAX_LISTED_CHECKPOINTS = 1000;
  private static final List<Checkpoint> CHECKPOINTS = new ArrayList<Checkpoint>();
  /** count, nanos, bytes, writes, write nanos, syncs, on training threads, their nanos, max nanos. */
  private static final long[] CHECKPOINT_TOTALS = new long[9];

  private static final Map<Object, StreamState> STREAMS =
      Collections.synchronizedMap(new WeakHashMap<Object, StreamState>());
  private static final ConcurrentHashMap<String, FileStats> FILES =
      new ConcurrentHashMap<String, FileStats>();
  private static final AtomicInteger FILE_IDS = new AtomicInteger();

  private static final LongAdder PROCESS_BYTES = new LongAdder();
  private static final LongAdder READER_THREADS = new LongAdder();
  private static final LongAdder STALLS = new LongAdder();
  private static final LongAdder STALL_NANOS = new LongAdder();
  private static final LongAdder STALL_BYTES = new LongAdder();
  private static final LongAdder STALL_READ_NANOS = new LongAdder();
  private static volatile long maxStallNanos;

  private static volatile FailureListener failureListener;

  /** Told once, when the agent turns itself off after an internal failure. */
  public interface FailureListener {
    void failed(String where, Throwable t);
  }

  // ---------------------------------------------------------------- set-up (agent side)

  public static void configure(String[] prefixes, String[] suffixes) {
    excludePrefixes = prefixes.clone();
    excludeSuffixes = suffixes.clone();
  }

  public static void start(Sink s, FailureListener listener) {
    startNanos = System.nanoTime();
    failureListener = listener;
    sink = s;
    active = true;
  }

  public static void stop() {
    active = false;
  }

  public static boolean isActive() {
    return active;
  }

  /** Marks the current thread as running agent code: its reads and waits are not recorded. */
  public static void enterAgent() {
    STATE.get().guard++;
  }

  public static void exitAgent() {
    STATE.get().guard--;
  }

  /** Turns instrumentation off and reports the failure once. */
  public static void fail(String where, Throwable t) {
    boolean wasActive = active;
    active = false;
    if (wasActive) {
      FailureListener l = failureListener;
      if (l != null) {
        try {
          l.failed(where, t);
        } catch (Throwable ignored) {
          // Nothing else can be done; the agent is already quiet.
        }
      }
    }
  }

  // ---------------------------------------------------------------- reads (advice side)

  /** Start of a read call; returns null when this read must not be recorded. */
  public static ThreadState readEnter() {
    ThreadState ts = enter();
    if (ts != null) {
      ts.callStart = ts.timeThisRead() ? System.nanoTime() : 0;
    }
    return ts;
  }

  /** The thread's state with the guard set, or null when the agent is off or the guard was set. */
  private static ThreadState enter() {
    if (!active) {
      return null;
    }
    ThreadState ts = STATE.get();
    if (ts.guard != 0) {
      return null;
    }
    ts.guard = 1;
    return ts;
  }

  /**
   * End of a read call. The hot path: a thread-local stream cache hit, then the read joins the
   * thread's pending batch; the file's lock is taken once per batch, not per read.
   *
   * @param ts what {@link #readEnter()} returned
   * @param stream the FileInputStream, RandomAccessFile or FileChannel
   * @param path the stream's path field (null when opened from a file descriptor)
   * @param n bytes returned (negative at end of file; 0 when the call threw)
   * @param position the explicit offset of a positional read, or -1 to use the stream position
   */
  public static void readExit(ThreadState ts, Object stream, String path, long n, long position) {
    if (ts == null) {
      return;
    }
    try {
      long nanos = ts.callStart != 0 ? System.nanoTime() - ts.callStart : -1;
      StreamState s = state(ts, stream, path, n, position, false);
      if (s == StreamState.EXCLUDED) {
        return;
      }
      long offset;
      if (position >= 0) {
        offset = position;
      } else {
        offset = s.position;
        if (n > 0) {
          s.position = offset + n;
        }
      }
      FileStats file = s.file;
      if (ts.burstFile != null && n > 0) {
        endBurst(ts);
      }
      if (!ts.continues(file, offset, n)) {
        flush(ts);
      }
      if (ts.addRead(file, offset, n, nanos)) {
        flush(ts);
      }
      if (!ts.countedAsReader) {
        ts.countedAsReader = true;
        READER_THREADS.increment();
      }
      if (ts.iteratorDepth > 0) {
        ts.addToWindow(file.id, n, nanos);
      }
    } catch (Throwable t) {
      fail("read", t);
    } finally {
      ts.guard = 0;
    }
  }

  /** Moves the thread's pending reads into the file counters and the process byte count. */
  private static void flush(ThreadState ts) {
    long bytes = ts.flushReads();
    if (bytes > 0) {
      PROCESS_BYTES.add(bytes);
    }
  }

  // ---------------------------------------------------------------- writes and syncs (advice side)

  /** Start of a write or sync call (always timed: checkpoint time comes from these). */
  public static ThreadState writeEnter() {
    ThreadState ts = enter();
    if (ts != null) {
      ts.callStart = System.nanoTime();
    }
    return ts;
  }

  /**
   * End of a write call of {@code n} bytes (0 when it threw) at the stream position, or at
   * {@code position} for a positional write.
   */
  public static void writeExit(ThreadState ts, Object stream, String path, long n, long position) {
    if (ts == null) {
      return;
    }
    try {
      long end = System.nanoTime();
      StreamState s = state(ts, stream, path, n, position, true);
      if (s == StreamState.EXCLUDED) {
        return;
      }
      if (position < 0 && n > 0) {
        s.position += n;
      }
      s.file.recordWrite(n, end - ts.callStart);
      if (ts.burstFile != s.file) {
        endBurst(ts);
      }
      ts.addToBurst(s.file, ts.callStart, end, Math.max(0, n), end - ts.callStart);
      if (!ts.burstParentTaken && isCheckpoint(ts)) {
        // Once the burst is big enough to be a checkpoint, still inside the code writing it: the
        // application's span now is its parent. Small writes to many files never pay for this.
        ts.burstParentTaken = true;
        Sink sk = sink;
        ts.burstParent = sk == null ? null : sk.currentContext();
      }
    } catch (Throwable t) {
      fail("write", t);
    } finally {
      ts.guard = 0;
    }
  }

  /** End of FileChannel.force: an fsync of the channel's file. */
  public static void syncExit(ThreadState ts, Object stream, String path) {
    if (ts == null) {
      return;
    }
    try {
      long end = System.nanoTime();
      StreamState s = state(ts, stream, path, 0, 0, true);
      if (s == StreamState.EXCLUDED) {
        return;
      }
      s.file.recordSync(end - ts.callStart);
      if (ts.burstFile == s.file) {
        ts.addToBurst(s.file, ts.callStart, end, -1, 0);
      }
    } catch (Throwable t) {
      fail("sync", t);
    } finally {
      ts.guard = 0;
    }
  }

  private static boolean isCheckpoint(ThreadState ts) {
    return ts.burstWrites >= CHECKPOINT_MIN_WRITES || ts.burstBytes >= CHECKPOINT_MIN_BYTES;
  }

  /** Ends the thread's burst of writes; a large enough one is a checkpoint. Caller holds the guard. */
  private static void endBurst(ThreadState ts) {
    FileStats f = ts.burstFile;
    if (f == null) {
      return;
    }
    ts.burstFile = null;
    Object parent = ts.burstParent;
    ts.burstParent = null;
    if (!isCheckpoint(ts)) {
      return;
    }
    Checkpoint c =
        new Checkpoint(f.path, ts.burstStart, ts.burstEnd - ts.burstStart, ts.burstBytes,
            ts.burstWrites, ts.burstWriteNanos, ts.burstSyncs, ts.trainingThread, parent,
            ts.thread.get());
    synchronized (CHECKPOINTS) {
      CHECKPOINT_TOTALS[0]++;
      CHECKPOINT_TOTALS[1] += c.durationNanos;
      CHECKPOINT_TOTALS[2] += c.bytes;
      CHECKPOINT_TOTALS[3] += c.writes;
      CHECKPOINT_TOTALS[4] += c.writeNanos;
      CHECKPOINT_TOTALS[5] += c.syncs;
      if (c.trainingThread) {
        CHECKPOINT_TOTALS[6]++;
        CHECKPOINT_TOTALS[7] += c.durationNanos;
      }
      CHECKPOINT_TOTALS[8] = Math.max(CHECKPOINT_TOTALS[8], c.durationNanos);
      if (CHECKPOINTS.size() < MAX_LISTED_CHECKPOINTS) {
        CHECKPOINTS.add(c);
      }
    }
    Sink s = sink;
    if (s != null) {
      s.checkpoint(c);
    }
  }

  /** After seek(pos) / position(pos): the next non-positional read starts at {@code newPosition}. */
  public static void seekExit(Object stream, String path, long newPosition) {
    if (!active) {
      return;
    }
    ThreadState ts = STATE.get();
    if (ts.guard != 0) {
      return;
    }
    ts.guard = 1;
    try {
      StreamState s = state(ts, stream, path, 0, newPosition, false);
      if (s != StreamState.EXCLUDED) {
        s.position = newPosition;
      }
    } catch (Throwable t) {
      fail("seek", t);
    } finally {
      ts.guard = 0;
    }
  }

  /** After skip(n) returned {@code skipped}. */
  public static void skipExit(Object stream, String path, long skipped) {
    if (!active || skipped <= 0) {
      return;
    }
    ThreadState ts = STATE.get();
    if (ts.guard != 0) {
      return;
    }
    ts.guard = 1;
    try {
      StreamState s = state(ts, stream, path, 0, -1, false);
      if (s != StreamState.EXCLUDED) {
        s.position += skipped;
      }
    } catch (Throwable t) {
      fail("skip", t);
    } finally {
      ts.guard = 0;
    }
  }

  /** The stream's state: the thread's cache, else {@link #lookup}. */
  private static StreamState state(
      ThreadState ts, Object stream, String path, long n, long position, boolean write)
      throws Exception {
    StreamState s = ts.cached(stream);
    return s != null ? s : lookup(ts, stream, path, n, position, write);
  }

  /** Slow path, once per stream and thread: find or create the stream's state. */
  private static StreamState lookup(
      ThreadState ts, Object stream, String path, long n, long position, boolean write)
      throws Exception {
    StreamState s = STREAMS.get(stream);
    if (s == null) {
      s = newStreamState(stream, path, n, position);
      StreamState raced = STREAMS.putIfAbsent(stream, s);
      if (raced != null) {
        s = raced;
      } else if (s != StreamState.EXCLUDED) {
        s.file.opened(System.nanoTime(), write);
      }
    }
    ts.cache(stream, s);
    return s;
  }

  private static StreamState newStreamState(Object stream, String path, long n, long position)
      throws Exception {
    if (path == null) {
      return StreamState.EXCLUDED;
    }
    String absolute = new File(path).getAbsolutePath();
    if (isExcluded(absolute)) {
      return StreamState.EXCLUDED;
    }
    FileStats file = FILES.get(absolute);
    if (file == null) {
      FileStats created = new FileStats(FILE_IDS.incrementAndGet(), absolute);
      file = FILES.putIfAbsent(absolute, created);
      if (file == null) {
        file = created;
      }
    }
    // The position before the read that made us notice this stream.
    long before = 0;
    long consumed = n > 0 && position < 0 ? n : 0;
    if (stream instanceof RandomAccessFile) {
      before = ((RandomAccessFile) stream).getFilePointer() - consumed;
    } else if (stream instanceof FileChannel) {
      before = ((FileChannel) stream).position() - consumed;
    }
    return new StreamState(file, Math.max(0, before));
  }

  static boolean isExcluded(String absolutePath) {
    for (String p : excludePrefixes) {
      if (absolutePath.startsWith(p)) {
        return true;
      }
    }
    for (String s : excludeSuffixes) {
      if (absolutePath.endsWith(s)) {
        return true;
      }
    }
    return false;
  }

  // ---------------------------------------------------------------- waits for a batch

  /** Start of a next-batch call; returns null when it is not tracked. */
  public static ThreadState iteratorEnter() {
    if (!active) {
      return null;
    }
    ThreadState ts = STATE.get();
    if (ts.guard != 0) {
      return null;
    }
    if (ts.iteratorDepth++ == 0) {
      ts.trainingThread = true;
      ts.guard++;
      try {
        endBurst(ts);
        flush(ts);
      } catch (Throwable t) {
        fail("wait", t);
      } finally {
        ts.guard--;
      }
      ts.resetWindow();
      ts.processBytesAtStart = PROCESS_BYTES.sum();
      ts.iteratorStart = System.nanoTime();
    }
    return ts;
  }

  public static void iteratorExit(ThreadState ts, Object iterator, String method, Throwable error) {
    if (ts == null) {
      return;
    }
    if (--ts.iteratorDepth != 0) {
      return;
    }
    long duration = System.nanoTime() - ts.iteratorStart;
    if (!active) {
      return;
    }
    ts.guard++;
    try {
      flush(ts);
      STALLS.increment();
      STALL_NANOS.add(duration);
      STALL_BYTES.add(ts.windowBytes);
      STALL_READ_NANOS.add(ts.readNanos());
      if (duration > maxStallNanos) {
        maxStallNanos = duration;
      }
      long processBytes = PROCESS_BYTES.sum() - ts.processBytesAtStart;
      Sink s = sink;
      if (s != null) {
        s.stall(iterator, method, ts.iteratorStart, duration, ts, processBytes, error);
      }
    } catch (Throwable t) {
      fail("stall", t);
    } finally {
      ts.guard--;
    }
  }

  // ---------------------------------------------------------------- the profile reads these

  /**
   * Flushes pending reads into the file counters: those of the calling thread and of finished
   * threads, and with {@code everyThread} (at exit) also of threads still running, whose bursts
   * of writes then end too. A thread still reading at that moment may be off by one batch.
   */
  public static void flushThreads(boolean everyThread) {
    ThreadState me = STATE.get();
    me.guard++;
    try {
      List<ThreadState> all;
      synchronized (THREADS) {
        all = new ArrayList<ThreadState>(THREADS);
      }
      for (ThreadState ts : all) {
        Thread t = ts.thread.get();
        boolean finished = t == null || !t.isAlive();
        if (ts == me || finished || everyThread) {
          flush(ts);
          if (finished || everyThread) {
            endBurst(ts);
          }
        }
      }
      synchronized (THREADS) {
        pruneFinishedThreads();
      }
    } catch (Throwable t) {
      fail("flush", t);
    } finally {
      me.guard--;
    }
  }

  /** Drops finished threads whose batches are empty. Caller holds the THREADS lock. */
  private static void pruneFinishedThreads() {
    for (int i = THREADS.size() - 1; i >= 0; i--) {
      ThreadState ts = THREADS.get(i);
      Thread t = ts.thread.get();
      if ((t == null || !t.isAlive()) && ts.batchFile == null && ts.burstFile == null) {
        THREADS.remove(i);
      }
    }
  }

  public static List<Checkpoint> checkpoints() {
    synchronized (CHECKPOINTS) {
      return new ArrayList<Checkpoint>(CHECKPOINTS);
    }
  }

  /**
   * {count, total nanos, bytes, writes, write nanos, syncs, count on training threads, their
   * nanos, max nanos}.
   */
  public static long[] checkpointTotals() {
    synchronized (CHECKPOINTS) {
      return CHECKPOINT_TOTALS.clone();
    }
  }

  public static List<FileStats.Snapshot> fileSnapshots() {
    List<FileStats.Snapshot> out = new ArrayList<FileStats.Snapshot>();
    for (FileStats f : FILES.values()) {
      out.add(f.snapshot());
    }
    return out;
  }

  /** {@link System#nanoTime()} when the agent started. */
  public static long startNanos() {
    return startNanos;
  }

  public static long readerThreads() {
    return READER_THREADS.sum();
  }

  /** {count, total nanos, bytes read by the waiting threads, read nanos, max nanos}. */
  public static long[] stallTotals() {
    return new long[] {
      STALLS.sum(), STALL_NANOS.sum(), STALL_BYTES.sum(), STALL_READ_NANOS.sum(), maxStallNanos
    };
  }
}
