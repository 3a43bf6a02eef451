package io.unstall.agent.it;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.File;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import java.util.stream.Stream;

/** Runs a main class in a new JVM with {@code -javaagent:target/unstall-agent.jar=OPTIONS}. */
final class ForkedJvm {
  static final ObjectMapper JSON = new ObjectMapper();

  final int exitCode;
  final String stdout;
  final String stderr;

  private ForkedJvm(int exitCode, String stdout, String stderr) {
    this.exitCode = exitCode;
    this.stdout = stdout;
    this.stderr = stderr;
  }

  static String property(String name) {
    String v = System.getProperty(name);
    if (v == null) {
      throw new IllegalStateException("system property " + name + " is not set (run with mvn verify)");
    }
    return v;
  }

  static Path agentJar() {
    Path jar = Paths.get(property("unstall.agent.jar"));
    if (!Files.isRegularFile(jar)) {
      throw new IllegalStateException("agent jar missing: " + jar + " (mvn package builds it)");
    }
    return jar;
  }

  /** Test classes plus the application's own OpenTelemetry API 1.30 jars. */
  static String appClasspath() throws IOException {
    List<String> cp = new ArrayList<>();
    cp.add(property("unstall.test.classes"));
    try (Stream<Path> libs = Files.list(Paths.get(property("unstall.app.libs")))) {
      libs.sorted().forEach(p -> cp.add(p.toString()));
    }
    return String.join(File.pathSeparator, cp);
  }

  /** Test classes plus the Deeplearning4j training classpath (no OpenTelemetry, no Byte Buddy). */
  static String trainerClasspath() throws IOException {
    return property("unstall.test.classes")
        + File.pathSeparator
        + Files.readString(Paths.get(property("unstall.trainer.classpath"))).trim();
  }

  static ForkedJvm run(
      String agentOptions, String classpath, Map<String, String> env, Path workDir, String... mainAndArgs)
      throws IOException, InterruptedException {
    return run(List.of(), agentOptions, classpath, env, workDir, mainAndArgs);
  }

  /** As above, with {@code jvmArgs} (for example another -javaagent) before the unstall agent. */
  static ForkedJvm run(
      List<String> jvmArgs, String agentOptions, String classpath, Map<String, String> env,
      Path workDir, String... mainAndArgs)
      throws IOException, InterruptedException {
    List<String> cmd = new ArrayList<>();
    cmd.add(Paths.get(System.getProperty("java.home"), "bin", "java").toString());
    cmd.add("-Xshare:off");
    cmd.addAll(jvmArgs);
    cmd.add("-javaagent:" + agentJar() + (agentOptions.isEmpty() ? "" : "=" + agentOptions));
    cmd.add("-cp");
    cmd.add(classpath);
    cmd.addAll(List.of(mainAndArgs));
    ProcessBuilder pb = new ProcessBuilder(cmd).directory(workDir.toFile());
    pb.environment().keySet().removeIf(k -> k.startsWith("OTEL_"));
    pb.environment().putAll(env);
    Path out = workDir.resolve("stdout.txt");
    Path err = workDir.resolve("stderr.txt");
    pb.redirectOutput(out.toFile()).redirectError(err.toFile());
    Process p = pb.start();
    if (!p.waitFor(5, TimeUnit.MINUTES)) {
      p.destroyForcibly();
      throw new IllegalStateException("forked JVM did not finish: " + cmd);
    }
    return new ForkedJvm(
        p.exitValue(),
        Files.readString(out, StandardCharsets.UTF_8),
        Files.readString(err, StandardCharsets.UTF_8));
  }

  static List<JsonNode> readSpans(Path file) throws IOException {
    if (!Files.exists(file)) {
      return List.of();
    }
    List<JsonNode> spans = new ArrayList<>();
    for (String line : Files.readAllLines(file, StandardCharsets.UTF_8)) {
      if (!line.isBlank()) {
        spans.add(JSON.readTree(line));
      }
    }
    return spans;
  }

  static List<JsonNode> stallSpans(Path file, String iteratorClass) throws IOException {
    return readSpans(file).stream()
        .filter(s -> s.get("name").asText().equals("unstall.stall"))
        .filter(s -> s.get("attributes").get("unstall.iterator.class").asText().equals(iteratorClass))
        .collect(Collectors.toList());
  }

  static JsonNode fileEntry(JsonNode profile, Path file) {
    String path = file.toAbsolutePath().toString();
    for (JsonNode f : profile.get("files")) {
      if (f.get("path").asText().equals(path)) {
        return f;
      }
    }
    throw new AssertionError("no profile entry for " + path + " in " + profile.get("files"));
  }

  @Override
  public String toString() {
    return "exit " + exitCode + "\n--- stdout\n" + stdout + "\n--- stderr\n" + stderr;
  }
}
