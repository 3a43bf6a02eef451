package io.unstall.agent.bootstrap;

/**
 * Per-thread state: the re-entrancy guard, a small cache of the streams this thread reads, and
 * the I/O accumulated during the current wait for a batch. Only its own thread touches it.
 */
public final class ThreadState {
  private static final int CACHE = 4;
  private static final int MAX_WINDOW_FILES = 64;

  /** Non-zero while inside a tracked read or the agent's own code: nested reads are not counted. */
  int guard;
  boolean countedAsReader;

  // Nesting depth of next-batch methods; only the outermost one is a stall.
  int iteratorDepth;
  long iteratorStart;
  long readStart;
  long processBytesAtStart;

  long windowBytes;
  long windowReadCalls;
  long windowReadNanos;
  int windowFiles;
  private final int[] windowFileIds = new int[MAX_WINDOW_FILES];

  private final Object[] cacheKeys = new Object[CACHE];
  private final StreamState[] cacheValues = new StreamState[CACHE];
  private int cacheNext;

  /** Bytes this thread read during the current wait. */
  public long bytes() {
    return windowBytes;
  }

  /** Read calls this thread made during the current wait, including end-of-file reads. */
  public long readCalls() {
    return windowReadCalls;
  }

  /** Time this thread spent inside read calls during the current wait. */
  public long readNanos() {
    return windowReadNanos;
  }

  /** Distinct files this thread read during the current wait (exact up to 64). */
  public int files() {
    return windowFiles;
  }

  void resetWindow() {
    windowBytes = 0;
    windowReadCalls = 0;
    windowReadNanos = 0;
    windowFiles = 0;
  }

  void addToWindow(int fileId, long n, long nanos) {
    windowReadCalls++;
    windowReadNanos += nanos;
    if (n > 0) {
      windowBytes += n;
    }
    int known = Math.min(windowFiles, MAX_WINDOW_FILES);
    for (int i = 0; i < known; i++) {
      if (windowFileIds[i] == fileId) {
        return;
      }
    }
    if (windowFiles < MAX_WINDOW_FILES) {
      windowFileIds[windowFiles] = fileId;
    }
    windowFiles++;
  }

  StreamState cached(Object stream) {
    for (int i = 0; i < CACHE; i++) {
      if (cacheKeys[i] == stream) {
        return cacheValues[i];
      }
    }
    return null;
  }

  void cache(Object stream, StreamState state) {
    cacheKeys[cacheNext] = stream;
    cacheValues[cacheNext] = state;
    cacheNext = (cacheNext + 1) % CACHE;
  }
}
