package io.unstall.agent.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * End to end: a Deeplearning4j training run with the agent attached exports its stall spans over
 * OTLP to a real Jaeger (v2 all-in-one, in-memory) started here; the spans are read back through
 * Jaeger's HTTP API, and the run's I/O profile is checked.
 * See {@link Jaeger} for where the Jaeger binary comes from.
 */
class JaegerTrainingIT {
  static final int BATCHES = 8;
  static final int EPOCHS = 3;
  static final String ITERATOR = Dl4jTrainer.FileBatchIterator.class.getName();

  @TempDir Path dir;

  @Test
  void dl4jTrainingStallsShowUpInJaegerAndInTheProfile() throws Exception {
    try (Jaeger jaeger = Jaeger.start(dir)) {
      Path data = Files.createDirectories(dir.resolve("data"));
      List<Path> files = Dl4jTrainer.writeData(data, BATCHES);
      String service = "unstall-e2e-" + ProcessHandle.current().pid();
      Map<String, String> env = jaeger.exporterEnv(service);
      String classpath = ForkedJvm.trainerClasspath();
      ForkedJvm trainer =
          ForkedJvm.run(
              "profile=" + dir.resolve("profile"),
              classpath,
              env,
              dir,
              Dl4jTrainer.class.getName(),
              data.toString(),
              String.valueOf(BATCHES),
              String.valueOf(EPOCHS));
      assertEquals(0, trainer.exitCode, trainer.toString());
      assertTrue(trainer.stdout.contains("trained " + EPOCHS + " epochs"), trainer.toString());

      // The spans, read back from Jaeger.
      List<JsonNode> stalls =
          Jaeger.spans(jaeger.awaitTraces(service, "unstall.stall", BATCHES * EPOCHS), "unstall.stall");
      assertEquals(BATCHES * EPOCHS, stalls.size());
      for (JsonNode span : stalls) {
        Map<String, JsonNode> tags = Jaeger.tags(span);
        assertEquals(ITERATOR, tags.get("unstall.iterator.class").asText());
        assertEquals("next", tags.get("unstall.iterator.method").asText());
        assertEquals(Dl4jTrainer.BATCH_BYTES, tags.get("unstall.io.bytes").asLong());
        // 16 KiB in 4 KiB requests: 4 reads and the end-of-file read.
        assertEquals(5, tags.get("unstall.io.read_calls").asLong());
        assertEquals(1, tags.get("unstall.io.files").asLong());
        assertTrue(tags.get("unstall.io.read_time_ns").asLong() > 0);
        assertTrue(tags.get("unstall.stall.duration_ns").asLong() > 0);
      }

      // The I/O profile of the same run.
      JsonNode profile = ForkedJvm.JSON.readTree(dir.resolve("profile.json").toFile());
      for (Path f : files) {
        JsonNode e = ForkedJvm.fileEntry(profile, f);
        assertEquals((long) EPOCHS * Dl4jTrainer.BATCH_BYTES, e.get("bytes").asLong(), e.toString());
        assertEquals(EPOCHS * 5L, e.get("read_calls").asLong());
        assertEquals(EPOCHS * 4L, e.get("request_size_histogram").get("1K_10K").asLong());
        assertEquals(4096, e.get("min_request_bytes").asLong());
        assertEquals(4096, e.get("max_request_bytes").asLong());
        assertEquals(EPOCHS, e.get("opens").asLong());
        assertEquals((long) (EPOCHS - 1) * Dl4jTrainer.BATCH_BYTES, e.get("bytes_reread").asLong());
        assertEquals(Dl4jTrainer.BATCH_BYTES, e.get("unique_bytes").asLong());
      }
      JsonNode smallRequests = suggestion(profile, "small_requests");
      assertTrue(smallRequests.get("evidence").get("mean_request_bytes").asLong() <= 4096);
      JsonNode reread = suggestion(profile, "reread_cacheable");
      assertTrue(
          reread.get("evidence").get("bytes_reread").asLong()
              >= (long) BATCHES * (EPOCHS - 1) * Dl4jTrainer.BATCH_BYTES);
      assertEquals(BATCHES * EPOCHS, profile.get("stalls").get("count").asLong());
      assertEquals(
          (long) BATCHES * EPOCHS * Dl4jTrainer.BATCH_BYTES,
          profile.get("stalls").get("io_bytes").asLong());
    }
  }

  static JsonNode suggestion(JsonNode profile, String rule) {
    for (JsonNode s : profile.get("suggestions")) {
      if (s.get("rule").asText().equals(rule)) {
        return s;
      }
    }
    throw new AssertionError("rule " + rule + " did not fire: " + profile.get("suggestions"));
  }
}
