package io.unstall.agent.profile;

import io.unstall.agent.bootstrap.FileStats;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;

/** The numbers of one I/O profile: per file, totals, stalls; computed from counter snapshots. */
public final class IoProfile {
  public final long pid;
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
  public final List<Suggestion> suggestions;

  public IoProfile(
      long pid,
      long startEpochMillis,
      long endEpochMillis,
      List<FileStats.Snapshot> files,
      long readerThreads,
      long[] stallTotals,
      long totalMemoryBytes) {
    this.pid = pid;
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
    this.suggestions = Suggestions.evaluate(this);
  }

  private static FileStats.Snapshot sum(List<FileStats.Snapshot> files) {
    FileStats.Snapshot t = new FileStats.Snapshot();
    t.path = "*";
    t.sizeBuckets = new long[FileStats.BUCKET_NAMES.length];
    t.minRequest = Long.MAX_VALUE;
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
      t.maxRequest = Math.max(t.maxRequest, s.maxRequest);
      if (s.dataReads > 0) {
        t.minRequest = Math.min(t.minRequest, s.minRequest);
      }
      for (int i = 0; i < t.sizeBuckets.length; i++) {
        t.sizeBuckets[i] += s.sizeBuckets[i];
      }
    }
    if (t.minRequest == Long.MAX_VALUE) {
      t.minRequest = 0;
    }
    return t;
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
}
