package io.unstall.agent.bootstrap;

import java.lang.ref.WeakReference;

/**
 * Per-thread state: the re-entrancy guard, a small cache of the streams this thread uses, the
 * thread's pending batch of reads (flushed to the file's counters every {@link #BATCH_CALLS} calls
 * or when the thread leaves the contiguous run), the I/O of the current wait for a batch, and the
 * current burst of writes to one file (a checkpoint candidate). Only its own thread writes it;
 * {@link IoBridge} flushes the batches of finished threads and, at exit, of every thread.
 */
public final class ThreadState {
  private static final int CACHE = 4;
  private static final int MAX_WINDOW_FILES = 64;
  /** Reads batched per thread before the file's counters (and their lock) are touched. */
  static final int BATCH_CALLS = 32;
  /** One read call in this many is timed (plus the first read of each wait); see readNanos(). */
  static final int TIME_EVERY = 16;

  final WeakReference<Thread> thread = new WeakReference<Thread>(Thread.currentThread());

  /** Non-zero while inside a tracked call or the agent's own code: nested I/O is not counted. */
  int guard;
  boolean countedAsReader;
  /** This thread has waited for a batch at least once: it is a training thread. */
  boolean trainingThread;
  int readSeq;

  // Nesting depth of next-batch methods; only the outermost one is a stall.
  int iteratorDepth;
  long iteratorStart;
  /** Start of the current tracked call, or 0 when this read is not timed. */
  long callStart;
  long processBytesAtStart;

  long windowBytes;
  long windowReadCalls;
  long windowTimedNanos;
  long windowTimedCalls;
  int windowFiles;
  private final int[] windowFileIds = new int[MAX_WINDOW_FILES];

  // The pending batch of reads: contiguous data reads of one file, plus end-of-file calls.
  FileStats batchFile;
  long batchStart;
  long batchEnd;
  long batchCalls;
  long batchDataReads;
  long batchTimedNanos;
  long batchTimedCalls;
  long batchMin = Long.MAX_VALUE;
  long batchMax;
  final long[] batchBuckets = new long[FileStats.BUCKET_NAMES.length];

  // The current burst of writes (and syncs) to one file.
  FileStats burstFile;
  long burstStart;
  long burstEnd;
  long burstBytes;
  long burstWrites;
  long burstWriteNanos;
  long burstSyncs;
  Object burstParent;
  boolean burstParentTaken;

  private final Object[] cacheKeys = new Object[CACHE];
  private final StreamState[] cacheValues = new StreamState[CACHE];
  private int cacheNext;
  private Object lastStream;
  private StreamState lastState;

  /** Bytes this thread read during the current wait. */
  public long bytes() {
    return windowBytes;
  }

  /** Read calls this thread made during the current wait, including end-of-file reads. */
  public long readCalls() {
    return windowReadCalls;
  }

  /**
   * Time this thread spent inside read calls during the current wait, estimated from the timed
   * calls (the first read of the wait and every {@value #TIME_EVERY}th call).
   */
  public long readNanos() {
    return windowTimedCalls == 0 ? 0 : windowTimedNanos * windowReadCalls / windowTimedCalls;
  }

  /** Distinct files this thread read during the current wait (exact up to 64). */
  public int files() {
    return windowFiles;
  }

  /** Whether the read starting now is timed. */
  boolean timeThisRead() {
    return ++readSeq % TIME_EVERY == 0 || (iteratorDepth > 0 && windowTimedCalls == 0);
  }

  void resetWindow() {
    windowBytes = 0;
    windowReadCalls = 0;
    windowTimedNanos = 0;
    windowTimedCalls = 0;
    windowFiles = 0;
  }

  void addToWindow(int fileId, long n, long nanos) {
    windowReadCalls++;
    if (nanos >= 0) {
      windowTimedNanos += nanos;
      windowTimedCalls++;
    }
    if (n > 0) {
      windowBytes += n;
    }
    int known = Math.min(windowFiles, MAX_WINDOW_FILES);
    for (int i = known - 1; i >= 0; i--) {
      if (windowFileIds[i] == fileId) {
        return;
      }
    }
    if (windowFiles < MAX_WINDOW_FILES) {
      windowFileIds[windowFiles] = fileId;
    }
    windowFiles++;
  }

  /** Whether a read continues the pending batch (same file, next offset); if not, flush first. */
  boolean continues(FileStats file, long offset, long n) {
    return batchFile == file && (n <= 0 || batchDataReads == 0 || offset == batchEnd);
  }

  /** Adds one read call to the pending batch; true when the batch is full and must be flushed. */
  boolean addRead(FileStats file, long offset, long n, long nanos) {
    batchFile = file;
    batchCalls++;
    if (nanos >= 0) {
      batchTimedNanos += nanos;
      batchTimedCalls++;
    }
    if (n > 0) {
      if (batchDataReads++ == 0) {
        batchStart = offset;
        batchEnd = offset;
      }
      batchEnd += n;
      if (n < batchMin) {
        batchMin = n;
      }
      if (n > batchMax) {
        batchMax = n;
      }
      batchBuckets[FileStats.bucket(n)]++;
    }
    return batchCalls >= BATCH_CALLS;
  }

  /** Moves the pending batch into the file's counters; returns the bytes it held. */
  long flushReads() {
    FileStats f = batchFile;
    if (f == null) {
      return 0;
    }
    long bytes = batchEnd - batchStart;
    if (batchDataReads == 0) {
      bytes = 0;
    }
    f.recordReads(batchStart, batchEnd, batchCalls, batchDataReads, batchTimedNanos,
        batchTimedCalls, batchMin, batchMax, batchBuckets);
    batchFile = null;
    batchCalls = 0;
    batchDataReads = 0;
    batchTimedNanos = 0;
    batchTimedCalls = 0;
    batchMin = Long.MAX_VALUE;
    batchMax = 0;
    for (int i = 0; i < batchBuckets.length; i++) {
      batchBuckets[i] = 0;
    }
    return bytes;
  }

  /** Adds one write (or sync, {@code bytes < 0}) to the current burst, which must be of {@code file}. */
  void addToBurst(FileStats file, long start, long end, long bytes, long nanos) {
    if (burstFile != file) {
      burstFile = file;
      burstStart = start;
      burstBytes = 0;
      burstWrites = 0;
      burstWriteNanos = 0;
      burstSyncs = 0;
      burstParent = null;
      burstParentTaken = false;
    }
    burstEnd = end;
    if (bytes < 0) {
      burstSyncs++;
    } else {
      burstWrites++;
      burstBytes += bytes;
      burstWriteNanos += nanos;
    }
  }

  StreamState cached(Object stream) {
    if (lastStream == stream) {
      return lastState;
    }
    for (int i = 0; i < CACHE; i++) {
      if (cacheKeys[i] == stream) {
        lastStream = stream;
        lastState = cacheValues[i];
        return lastState;
      }
    }
    return null;
  }

  void cache(Object stream, StreamState state) {
    cacheKeys[cacheNext] = stream;
    cacheValues[cacheNext] = state;
    cacheNext = (cacheNext + 1) % CACHE;
    lastStream = stream;
    lastState = state;
  }
}
