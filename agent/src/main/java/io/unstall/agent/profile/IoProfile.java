package io.unstall.agent.profile;

import io.unstall.agent.bootstrap.Checkpoint;
import io.unstall.agent.bootstrap.FileStats;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;

/**
 * The numbers of one I/O profile: per file, totals, stalls, checkpoints and the process's rank;
 * computed from counter snapshots.
 */
public final class IoProfile {
  /** Where this process sits in a multi-process job (torchrun-style environment variables). */
  public static final class Rank {
    public static final Rank NONE = new Rank(null, null, null, null);

    /** RANK, else null. */
    public final Integer rank;
    /** LOCAL_RANK, else null. */
    public final Integer localRank;
    /** WORLD_SIZE, else null. */
    public final Integer worldSize;
    public final String host;

    public Rank(Integer rank, Integer localRank, Integer worldSize, String host) {
      this.rank = rank;
      this.localRank = localRank;
      this.worldSize = worldSize;
      this.host = host;
    }
  }

  public final long pid;
  public final Rank rank;
  public final long startEpochMillis;
  public final long endEpochMillis;
  public final double elapsedSeconds;
  public final List<FileStats.Snapshot> files;
  public final FileStats.Snapshot totals;
  public final long readerThreads;
  public final long stallCount;
  public final long stallNanos;
  public final long stallBytes;
  public final long stallReadNanos;
  public final long maxStallNanos;
  public final long totalMemoryBytes;
  /** The first {@code 1000} checkpoints, in the order they ended. */
  public final List<Checkpoint> checkpoints;
  public final long checkpointCount;
  public final long checkpointNanos;
  public final long checkpointBytes;
  public final long checkpointWrites;
  public final long checkpointWriteNanos;
  public final long checkpointSyncs;
  public final long trainingThreadCheckpoints;
  public final long trainingThreadCheckpointNanos;
  public final long maxCheckpointNanos;
  /** {@link System#nanoTime()} at the agent's start, for checkpoint start times. */
  public final long startNanos;
  public final List<Suggestion> suggestions;

  public IoProfile(
      long pid,
      long startEpochMillis,
      long endEpochMillis,
      List<FileStats.Snapshot> files,
      long readerThreads,
      long[] stallTotals,
      long totalMemoryBytes) {
    this(pid, Rank.NONE, startEpochMillis, endEpochMillis, files, readerThreads, stallTotals,
        totalMemoryBytes, List.of(), new long[9], 0);
  }

  /**
   * @param checkpointTotals as {@link io.unstall.agent.bootstrap.IoBridge#checkpointTotals()}
   */
  public IoProfile(
      long pid,
      Rank rank,
      long startEpochMillis,
      long endEpochMillis,
      List<FileStats.Snapshot> files,
      long readerThreads,
      long[] stallTotals,
      long totalMemoryBytes,
      List<Checkpoint> checkpoints,
      long[] checkpointTotals,
      long startNanos) {
    this.pid = pid;
    this.rank = rank;
    this.startEpochMillis = startEpochMillis;
    this.endEpochMillis = endEpochMillis;
    this.elapsedSeconds = Math.max(1e-3, (endEpochMillis - startEpochMillis) / 1000.0);
    List<FileStats.Snapshot> sorted = new ArrayList<>(files);
    sorted.sort(
        Comparator.comparingLong((FileStats.Snapshot s) -> s.bytes)
            .reversed()
            .thenComparing(s -> s.path));
    this.files = sorted;
    this.totals = sum(sorted);
    this.readerThreads = readerThreads;
    this.stallCount = stallTotals[0];
    this.stallNanos = stallTotals[1];
    this.stallBytes = stallTotals[2];
    this.stallReadNanos = stallTotals[3];
    this.maxStallNanos = stallTotals[4];
    this.totalMemoryBytes = totalMemoryBytes;
    this.checkpoints = List.copyOf(checkpoints);
    this.checkpointCount = checkpointTotals[0];
    this.checkpointNanos = checkpointTotals[1];
    this.checkpointBytes = checkpointTotals[2];
    this.checkpointWrites = checkpointTotals[3];
    this.checkpointWriteNanos = checkpointTotals[4];
    this.checkpointSyncs = checkpointTotals[5];
    this.trainingThreadCheckpoints = checkpointTotals[6];
    this.trainingThreadCheckpointNanos = checkpointTotals[7];
    this.maxCheckpointNanos = checkpointTotals[8];
    this.startNanos = startNanos;
    this.suggestions = Suggestions.evaluate(this);
  }

  private static FileStats.Snapshot sum(List<FileStats.Snapshot> files) {
    FileStats.Snapshot t = new FileStats.Snapshot();
    t.path = "*";
    t.sizeBuckets = new long[FileStats.BUCKET_NAMES.length];
    t.writeBuckets = new long[FileStats.BUCKET_NAMES.length];
    t.readRanges = new long[0];
    t.minRequest = Long.MAX_VALUE;
    t.minWrite = Long.MAX_VALUE;
    for (FileStats.Snapshot s : files) {
      t.bytes += s.bytes;
      t.readCalls += s.readCalls;
      t.dataReads += s.dataReads;
      t.readNanos += s.readNanos;
      t.consecutive += s.consecutive;
      t.sequential += s.sequential;
      t.bytesReread += s.bytesReread;
      t.uniqueBytes += s.uniqueBytes;
      t.rereadTruncated |= s.rereadTruncated;
      t.opens += s.opens;
      t.bytesWritten += s.bytesWritten;
      t.writeCalls += s.writeCalls;
      t.writeNanos += s.writeNanos;
      t.writeOpens += s.writeOpens;
      t.syncs += s.syncs;
      t.syncNanos += s.syncNanos;
      t.maxWrite = Math.max(t.maxWrite, s.maxWrite);
      if (s.bytesWritten > 0) {
        t.minWrite = Math.min(t.minWrite, s.minWrite);
      }
      addTo(t.writeBuckets, s.writeBuckets);
      t.maxRequest = Math.max(t.maxRequest, s.maxRequest);
      if (s.dataReads > 0) {
        t.minRequest = Math.min(t.minRequest, s.minRequest);
      }
      addTo(t.sizeBuckets, s.sizeBuckets);
    }
    if (t.minRequest == Long.MAX_VALUE) {
      t.minRequest = 0;
    }
    if (t.minWrite == Long.MAX_VALUE) {
      t.minWrite = 0;
    }
    return t;
  }

  private static void addTo(long[] sum, long[] add) {
    for (int i = 0; i < sum.length; i++) {
      sum[i] += add[i];
    }
  }

  public static double meanRequest(FileStats.Snapshot s) {
    return s.dataReads == 0 ? 0 : (double) s.bytes / s.dataReads;
  }

  public static double consecutiveFraction(FileStats.Snapshot s) {
    return s.dataReads == 0 ? 0 : (double) s.consecutive / s.dataReads;
  }

  public static double sequentialFraction(FileStats.Snapshot s) {
    return s.dataReads == 0 ? 0 : (double) s.sequential / s.dataReads;
  }

  /** Reads smaller than 64 KiB, as a fraction of reads that returned data. */
  public static double smallFraction(FileStats.Snapshot s) {
    if (s.dataReads == 0) {
      return 0;
    }
    long small = 0;
    for (int i = 0; i < 4; i++) { // 0_100, 100_1K, 1K_10K, 10K_100K: below 100 KiB
      small += s.sizeBuckets[i];
    }
    return (double) small / s.dataReads;
  }

  public double filesOpenedPerSecond() {
    return totals.opens / elapsedSeconds;
  }

  public double stallFraction() {
    return stallNanos / (elapsedSeconds * 1e9);
  }

  public static double meanWrite(FileStats.Snapshot s) {
    return s.writeCalls == 0 ? 0 : (double) s.bytesWritten / s.writeCalls;
  }

  /** Time spent writing checkpoints, as a fraction of the run. */
  public double checkpointFraction() {
    return checkpointNanos / (elapsedSeconds * 1e9);
  }

  /** Time the training threads spent writing checkpoints, as a fraction of the run. */
  public double trainingThreadCheckpointFraction() {
    return trainingThreadCheckpointNanos / (elapsedSeconds * 1e9);
  }

  public double meanCheckpointWrite() {
    return checkpointWrites == 0 ? 0 : (double) checkpointBytes / checkpointWrites;
  }
}
