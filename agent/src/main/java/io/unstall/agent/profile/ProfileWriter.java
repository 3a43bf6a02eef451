package io.unstall.agent.profile;

import io.unstall.agent.bootstrap.Checkpoint;
import io.unstall.agent.bootstrap.FileStats;
import io.unstall.agent.bootstrap.IoBridge;
import java.io.File;
import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;
import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;

/** Writes the I/O profile as {@code PREFIX.json} (machines) and {@code PREFIX.txt} (people). */
public final class ProfileWriter {
  public static final String FORMAT = "unstall.io-profile/1";
  /** Per file, at most this many distinct read ranges are written (the merge compares them). */
  public static final int MAX_JSON_RANGES = 65536;

  private final String prefix;
  private final long startEpochMillis;

  public ProfileWriter(String prefix, long startEpochMillis) {
    this.prefix = prefix;
    this.startEpochMillis = startEpochMillis;
  }

  public IoProfile snapshot() {
    IoBridge.flushThreads(false);
    return new IoProfile(
        ProcessHandle.current().pid(),
        rankFromEnvironment(),
        startEpochMillis,
        System.currentTimeMillis(),
        IoBridge.fileSnapshots(),
        IoBridge.readerThreads(),
        IoBridge.stallTotals(),
        totalMemory(),
        IoBridge.checkpoints(),
        IoBridge.checkpointTotals(),
        IoBridge.startNanos());
  }

  /** RANK, LOCAL_RANK and WORLD_SIZE as torchrun, Horovod launchers and Slurm wrappers set them. */
  static IoProfile.Rank rankFromEnvironment() {
    String host = System.getenv("HOSTNAME");
    if (host == null || host.isEmpty()) {
      try {
        host = java.net.InetAddress.getLocalHost().getHostName();
      } catch (java.io.IOException | RuntimeException e) {
        host = null;
      }
    }
    return new IoProfile.Rank(
        envInt("RANK"), envInt("LOCAL_RANK"), envInt("WORLD_SIZE"), host);
  }

  private static Integer envInt(String name) {
    String v = System.getenv(name);
    if (v == null || v.isBlank()) {
      return null;
    }
    try {
      return Integer.valueOf(v.trim());
    } catch (NumberFormatException e) {
      return null;
    }
  }

  /** Writes both files (atomically replaced) and returns the JSON path. */
  public synchronized String write() throws IOException {
    IoProfile p = snapshot();
    File json = new File(prefix + ".json").getAbsoluteFile();
    File text = new File(prefix + ".txt").getAbsoluteFile();
    if (json.getParentFile() != null) {
      json.getParentFile().mkdirs();
    }
    replace(json, toJson(p));
    replace(text, toText(p));
    return json.getPath();
  }

  private static void replace(File target, String content) throws IOException {
    File tmp = new File(target.getPath() + ".tmp");
    Files.write(tmp.toPath(), content.getBytes(StandardCharsets.UTF_8));
    Files.move(tmp.toPath(), target.toPath(), StandardCopyOption.REPLACE_EXISTING);
  }

  static long totalMemory() {
    try {
      java.lang.management.OperatingSystemMXBean os = ManagementFactory.getOperatingSystemMXBean();
      if (os instanceof com.sun.management.OperatingSystemMXBean) {
        return ((com.sun.management.OperatingSystemMXBean) os).getTotalMemorySize();
      }
    } catch (RuntimeException | LinkageError ignored) {
      // unknown
    }
    return -1;
  }

  public static String toJson(IoProfile p) {
    Json j = new Json();
    j.beginObject();
    j.field("format", FORMAT);
    j.field("pid", p.pid);
    j.field("rank", p.rank.rank);
    j.field("local_rank", p.rank.localRank);
    j.field("world_size", p.rank.worldSize);
    j.field("host", p.rank.host);
    j.field("start_epoch_ms", p.startEpochMillis);
    j.field("end_epoch_ms", p.endEpochMillis);
    j.field("elapsed_s", p.elapsedSeconds);
    j.key("totals");
    fileJson(j, p.totals, p.files.size());
    j.field("files_opened_per_second", p.filesOpenedPerSecond());
    j.field("reader_threads", p.readerThreads);
    j.key("stalls").beginObject();
    j.field("count", p.stallCount);
    j.field("total_ns", p.stallNanos);
    j.field("max_ns", p.maxStallNanos);
    j.field("io_bytes", p.stallBytes);
    j.field("read_time_ns", p.stallReadNanos);
    j.field("fraction_of_run", p.stallFraction());
    j.endObject();
    j.key("checkpoints").beginObject();
    j.field("count", p.checkpointCount);
    j.field("bytes", p.checkpointBytes);
    j.field("write_calls", p.checkpointWrites);
    j.field("mean_request_bytes", p.meanCheckpointWrite());
    j.field("write_time_ns", p.checkpointWriteNanos);
    j.field("syncs", p.checkpointSyncs);
    j.field("total_ns", p.checkpointNanos);
    j.field("max_ns", p.maxCheckpointNanos);
    j.field("fraction_of_run", p.checkpointFraction());
    j.field("training_thread_count", p.trainingThreadCheckpoints);
    j.field("training_thread_ns", p.trainingThreadCheckpointNanos);
    j.key("list").beginArray();
    for (Checkpoint c : p.checkpoints) {
      j.beginObject();
      j.field("path", c.path);
      j.field("start_s", (c.startNanos - p.startNanos) / 1e9);
      j.field("duration_ns", c.durationNanos);
      j.field("bytes", c.bytes);
      j.field("write_calls", c.writes);
      j.field("mean_request_bytes", c.writes == 0 ? 0.0 : (double) c.bytes / c.writes);
      j.field("write_time_ns", c.writeNanos);
      j.field("syncs", c.syncs);
      j.field("training_thread", c.trainingThread);
      j.endObject();
    }
    j.endArray();
    j.endObject();
    j.key("files").beginArray();
    for (FileStats.Snapshot s : p.files) {
      fileJson(j, s, -1);
    }
    j.endArray();
    j.key("suggestions").beginArray();
    for (Suggestion s : p.suggestions) {
      j.beginObject();
      j.field("rule", s.rule);
      j.field("message", s.message);
      j.field("evidence", s.evidence);
      j.endObject();
    }
    j.endArray();
    j.endObject();
    return j.toString() + "\n";
  }

  /** One file's counters, or the totals when {@code fileCount >= 0}. */
  private static void fileJson(Json j, FileStats.Snapshot s, int fileCount) {
    boolean totals = fileCount >= 0;
    j.beginObject();
    if (!totals) {
      j.field("path", s.path);
    } else {
      j.field("files", fileCount);
    }
    j.field("bytes", s.bytes);
    j.field("read_calls", s.readCalls);
    j.field("data_reads", s.dataReads);
    j.field("read_time_ns", s.readNanos);
    j.field("opens", s.opens);
    j.field("mean_request_bytes", IoProfile.meanRequest(s));
    j.field("min_request_bytes", s.minRequest);
    j.field("max_request_bytes", s.maxRequest);
    histogram(j, s.sizeBuckets);
    j.field("consecutive_fraction", IoProfile.consecutiveFraction(s));
    j.field("sequential_fraction", IoProfile.sequentialFraction(s));
    j.field("bytes_reread", s.bytesReread);
    j.field("unique_bytes", s.uniqueBytes);
    j.field("reread_is_lower_bound", s.rereadTruncated);
    if (!totals) {
      j.field("max_offset", s.maxOffset);
      int ranges = Math.min(s.readRanges.length / 2, MAX_JSON_RANGES);
      j.key("read_ranges").beginArray();
      for (int i = 0; i < ranges; i++) {
        j.beginArray().value(s.readRanges[2 * i]).value(s.readRanges[2 * i + 1]).endArray();
      }
      j.endArray();
      j.field("read_ranges_truncated", ranges < s.readRanges.length / 2 || s.rereadTruncated);
    }
    j.key("writes").beginObject();
    j.field("bytes", s.bytesWritten);
    j.field("write_calls", s.writeCalls);
    j.field("write_time_ns", s.writeNanos);
    j.field("opens", s.writeOpens);
    j.field("mean_request_bytes", IoProfile.meanWrite(s));
    j.field("min_request_bytes", s.minWrite);
    j.field("max_request_bytes", s.maxWrite);
    histogram(j, s.writeBuckets);
    j.field("syncs", s.syncs);
    j.field("sync_time_ns", s.syncNanos);
    j.endObject();
    j.endObject();
  }

  /** Darshan's request-size buckets as {@code "request_size_histogram": {"0_100": n, ...}}. */
  private static void histogram(Json j, long[] buckets) {
    j.key("request_size_histogram").beginObject();
    for (int i = 0; i < FileStats.BUCKET_NAMES.length; i++) {
      j.field(FileStats.BUCKET_NAMES[i], buckets[i]);
    }
    j.endObject();
  }

  public static String toText(IoProfile p) {
    StringBuilder sb = new StringBuilder();
    FileStats.Snapshot t = p.totals;
    sb.append(String.format(Locale.ROOT, "unstall I/O profile (pid %d%s, %.1f s)%n", p.pid,
        p.rank.rank == null ? "" : ", rank " + p.rank.rank, p.elapsedSeconds));
    sb.append(String.format(Locale.ROOT,
        "  read %s in %d calls (%d with data) from %d files, %d opens (%.1f/s), %d reader threads%n",
        human(t.bytes), t.readCalls, t.dataReads, p.files.size(), t.opens,
        p.filesOpenedPerSecond(), p.readerThreads));
    sb.append(String.format(Locale.ROOT,
        "  time in read %.3f s; mean request %s (min %s, max %s)%n",
        t.readNanos / 1e9, human((long) IoProfile.meanRequest(t)), human(t.minRequest),
        human(t.maxRequest)));
    sb.append(String.format(Locale.ROOT,
        "  consecutive %.0f%%, sequential %.0f%%; re-read %s of %s distinct%n",
        100 * IoProfile.consecutiveFraction(t), 100 * IoProfile.sequentialFraction(t),
        human(t.bytesReread), human(t.uniqueBytes)));
    sb.append(String.format(Locale.ROOT,
        "  waits for data: %d, %.3f s total (%.0f%% of the run), max %.3f s, %s read while waiting%n",
        p.stallCount, p.stallNanos / 1e9, 100 * p.stallFraction(), p.maxStallNanos / 1e9,
        human(p.stallBytes)));
    sb.append(String.format(Locale.ROOT,
        "  wrote %s in %d calls (mean %s), %d syncs; %d checkpoints: %s in %d writes, %.3f s"
            + " (%.0f%% of the run)%n",
        human(t.bytesWritten), t.writeCalls, human((long) IoProfile.meanWrite(t)), t.syncs,
        p.checkpointCount, human(p.checkpointBytes), p.checkpointWrites, p.checkpointNanos / 1e9,
        100 * p.checkpointFraction()));
    sb.append("\nrequest sizes (reads with data):\n");
    for (int i = 0; i < FileStats.BUCKET_NAMES.length; i++) {
      if (t.sizeBuckets[i] > 0) {
        sb.append(String.format(Locale.ROOT, "  %-10s %d%n", FileStats.BUCKET_NAMES[i], t.sizeBuckets[i]));
      }
    }
    sb.append("\nfiles (by bytes read):\n");
    sb.append(String.format(Locale.ROOT, "  %12s %8s %6s %10s %6s %6s %12s  %s%n",
        "bytes", "reads", "opens", "mean req", "consec", "seq", "re-read", "path"));
    int shown = 0;
    for (FileStats.Snapshot s : p.files) {
      if (shown++ == 50) {
        sb.append(String.format("  ... %d more in the JSON profile%n", p.files.size() - 50));
        break;
      }
      sb.append(String.format(Locale.ROOT, "  %12d %8d %6d %10s %5.0f%% %5.0f%% %12d  %s%n",
          s.bytes, s.readCalls, s.opens, human((long) IoProfile.meanRequest(s)),
          100 * IoProfile.consecutiveFraction(s), 100 * IoProfile.sequentialFraction(s),
          s.bytesReread, s.path));
    }
    sb.append("\nsuggestions:\n");
    if (p.suggestions.isEmpty()) {
      sb.append("  none: no rule fired\n");
    }
    for (Suggestion s : p.suggestions) {
      sb.append("  [").append(s.rule).append("] ").append(s.message).append('\n');
      Map<String, Object> ev = new LinkedHashMap<>(s.evidence);
      sb.append("      evidence: ").append(ev).append('\n');
    }
    return sb.toString();
  }

  static String human(long bytes) {
    if (bytes < 1024) {
      return bytes + " B";
    }
    String[] units = {"KiB", "MiB", "GiB", "TiB"};
    double v = bytes;
    int u = -1;
    while (v >= 1024 && u < units.length - 1) {
      v /= 1024;
      u++;
    }
    return String.format(Locale.ROOT, "%.1f %s", v, units[u]);
  }
}
