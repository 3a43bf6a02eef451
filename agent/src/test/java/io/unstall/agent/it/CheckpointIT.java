package io.unstall.agent.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * A Deeplearning4j run that saves a checkpoint after every epoch in 4 KiB write calls, on the
 * training thread: one {@code unstall.checkpoint} span per checkpoint, the profile's checkpoint
 * section and per-file write counters with the exact bytes on disk, and the small-write
 * checkpoint suggestion quoting them.
 */
class CheckpointIT {
  static final int BATCHES = 8;
  static final int EPOCHS = 3;

  @TempDir Path dir;

  @Test
  void checkpointsIn4KiBWritesGetTheSmallWriteSuggestionWithTheirBytes() throws Exception {
    Path data = Files.createDirectories(dir.resolve("data"));
    Dl4jTrainer.writeData(data, BATCHES);
    Path checkpoints = Files.createDirectories(dir.resolve("checkpoints"));
    Path spans = dir.resolve("spans.jsonl");
    String classpath = ForkedJvm.trainerClasspath();
    ForkedJvm trainer =
        ForkedJvm.run(
            "profile=" + dir.resolve("profile") + ",spans.file=" + spans
                + ",otel.traces.exporter=none",
            classpath,
            Map.of(),
            dir,
            Dl4jTrainer.class.getName(),
            data.toString(),
            String.valueOf(BATCHES),
            String.valueOf(EPOCHS),
            checkpoints.toString());
    assertEquals(0, trainer.exitCode, trainer.toString());

    // What is on disk is what the agent must report.
    Map<String, Long> sizes = new HashMap<>();
    long totalBytes = 0;
    for (int e = 0; e < EPOCHS; e++) {
      Path f = checkpoints.resolve("checkpoint-" + e + ".zip").toAbsolutePath();
      sizes.put(f.toString(), Files.size(f));
      totalBytes += Files.size(f);
    }
    assertTrue(totalBytes > EPOCHS * 16L * Dl4jTrainer.CHECKPOINT_CHUNK, "checkpoints too small: " + sizes);

    JsonNode profile = ForkedJvm.JSON.readTree(dir.resolve("profile.json").toFile());
    long totalWrites = 0;
    for (Map.Entry<String, Long> e : sizes.entrySet()) {
      JsonNode w = ForkedJvm.fileEntry(profile, Paths.get(e.getKey())).get("writes");
      assertEquals((long) e.getValue(), w.get("bytes").asLong(), w.toString());
      assertEquals(Dl4jTrainer.CHECKPOINT_CHUNK, w.get("max_request_bytes").asLong(), w.toString());
      // Full 4 KiB buffers, plus the partial ones that ModelSerializer's flushes cause.
      long writes = w.get("write_calls").asLong();
      assertTrue(
          writes >= (e.getValue() + Dl4jTrainer.CHECKPOINT_CHUNK - 1) / Dl4jTrainer.CHECKPOINT_CHUNK,
          w.toString());
      assertEquals(1, w.get("syncs").asLong(), w.toString());
      totalWrites += writes;
    }

    JsonNode section = profile.get("checkpoints");
    assertEquals(EPOCHS, section.get("count").asLong(), section.toString());
    assertEquals(totalBytes, section.get("bytes").asLong());
    assertEquals(totalWrites, section.get("write_calls").asLong());
    assertEquals(EPOCHS, section.get("syncs").asLong());
    assertEquals(EPOCHS, section.get("training_thread_count").asLong());
    List<String> listed = new ArrayList<>();
    for (JsonNode c : section.get("list")) {
      listed.add(c.get("path").asText());
      assertEquals((long) sizes.get(c.get("path").asText()), c.get("bytes").asLong(), c.toString());
      assertTrue(c.get("duration_ns").asLong() >= c.get("write_time_ns").asLong(), c.toString());
      assertTrue(c.get("training_thread").asBoolean());
    }
    assertEquals(sizes.keySet(), new java.util.HashSet<>(listed));

    JsonNode rule = JaegerTrainingIT.suggestion(profile, "checkpoint_small_writes").get("evidence");
    assertEquals(EPOCHS, rule.get("checkpoints").asLong());
    assertEquals(totalBytes, rule.get("bytes").asLong());
    assertEquals(totalWrites, rule.get("write_calls").asLong());
    assertEquals(Math.round((double) totalBytes / totalWrites), rule.get("mean_request_bytes").asLong());
    assertTrue(Files.readString(dir.resolve("profile.txt")).contains("[checkpoint_small_writes]"));

    // One span per checkpoint, with the same numbers.
    List<JsonNode> checkpointSpans = new ArrayList<>();
    for (JsonNode s : ForkedJvm.readSpans(spans)) {
      if (s.get("name").asText().equals("unstall.checkpoint")) {
        checkpointSpans.add(s);
      }
    }
    assertEquals(EPOCHS, checkpointSpans.size(), checkpointSpans.toString());
    for (JsonNode s : checkpointSpans) {
      JsonNode a = s.get("attributes");
      String path = a.get("unstall.checkpoint.path").asText();
      assertEquals((long) sizes.get(path), a.get("unstall.checkpoint.bytes").asLong(), a.toString());
      assertEquals(1, a.get("unstall.checkpoint.syncs").asLong());
      assertTrue(a.get("unstall.checkpoint.training_thread").asBoolean());
      // Also the last one, which ends at exit, on the shutdown hook's thread.
      assertEquals("main", a.get("thread.name").asText(), a.toString());
      assertEquals(
          a.get("unstall.checkpoint.duration_ns").asLong(),
          s.get("endEpochNanos").asLong() - s.get("startEpochNanos").asLong());
    }
  }
}
