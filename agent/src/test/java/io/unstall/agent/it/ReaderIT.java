package io.unstall.agent.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.jar.JarEntry;
import java.util.jar.JarFile;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Each JDK reader in a forked JVM with the agent: the exact stall spans (through the agent's
 * {@code spans.file} test exporter) and the exact per-file numbers of the I/O profile.
 */
class ReaderIT {
  static final String ITERATOR = ReaderApp.Batches.class.getName();

  @TempDir Path dir;

  record Run(ForkedJvm jvm, List<JsonNode> spans, JsonNode profile, Path data) {
    JsonNode attrs(int i) {
      return spans.get(i).get("attributes");
    }

    JsonNode file() {
      return ForkedJvm.fileEntry(profile, data);
    }
  }

  Run run(String scenario, int fileSize, String extraOptions) throws Exception {
    Path data = dir.resolve(scenario + ".bin");
    byte[] bytes = new byte[fileSize];
    new Random(42).nextBytes(bytes);
    Files.write(data, bytes);
    Path spans = dir.resolve("spans.jsonl");
    String options =
        "method=" + ITERATOR + "#next"
            + ",spans.file=" + spans
            + ",profile=" + dir.resolve("profile")
            + ",otel.traces.exporter=none"
            + extraOptions;
    ForkedJvm jvm =
        ForkedJvm.run(
            options, ForkedJvm.appClasspath(), Map.of(), dir, ReaderApp.class.getName(),
            scenario, data.toString());
    assertEquals(0, jvm.exitCode, jvm.toString());
    assertTrue(jvm.stdout.contains("done " + scenario), jvm.toString());
    JsonNode profile = ForkedJvm.JSON.readTree(dir.resolve("profile.json").toFile());
    assertTrue(Files.readString(dir.resolve("profile.txt")).contains("unstall I/O profile"));
    return new Run(jvm, ForkedJvm.stallSpans(spans, ITERATOR), profile, data);
  }

  static void assertWindow(JsonNode attrs, long bytes, long calls, long files) {
    assertEquals(bytes, attrs.get("unstall.io.bytes").asLong(), attrs.toString());
    assertEquals(calls, attrs.get("unstall.io.read_calls").asLong(), attrs.toString());
    assertEquals(files, attrs.get("unstall.io.files").asLong(), attrs.toString());
    assertEquals(bytes, attrs.get("unstall.io.process_bytes").asLong(), attrs.toString());
    assertEquals(ITERATOR, attrs.get("unstall.iterator.class").asText());
    assertEquals("next", attrs.get("unstall.iterator.method").asText());
    assertEquals("main", attrs.get("thread.name").asText());
    assertTrue(attrs.get("unstall.stall.duration_ns").asLong() > 0);
    assertTrue(attrs.get("unstall.io.read_time_ns").asLong() > 0);
  }

  @Test
  void fileInputStreamIn4KiBReads() throws Exception {
    Run r = run("fis", 65536, "");
    assertEquals(5, r.spans.size(), r.jvm.toString());
    for (int i = 0; i < 5; i++) {
      assertWindow(r.attrs(i), 65536, 17, 1); // 16 reads of 4 KiB and the end-of-file read
      assertEquals("UNSET", r.spans.get(i).get("status").asText());
      assertNull(r.spans.get(i).get("parentSpanId").textValue());
      assertEquals("unknown_service:java", r.spans.get(i).get("resource").get("service.name").asText());
    }
    JsonNode f = r.file();
    assertEquals(327680, f.get("bytes").asLong());
    assertEquals(85, f.get("read_calls").asLong());
    assertEquals(80, f.get("data_reads").asLong());
    assertEquals(5, f.get("opens").asLong());
    assertEquals(80, f.get("request_size_histogram").get("1K_10K").asLong());
    assertEquals(4096, f.get("min_request_bytes").asLong());
    assertEquals(4096, f.get("max_request_bytes").asLong());
    assertEquals(262144, f.get("bytes_reread").asLong());
    assertEquals(65536, f.get("unique_bytes").asLong());
    assertEquals(76.0 / 80, f.get("consecutive_fraction").asDouble(), 1e-6);
    assertEquals(65536, f.get("max_offset").asLong());
    List<String> rules = new ArrayList<>();
    r.profile.get("suggestions").forEach(s -> rules.add(s.get("rule").asText()));
    assertTrue(rules.contains("small_requests"), rules.toString());
    assertTrue(rules.contains("reread_cacheable"), rules.toString());
    assertEquals(5, r.profile.get("stalls").get("count").asLong());
    assertEquals(327680, r.profile.get("stalls").get("io_bytes").asLong());
  }

  @Test
  void fileInputStreamSingleBytes() throws Exception {
    Run r = run("fis-single", 40960, "");
    assertEquals(1, r.spans.size());
    assertWindow(r.attrs(0), 100, 100, 1);
    JsonNode f = r.file();
    assertEquals(100, f.get("bytes").asLong());
    assertEquals(100, f.get("request_size_histogram").get("0_100").asLong());
    assertEquals(1.0, f.get("consecutive_fraction").asDouble(), 1e-9);
  }

  @Test
  void randomAccessFileSeeksBackwards() throws Exception {
    Run r = run("raf", 65536, "");
    assertEquals(4, r.spans.size());
    for (int i = 0; i < 4; i++) {
      assertWindow(r.attrs(i), 16384, 1, 1);
    }
    JsonNode f = r.file();
    assertEquals(65536, f.get("bytes").asLong());
    assertEquals(4, f.get("data_reads").asLong());
    assertEquals(1, f.get("opens").asLong());
    assertEquals(4, f.get("request_size_histogram").get("10K_100K").asLong());
    assertEquals(0, f.get("bytes_reread").asLong());
    assertEquals(0.0, f.get("consecutive_fraction").asDouble(), 1e-9);
    assertEquals(0.25, f.get("sequential_fraction").asDouble(), 1e-9);
  }

  @Test
  void fileChannelStreamingPositionalAndScatter() throws Exception {
    Run r = run("channel", 32768, "");
    assertEquals(3, r.spans.size());
    assertWindow(r.attrs(0), 32768, 5, 1); // 4 reads of 8 KiB and end of file
    assertWindow(r.attrs(1), 16384, 2, 1); // read(buf, 0) and read(buf, 16384)
    assertWindow(r.attrs(2), 8192, 1, 1); // position(4096) then one scatter read
    JsonNode f = r.file();
    assertEquals(57344, f.get("bytes").asLong());
    assertEquals(8, f.get("read_calls").asLong());
    assertEquals(24576, f.get("bytes_reread").asLong());
    assertEquals(32768, f.get("unique_bytes").asLong());
    assertEquals(4.0 / 7, f.get("consecutive_fraction").asDouble(), 1e-6);
    assertEquals(5.0 / 7, f.get("sequential_fraction").asDouble(), 1e-6);
  }

  @Test
  void filesHelpersReadThroughTheChannel() throws Exception {
    Run r = run("files", 40960, "");
    assertEquals(2, r.spans.size());
    // JDK 17: readAllBytes reads the size it found, then once more to see end of file.
    assertWindow(r.attrs(0), 40960, 2, 1);
    // newInputStream: 5 reads of 8 KiB and end of file.
    assertWindow(r.attrs(1), 40960, 6, 1);
    assertEquals(81920, r.file().get("bytes").asLong());
    assertEquals(40960, r.file().get("bytes_reread").asLong());
  }

  @Test
  void stallSpanIsAChildOfTheApplicationsCurrentSpan() throws Exception {
    Run r = run("parent", 8192, "");
    assertEquals(1, r.spans.size());
    assertEquals(ReaderApp.TRACE_ID, r.spans.get(0).get("traceId").asText());
    assertEquals(ReaderApp.PARENT_SPAN_ID, r.spans.get(0).get("parentSpanId").asText());
    assertWindow(r.attrs(0), 8192, 3, 1);
  }

  @Test
  void applicationExceptionsAreUnchangedAndMarkTheSpan() throws Exception {
    Run r = run("error", 65536, ",otel.service.name=reader-app");
    assertTrue(r.jvm.stdout.contains("caught java.lang.IllegalStateException boom-1"), r.jvm.toString());
    assertEquals(3, r.spans.size());
    assertEquals("UNSET", r.spans.get(0).get("status").asText());
    assertEquals("ERROR", r.spans.get(1).get("status").asText());
    assertEquals(
        "java.lang.IllegalStateException", r.attrs(1).get("exception.type").asText());
    assertWindow(r.attrs(1), 65536, 17, 1);
    assertEquals("reader-app", r.spans.get(0).get("resource").get("service.name").asText());
  }

  @Test
  void anInternalFailureIsLoggedOnceAndTheAgentGoesQuiet() throws Exception {
    Run r = run("failure", 65536, ",test.fail_at_stall=2");
    assertEquals(1, r.spans.size(), "only the stall before the failure is exported");
    long failures =
        r.jvm.stderr.lines().filter(l -> l.startsWith("[unstall-agent] internal failure")).count();
    assertEquals(1, failures, r.jvm.toString());
    // Batches 1 and 2 were recorded; after the failure nothing is.
    assertEquals(131072, r.file().get("bytes").asLong());
  }

  @Test
  void agentJarHasOnlyRelocatedDependencies() throws IOException {
    List<String> foreign = new ArrayList<>();
    try (JarFile jar = new JarFile(ForkedJvm.agentJar().toFile())) {
      for (JarEntry e : java.util.Collections.list(jar.entries())) {
        String n = e.getName();
        if (n.endsWith(".class")
            && !n.startsWith("io/unstall/agent/")
            && !n.startsWith("META-INF/versions/")) {
          foreign.add(n);
        }
        if (n.startsWith("META-INF/versions/") && n.endsWith(".class")
            && !n.matches("META-INF/versions/\\d+/io/unstall/agent/.*")) {
          foreign.add(n);
        }
      }
      assertEquals(
          "io.unstall.agent.UnstallAgent",
          jar.getManifest().getMainAttributes().getValue("Premain-Class"));
    }
    assertEquals(List.of(), foreign);
  }
}
