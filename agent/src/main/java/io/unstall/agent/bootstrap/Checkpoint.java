package io.unstall.agent.bootstrap;

/**
 * One checkpoint: a burst of writes (and syncs) to one file by one thread, ended by that thread's
 * next wait for a batch, its next read, or its first write to another file, and large enough to
 * count ({@link IoBridge#CHECKPOINT_MIN_WRITES} writes or {@link IoBridge#CHECKPOINT_MIN_BYTES}).
 */
public final class Checkpoint {
  public final String path;
  /** {@link System#nanoTime()} of the first write's start. */
  public final long startNanos;
  /** From the first write's start to the end of the last write or sync. */
  public final long durationNanos;
  public final long bytes;
  public final long writes;
  public final long writeNanos;
  public final long syncs;
  /** Written by a thread that also waits for batches: training stopped while it was written. */
  public final boolean trainingThread;
  /** What {@link Sink#currentContext()} returned when the burst became a checkpoint. */
  public final Object parent;
  /** The thread that wrote it (null if it was collected before the burst ended, at exit). */
  public final String threadName;
  public final long threadId;

  Checkpoint(String path, long startNanos, long durationNanos, long bytes, long writes,
      long writeNanos, long syncs, boolean trainingThread, Object parent, Thread writer) {
    this.parent = parent;
    this.threadName = writer == null ? null : writer.getName();
    this.threadId = writer == null ? -1 : writer.getId();
    this.path = path;
    this.startNanos = startNanos;
    this.durationNanos = durationNanos;
    this.bytes = bytes;
    this.writes = writes;
    this.writeNanos = writeNanos;
    this.syncs = syncs;
    this.trainingThread = trainingThread;
  }
}
