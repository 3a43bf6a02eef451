package io.unstall.agent.profile;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.unstall.agent.bootstrap.FileStats;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

class ProfileTest {
  static final long GIB = 1L << 30;

  static FileStats.Snapshot file(String path, int opens, long offsetStep, int reads, int size, int epochs) {
    FileStats f = new FileStats(path.hashCode(), path);
    for (int e = 0; e < epochs; e++) {
      for (int o = 0; o < opens; o++) {
        f.opened(0, false);
      }
      for (int i = 0; i < reads; i++) {
        f.record(i * offsetStep, size, 1000);
      }
      f.record(reads * offsetStep, -1, 10);
    }
    return f.snapshot();
  }

  static IoProfile profile(List<FileStats.Snapshot> files, long[] stalls, long readers) {
    return new IoProfile(1, 0, 10_000, files, readers, stalls, 16 * GIB);
  }

  static List<String> rules(IoProfile p) {
    List<String> r = new ArrayList<>();
    p.suggestions.forEach(s -> r.add(s.rule));
    return r;
  }

  @Test
  void smallRereadRequestsTriggerTwoRulesWithTheirNumbers() throws Exception {
    IoProfile p = profile(List.of(file("/d/a", 1, 4096, 100, 4096, 3)), new long[5], 1);
    assertEquals(List.of("small_requests", "reread_cacheable"), rules(p));
    JsonNode json = new ObjectMapper().readTree(ProfileWriter.toJson(p));
    assertEquals(ProfileWriter.FORMAT, json.get("format").asText());
    JsonNode totals = json.get("totals");
    assertEquals(1, totals.get("files").asInt());
    assertEquals(3 * 100 * 4096, totals.get("bytes").asLong());
    assertEquals(303, totals.get("read_calls").asLong());
    assertEquals(300, totals.get("request_size_histogram").get("1K_10K").asLong());
    assertEquals(2 * 100 * 4096, totals.get("bytes_reread").asLong());
    JsonNode small = json.get("suggestions").get(0);
    assertEquals(4096, small.get("evidence").get("mean_request_bytes").asLong());
    assertEquals(300, small.get("evidence").get("data_reads").asLong());
    JsonNode reread = json.get("suggestions").get(1).get("evidence");
    assertEquals(409600, reread.get("unique_bytes").asLong());
    assertTrue(ProfileWriter.toText(p).contains("[small_requests]"));
  }

  @Test
  void largeSequentialReadsOnceTriggerNothing() {
    IoProfile p = profile(List.of(file("/d/big", 1, 4 << 20, 100, 4 << 20, 1)), new long[5], 1);
    assertEquals(List.of(), rules(p));
  }

  @Test
  void randomOffsetsAndManySmallFiles() {
    List<FileStats.Snapshot> files = new ArrayList<>();
    // 300 reads that go backwards: offsets 299, 298, ... x 64 KiB.
    FileStats f = new FileStats(1, "/d/r");
    for (int i = 299; i >= 0; i--) {
      f.record(i * (1L << 16), 1 << 16, 10);
    }
    files.add(f.snapshot());
    for (int i = 0; i < 120; i++) {
      files.add(file("/d/small-" + i, 1, 0, 1, 2 << 10, 1));
    }
    List<String> r = rules(profile(files, new long[5], 4));
    assertTrue(r.contains("random_access"), r.toString());
    assertTrue(r.contains("many_small_files"), r.toString());
  }

  @Test
  void waitsDominatedByReadsOnOneThread() {
    // 20 waits, 6 of 10 seconds, 5 of them in reads, 1 reader thread.
    long[] stalls = {20, 6_000_000_000L, 1 << 20, 5_000_000_000L, 1_000_000_000L};
    assertEquals(List.of("few_reader_threads"), rules(profile(List.of(), stalls, 1)));
    assertEquals(List.of("stall_dominated"), rules(profile(List.of(), stalls, 8)));
  }

  @Test
  void checkpointRulesQuoteTheirNumbers() throws Exception {
    FileStats f = new FileStats(9, "/ckpt/model.zip");
    for (int i = 0; i < 100; i++) {
      f.recordWrite(4096, 1000);
      f.recordSync(50_000);
    }
    // 3 checkpoints, 1.5 s of a 10 s run, all on the training thread.
    long[] totals = {3, 1_500_000_000L, 409_600, 100, 100_000, 100, 3, 1_500_000_000L, 600_000_000L};
    IoProfile p =
        new IoProfile(1, IoProfile.Rank.NONE, 0, 10_000, List.of(f.snapshot()), 1, new long[5],
            16 * GIB, List.of(), totals, 0);
    assertEquals(
        List.of("checkpoint_small_writes", "fsync_per_request", "checkpoint_time_share",
            "async_checkpoint"),
        rules(p));
    JsonNode json = new ObjectMapper().readTree(ProfileWriter.toJson(p));
    JsonNode small = json.get("suggestions").get(0).get("evidence");
    assertEquals(409_600, small.get("bytes").asLong());
    assertEquals(100, small.get("write_calls").asLong());
    assertEquals(4096, small.get("mean_request_bytes").asLong());
    assertEquals(100, json.get("suggestions").get(1).get("evidence").get("syncs").asLong());
    assertEquals(0.15, json.get("checkpoints").get("fraction_of_run").asDouble(), 1e-9);
    assertEquals(409_600, json.get("totals").get("writes").get("bytes").asLong());
    assertEquals(100, json.get("files").get(0).get("writes").get("request_size_histogram").get("1K_10K").asLong());
  }
}
