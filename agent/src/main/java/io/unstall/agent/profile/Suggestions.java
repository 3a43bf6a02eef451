package io.unstall.agent.profile;

import io.unstall.agent.bootstrap.FileStats;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Rules over an {@link IoProfile}, after the Darshan analyses of DL workloads on HPC systems.
 * Each rule fires on counts (not on timings) where it can, and reports the numbers it used.
 */
public final class Suggestions {
  private Suggestions() {}

  public static final long MIN_READS = 64;
  public static final long SMALL_REQUEST_BYTES = 64 * 1024;
  public static final double REREAD_FRACTION = 0.10;
  public static final double SEQUENTIAL_FRACTION = 0.5;
  public static final long MANY_OPENS = 100;
  public static final long SMALL_FILE_BYTES = 1024 * 1024;
  public static final long MIN_STALLS = 10;
  public static final double STALL_FRACTION = 0.2;
  public static final double READ_SHARE_OF_STALL = 0.5;
  public static final long MIN_CHECKPOINT_WRITES = 16;
  public static final long MIN_SYNCS = 8;
  public static final double SYNCS_PER_WRITE = 0.5;
  public static final double CHECKPOINT_FRACTION = 0.10;
  public static final double SYNCHRONOUS_CHECKPOINT_FRACTION = 0.02;

  public static List<Suggestion> evaluate(IoProfile p) {
    List<Suggestion> out = new ArrayList<>();
    FileStats.Snapshot t = p.totals;
    double mean = IoProfile.meanRequest(t);

    if (t.dataReads >= MIN_READS && mean < SMALL_REQUEST_BYTES) {
      out.add(
          new Suggestion(
              "small_requests",
              String.format(
                  "Reads are small: %d reads of %.0f bytes on average (%.0f%% below 100 KiB)."
                      + " Read in 1-4 MiB requests: wrap streams in"
                      + " new BufferedInputStream(in, 1 << 20), read whole records or shards,"
                      + " or store samples in larger files.",
                  t.dataReads, mean, 100 * IoProfile.smallFraction(t)),
              evidence(
                  "data_reads", t.dataReads,
                  "mean_request_bytes", Math.round(mean),
                  "small_request_fraction", IoProfile.smallFraction(t),
                  "threshold_bytes", SMALL_REQUEST_BYTES)));
    }

    if (t.bytesReread > 0
        && t.bytesReread >= REREAD_FRACTION * t.bytes
        && (p.totalMemoryBytes <= 0 || t.uniqueBytes <= p.totalMemoryBytes / 2)) {
      out.add(
          new Suggestion(
              "reread_cacheable",
              String.format(
                  "%d of %d bytes read were read before (%.0f%%), and the %d distinct bytes fit"
                      + " in memory. Cache the data (or decoded batches) after the first epoch,"
                      + " or stage the files into node-local RAM or SSD.",
                  t.bytesReread, t.bytes, 100.0 * t.bytesReread / t.bytes, t.uniqueBytes),
              evidence(
                  "bytes", t.bytes,
                  "bytes_reread", t.bytesReread,
                  "unique_bytes", t.uniqueBytes,
                  "memory_bytes", p.totalMemoryBytes)));
    }

    double seq = IoProfile.sequentialFraction(t);
    if (t.dataReads >= MIN_READS && seq < SEQUENTIAL_FRACTION) {
      out.add(
          new Suggestion(
              "random_access",
              String.format(
                  "Only %.0f%% of reads continue at or after the previous read of the same file."
                      + " Shuffle the order of shards or records in memory instead of seeking,"
                      + " and read larger contiguous chunks.",
                  100 * seq),
              evidence("data_reads", t.dataReads, "sequential_fraction", seq)));
    }

    if (t.opens >= MANY_OPENS && t.bytes / Math.max(1, t.opens) < SMALL_FILE_BYTES) {
      out.add(
          new Suggestion(
              "many_small_files",
              String.format(
                  "%d files opened (%.1f per second), %d bytes read per open on average."
                      + " Pack small samples into shards (TFRecord, WebDataset tar, Arrow/Parquet).",
                  t.opens, p.filesOpenedPerSecond(), t.bytes / Math.max(1, t.opens)),
              evidence(
                  "opens", t.opens,
                  "files_opened_per_second", p.filesOpenedPerSecond(),
                  "bytes_per_open", t.bytes / Math.max(1, t.opens))));
    }

    if (p.stallCount >= MIN_STALLS && p.stallFraction() >= STALL_FRACTION) {
      boolean readBound = p.stallReadNanos >= READ_SHARE_OF_STALL * p.stallNanos;
      if (readBound && p.readerThreads <= 1) {
        out.add(
            new Suggestion(
                "few_reader_threads",
                String.format(
                    "The trainer waited for data %.0f%% of the run, mostly inside reads, and only"
                        + " %d thread read files. Prefetch on more reader threads (DL4J:"
                        + " AsyncDataSetIterator / asyncSupported(); a thread pool per shard).",
                    100 * p.stallFraction(), p.readerThreads),
                evidence(
                    "stall_fraction", p.stallFraction(),
                    "stall_read_fraction", (double) p.stallReadNanos / Math.max(1, p.stallNanos),
                    "reader_threads", p.readerThreads,
                    "stalls", p.stallCount)));
      } else {
        out.add(
            new Suggestion(
                "stall_dominated",
                String.format(
                    "The trainer waited for data %.0f%% of the run (%d waits). Overlap loading"
                        + " with compute: prefetch batches ahead and decode on worker threads.",
                    100 * p.stallFraction(), p.stallCount),
                evidence(
                    "stall_fraction", p.stallFraction(),
                    "stalls", p.stallCount,
                    "reader_threads", p.readerThreads)));
      }
    }
    checkpoints(p, out);
    return out;
  }

  /** The write-side rules: checkpoints written in small requests, syncs, and their time. */
  private static void checkpoints(IoProfile p, List<Suggestion> out) {
    FileStats.Snapshot t = p.totals;
    double meanCheckpointWrite = p.meanCheckpointWrite();
    if (p.checkpointCount > 0
        && p.checkpointWrites >= MIN_CHECKPOINT_WRITES
        && meanCheckpointWrite < SMALL_REQUEST_BYTES) {
      out.add(
          new Suggestion(
              "checkpoint_small_writes",
              String.format(
                  "%d checkpoints wrote %d bytes in %d write calls of %.0f bytes on average"
                      + " (%.3f s in all, %.3f s inside writes). Write through a large buffer"
                      + " (new BufferedOutputStream(out, 8 << 20)), or serialize the state to"
                      + " memory and write it in a few large calls.",
                  p.checkpointCount, p.checkpointBytes, p.checkpointWrites, meanCheckpointWrite,
                  p.checkpointNanos / 1e9, p.checkpointWriteNanos / 1e9),
              evidence(
                  "checkpoints", p.checkpointCount,
                  "bytes", p.checkpointBytes,
                  "write_calls", p.checkpointWrites,
                  "mean_request_bytes", Math.round(meanCheckpointWrite),
                  "checkpoint_time_ns", p.checkpointNanos,
                  "threshold_bytes", SMALL_REQUEST_BYTES)));
    }

    if (t.syncs >= MIN_SYNCS && t.syncs >= SYNCS_PER_WRITE * t.writeCalls) {
      out.add(
          new Suggestion(
              "fsync_per_request",
              String.format(
                  "%d syncs for %d write calls (%.3f s inside force/fsync). Sync once after the"
                      + " last write of a checkpoint (or write to a temporary file, sync it once"
                      + " and rename it), not after every request.",
                  t.syncs, t.writeCalls, t.syncNanos / 1e9),
              evidence(
                  "syncs", t.syncs,
                  "write_calls", t.writeCalls,
                  "sync_time_ns", t.syncNanos,
                  "bytes_written", t.bytesWritten)));
    }

    if (p.checkpointCount > 0 && p.checkpointFraction() >= CHECKPOINT_FRACTION) {
      out.add(
          new Suggestion(
              "checkpoint_time_share",
              String.format(
                  "Checkpoints took %.0f%% of the run: %d checkpoints, %.3f s, the longest %.3f s."
                      + " Checkpoint less often, save only what a restart needs, or write to"
                      + " node-local storage and copy it away in the background.",
                  100 * p.checkpointFraction(), p.checkpointCount, p.checkpointNanos / 1e9,
                  p.maxCheckpointNanos / 1e9),
              evidence(
                  "checkpoint_fraction", p.checkpointFraction(),
                  "checkpoints", p.checkpointCount,
                  "checkpoint_time_ns", p.checkpointNanos,
                  "max_checkpoint_ns", p.maxCheckpointNanos)));
    }

    if (p.trainingThreadCheckpoints > 0
        && p.trainingThreadCheckpointFraction() >= SYNCHRONOUS_CHECKPOINT_FRACTION) {
      out.add(
          new Suggestion(
              "async_checkpoint",
              String.format(
                  "%d checkpoints (%.3f s, %.1f%% of the run) were written by the training thread,"
                      + " which did not train meanwhile. Checkpoint asynchronously: copy the state"
                      + " in memory and write it on a background thread.",
                  p.trainingThreadCheckpoints, p.trainingThreadCheckpointNanos / 1e9,
                  100 * p.trainingThreadCheckpointFraction()),
              evidence(
                  "training_thread_checkpoints", p.trainingThreadCheckpoints,
                  "training_thread_checkpoint_time_ns", p.trainingThreadCheckpointNanos,
                  "fraction_of_run", p.trainingThreadCheckpointFraction())));
    }
  }

  private static Map<String, Object> evidence(Object... kv) {
    Map<String, Object> m = new LinkedHashMap<>();
    for (int i = 0; i < kv.length; i += 2) {
      m.put((String) kv[i], kv[i + 1]);
    }
    return m;
  }
}
