package io.unstall.agent.it;

import static org.awaitility.Awaitility.await;
import static org.junit.jupiter.api.Assertions.fail;

import com.fasterxml.jackson.databind.JsonNode;
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

/**
 * A real Jaeger v2 all-in-one (in-memory) on free ports, started from a generated config, and its
 * HTTP query API. The binary comes from {@code bash scripts/install-jaeger.sh}; its path is the
 * system property or environment variable {@code UNSTALL_JAEGER_BIN}, by default
 * {@code ${UNSTALL_CACHE:-~/.cache/unstall}/bin/jaeger}. A missing Jaeger fails the test.
 */
final class Jaeger implements AutoCloseable {
  final int otlpHttp;
  final String query;
  private final Process process;
  private final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(2)).build();

  private Jaeger(int otlpHttp, String query, Process process) {
    this.otlpHttp = otlpHttp;
    this.query = query;
    this.process = process;
  }

  /** Starts Jaeger with its config and log in {@code dir} and waits until its API answers. */
  static Jaeger start(Path dir) throws IOException {
    Path bin = binary();
    int otlpHttp = freePort();
    int queryHttp = freePort();
    int queryGrpc = freePort();
    Path config = dir.resolve("jaeger.yaml");
    Files.writeString(config, config(otlpHttp, queryHttp, queryGrpc));
    ProcessBuilder pb =
        new ProcessBuilder(bin.toString(), "--config", config.toString())
            .redirectErrorStream(true)
            .redirectOutput(dir.resolve("jaeger.log").toFile());
    pb.environment().put("OTEL_TRACES_EXPORTER", "none"); // Jaeger's own telemetry
    Jaeger j = new Jaeger(otlpHttp, "http://127.0.0.1:" + queryHttp, pb.start());
    try {
      j.awaitReady();
    } catch (RuntimeException | Error e) {
      j.close();
      throw e;
    }
    return j;
  }

  /** Environment for an exporting JVM: service name and this Jaeger's OTLP/HTTP endpoint. */
  Map<String, String> exporterEnv(String service) {
    Map<String, String> env = new HashMap<>();
    env.put("OTEL_SERVICE_NAME", service);
    env.put("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:" + otlpHttp);
    env.put("OTEL_BSP_SCHEDULE_DELAY", "200");
    return env;
  }

  static Path binary() {
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

  static String config(int otlpHttp, int queryHttp, int queryGrpc) {
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

  private void awaitReady() {
    await("Jaeger answering on " + query).atMost(Duration.ofSeconds(60)).pollInterval(Duration.ofMillis(200))
        .until(() -> {
          if (!process.isAlive()) {
            fail("Jaeger exited with " + process.exitValue() + " before it was ready; see jaeger.log");
          }
          try {
            return http.send(HttpRequest.newBuilder(URI.create(query + "/api/services")).build(),
                HttpResponse.BodyHandlers.ofString()).statusCode() == 200;
          } catch (IOException notYet) {
            return false; // not listening yet
          }
        });
  }

  /**
   * Polls Jaeger until the service's traces hold at least {@code expected} spans named
   * {@code operation} (or 60 s pass); returns the traces of that last answer.
   */
  List<JsonNode> awaitTraces(String service, String operation, int expected) {
    List<JsonNode> traces = new ArrayList<>();
    AtomicReference<String> last = new AtomicReference<>("");
    try {
      await(operation + " spans of " + service + " in Jaeger").atMost(Duration.ofSeconds(60))
          .pollInterval(Duration.ofMillis(250))
          .until(() -> {
            HttpResponse<String> r = http.send(
                HttpRequest.newBuilder(URI.create(query + "/api/traces?service=" + service + "&limit=1000")).build(),
                HttpResponse.BodyHandlers.ofString(StandardCharsets.UTF_8));
            last.set(r.body());
            traces.clear();
            if (r.statusCode() != 200) {
              return false;
            }
            ForkedJvm.JSON.readTree(r.body()).path("data").forEach(traces::add);
            return spans(traces, operation).size() >= expected;
          });
    } catch (ConditionTimeoutException e) {
      fail("Jaeger has " + spans(traces, operation).size() + " of " + expected + " " + operation
          + " spans; last answer: " + last.get().substring(0, Math.min(2000, last.get().length())));
    }
    return traces;
  }

  static List<JsonNode> spans(List<JsonNode> traces, String operation) {
    List<JsonNode> out = new ArrayList<>();
    for (JsonNode trace : traces) {
      for (JsonNode span : trace.get("spans")) {
        if (span.get("operationName").asText().equals(operation)) {
          out.add(span);
        }
      }
    }
    return out;
  }

  static Map<String, JsonNode> tags(JsonNode span) {
    Map<String, JsonNode> m = new HashMap<>();
    for (JsonNode t : span.get("tags")) {
      m.put(t.get("key").asText(), t.get("value"));
    }
    return m;
  }

  @Override
  public void close() {
    process.destroy();
    try {
      if (!process.waitFor(10, TimeUnit.SECONDS)) {
        process.destroyForcibly();
      }
    } catch (InterruptedException e) {
      process.destroyForcibly();
      Thread.currentThread().interrupt();
    }
  }
}
