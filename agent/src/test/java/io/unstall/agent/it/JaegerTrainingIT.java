package io.unstall.agent.it;

import static org.awaitility.Awaitility.await;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.File;
import java.io.IOException;
import java.net.ServerSocket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.awaitility.core.ConditionTimeoutException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * End to end: a Deeplearning4j training run with the agent attached exports its stall spans over
 * OTLP to a real Jaeger (v2 all-in-one, in-memory) started here; the spans are read back through
 * Jaeger's HTTP API, and the run's I/O profile is checked.
 *
 * <p>Jaeger comes from {@code bash scripts/install-jaeger.sh}; its path is the system property or
 * environment variable {@code UNSTALL_JAEGER_BIN}, by default
 * {@code ${UNSTALL_CACHE:-~/.cache/unstall}/bin/jaeger}. A missing Jaeger fails the test.
 */
class JaegerTrainingIT {
  static final int BATCHES = 8;
  static final int EPOCHS = 3;
  static final String ITERATOR = Dl4jTrainer.FileBatchIterator.class.getName();

  @TempDir Path dir;

  static Path jaegerBinary() {
    String configured = System.getProperty("UNSTALL_JAEGER_BIN", System.getenv("UNSTALL_JAEGER_BIN"));
    Path bin;
    if (configured != null && !configured.isBlank()) {
      bin = Paths.get(configured);
    } else {
      String cache = System.getenv("UNSTALL_CACHE");
      Path root =
          cache != null && !cache.isBlank()
              ? Paths.get(cache)
              : Paths.get(System.getProperty("user.home"), ".cache", "unstall");
      bin = root.resolve("bin").resolve("jaeger");
    }
    if (!Files.isExecutable(bin)) {
      fail(
          "Jaeger is not installed at "
              + bin
              + ". Run `bash scripts/install-jaeger.sh` (needs Go and the Go module proxy), or"
              + " point UNSTALL_JAEGER_BIN (system property or environment) at a jaeger v2 binary.");
    }
    return bin;
  }

  static int freePort() throws IOException {
    try (ServerSocket s = new ServerSocket(0)) {
      s.setReuseAddress(true);
      return s.getLocalPort();
    }
  }

  static String jaegerConfig(int otlpHttp, int queryHttp, int queryGrpc) {
    return String.join(
        "\n",
        "service:",
        "  extensions: [jaeger_storage, jaeger_query]",
        "  pipelines:",
        "    traces:",
        "      receivers: [otlp]",
        "      processors: [batch]",
        "      exporters: [jaeger_storage_exporter]",
        "  telemetry:",
        "    metrics:",
        "      level: none",
        "    logs:",
        "      level: warn",
        "extensions:",
        "  jaeger_query:",
        "    storage:",
        "      traces: mem",
        "    http:",
        "      endpoint: 127.0.0.1:" + queryHttp,
        "    grpc:",
        "      endpoint: 127.0.0.1:" + queryGrpc,
        "  jaeger_storage:",
        "    backends:",
        "      mem:",
        "        memory:",
        "          max_traces: 10000",
        "receivers:",
        "  otlp:",
        "    protocols:",
        "      http:",
        "        endpoint: 127.0.0.1:" + otlpHttp,
        "processors:",
        "  batch:",
        "exporters:",
        "  jaeger_storage_exporter:",
        "    trace_storage: mem",
        "");
  }

  @Test
  void dl4jTrainingStallsShowUpInJaegerAndInTheProfile() throws Exception {
    Path jaeger = jaegerBinary();
    int otlpHttp = freePort();
    int queryHttp = freePort();
    int queryGrpc = freePort();
    Path config = dir.resolve("jaeger.yaml");
    Files.writeString(config, jaegerConfig(otlpHttp, queryHttp, queryGrpc));
    ProcessBuilder pb =
        new ProcessBuilder(jaeger.toString(), "--config", config.toString())
            .redirectErrorStream(true)
            .redirectOutput(dir.resolve("jaeger.log").toFile());
    pb.environment().put("OTEL_TRACES_EXPORTER", "none"); // Jaeger's own telemetry
    Process jaegerProcess = pb.start();
    HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(2)).build();
    try {
      String query = "http://127.0.0.1:" + queryHttp;
      awaitJaeger(http, query, jaegerProcess);

      Path data = Files.createDirectories(dir.resolve("data"));
      List<Path> files = Dl4jTrainer.writeData(data, BATCHES);
      String service = "unstall-e2e-" + ProcessHandle.current().pid();
      Map<String, String> env = new HashMap<>();
      env.put("OTEL_SERVICE_NAME", service);
      env.put("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:" + otlpHttp);
      env.put("OTEL_BSP_SCHEDULE_DELAY", "200");
      String classpath =
          ForkedJvm.property("unstall.test.classes")
              + File.pathSeparator
              + Files.readString(Paths.get(ForkedJvm.property("unstall.trainer.classpath"))).trim();
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
      List<JsonNode> stalls = awaitStallSpans(http, query, service, BATCHES * EPOCHS);
      assertEquals(BATCHES * EPOCHS, stalls.size());
      for (JsonNode span : stalls) {
        Map<String, JsonNode> tags = tags(span);
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
    } finally {
      jaegerProcess.destroy();
      if (!jaegerProcess.waitFor(10, TimeUnit.SECONDS)) {
        jaegerProcess.destroyForcibly();
      }
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

  static void awaitJaeger(HttpClient http, String query, Process p) {
    await("Jaeger answering on " + query).atMost(Duration.ofSeconds(60)).pollInterval(Duration.ofMillis(200))
        .until(() -> {
          if (!p.isAlive()) {
            fail("Jaeger exited with " + p.exitValue() + " before it was ready; see jaeger.log");
          }
          try {
            return http.send(HttpRequest.newBuilder(URI.create(query + "/api/services")).build(),
                HttpResponse.BodyHandlers.ofString()).statusCode() == 200;
          } catch (IOException notYet) {
            return false; // not listening yet
          }
        });
  }

  /** Polls Jaeger until it holds {@code expected} stall spans for the service (or 60 s pass). */
  static List<JsonNode> awaitStallSpans(HttpClient http, String query, String service, int expected) {
    List<JsonNode> stalls = new ArrayList<>();
    AtomicReference<String> last = new AtomicReference<>("");
    try {
      await("stall spans of " + service + " in Jaeger").atMost(Duration.ofSeconds(60))
          .pollInterval(Duration.ofMillis(250))
          .until(() -> {
            HttpResponse<String> r = http.send(
                HttpRequest.newBuilder(URI.create(query + "/api/traces?service=" + service + "&limit=1000")).build(),
                HttpResponse.BodyHandlers.ofString(StandardCharsets.UTF_8));
            last.set(r.body());
            stalls.clear();
            if (r.statusCode() != 200) {
              return false;
            }
            for (JsonNode trace : ForkedJvm.JSON.readTree(r.body()).path("data")) {
              for (JsonNode span : trace.get("spans")) {
                if (span.get("operationName").asText().equals("unstall.stall")) {
                  stalls.add(span);
                }
              }
            }
            return stalls.size() >= expected;
          });
    } catch (ConditionTimeoutException e) {
      fail("Jaeger has " + stalls.size() + " of " + expected + " stall spans; last answer: "
          + last.get().substring(0, Math.min(2000, last.get().length())));
    }
    return stalls;
  }

  static Map<String, JsonNode> tags(JsonNode span) {
    Map<String, JsonNode> m = new HashMap<>();
    for (JsonNode t : span.get("tags")) {
      m.put(t.get("key").asText(), t.get("value"));
    }
    return m;
  }
}
