package io.unstall.agent.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The unstall agent beside the official OpenTelemetry Java agent (2.22.0) in one Deeplearning4j
 * training JVM. The official agent traces {@code Dl4jTrainer.trainEpoch} and
 * {@code Dl4jTrainer.checkpoint} (its method instrumentation); the application has no
 * OpenTelemetry API of its own. Both agents export to one real Jaeger, and every
 * {@code unstall.stall} span must be in the trace of its epoch's span, with that span as parent,
 * as must every {@code unstall.checkpoint} span with its checkpoint method's span.
 */
class CoexistenceIT {
  static final int BATCHES = 4;
  static final int EPOCHS = 2;
  static final String OFFICIAL_SCOPE = "io.opentelemetry.methods";

  @TempDir Path dir;

  @Test
  void bothAgentsSpansFormOneTraceWithTheOfficialSpanAsParent() throws Exception {
    Path officialAgent = Paths.get(ForkedJvm.property("unstall.otel.javaagent"));
    assertTrue(Files.isRegularFile(officialAgent), "missing " + officialAgent + " (mvn verify copies it)");
    try (Jaeger jaeger = Jaeger.start(dir)) {
      Path data = Files.createDirectories(dir.resolve("data"));
      Dl4jTrainer.writeData(data, BATCHES);
      Path checkpoints = Files.createDirectories(dir.resolve("checkpoints"));
      String service = "unstall-coexist-" + ProcessHandle.current().pid();
      Map<String, String> env = new HashMap<>(jaeger.exporterEnv(service));
      env.put("OTEL_METRICS_EXPORTER", "none");
      env.put("OTEL_LOGS_EXPORTER", "none");
      String trainer = Dl4jTrainer.class.getName();
      String classpath = ForkedJvm.trainerClasspath();
      ForkedJvm run =
          ForkedJvm.run(
              List.of(
                  "-javaagent:" + officialAgent,
                  "-Dotel.instrumentation.methods.include=" + trainer + "[trainEpoch,checkpoint]"),
              "profile=" + dir.resolve("profile"),
              classpath,
              env,
              dir,
              trainer,
              data.toString(),
              String.valueOf(BATCHES),
              String.valueOf(EPOCHS),
              checkpoints.toString());
      assertEquals(0, run.exitCode, run.toString());

      jaeger.awaitTraces(service, "unstall.stall", BATCHES * EPOCHS);
      List<JsonNode> traces = jaeger.awaitTraces(service, "unstall.checkpoint", EPOCHS);
      assertParentIs(traces, "unstall.stall", "Dl4jTrainer.trainEpoch", BATCHES);
      assertParentIs(traces, "unstall.checkpoint", "Dl4jTrainer.checkpoint", 1);
    }
  }

  /**
   * Every span named {@code child} has, in its own trace, a CHILD_OF parent named {@code parent}
   * from the official agent; each such parent has {@code perParent} of them, and the two come
   * from different instrumentation scopes (the two agents).
   */
  static void assertParentIs(List<JsonNode> traces, String child, String parent, int perParent) {
    int parents = 0;
    int children = 0;
    for (JsonNode trace : traces) {
      Map<String, JsonNode> byId = new HashMap<>();
      trace.get("spans").forEach(s -> byId.put(s.get("spanID").asText(), s));
      Map<String, Integer> childrenOf = new HashMap<>();
      for (JsonNode span : trace.get("spans")) {
        String name = span.get("operationName").asText();
        if (name.equals(parent)) {
          parents++;
          assertEquals(OFFICIAL_SCOPE, Jaeger.tags(span).get("otel.scope.name").asText(), span.toString());
        }
        if (!name.equals(child)) {
          continue;
        }
        children++;
        assertEquals("io.unstall.agent", Jaeger.tags(span).get("otel.scope.name").asText(), span.toString());
        JsonNode refs = span.get("references");
        assertEquals(1, refs.size(), span.toString());
        assertEquals("CHILD_OF", refs.get(0).get("refType").asText());
        assertEquals(trace.get("traceID").asText(), refs.get(0).get("traceID").asText());
        JsonNode p = byId.get(refs.get(0).get("spanID").asText());
        assertTrue(p != null, "the parent of " + child + " is not in its trace: " + trace);
        assertEquals(parent, p.get("operationName").asText(), p.toString());
        childrenOf.merge(p.get("spanID").asText(), 1, Integer::sum);
      }
      childrenOf.values().forEach(n -> assertEquals(perParent, n, "children per " + parent));
    }
    assertEquals(EPOCHS, parents, parent + " spans");
    assertEquals(EPOCHS * perParent, children, child + " spans");
  }
}
