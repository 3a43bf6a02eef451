package io.unstall.tests;

import static org.awaitility.Awaitility.await;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.unstall.flight.protocol.FetchTicket;
import java.io.IOException;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.apache.arrow.flight.CallHeaders;
import org.apache.arrow.flight.FlightCallHeaders;
import org.apache.arrow.flight.FlightClient;
import org.apache.arrow.flight.FlightStream;
import org.apache.arrow.flight.HeaderCallOption;
import org.apache.arrow.flight.Location;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.awaitility.core.ConditionTimeoutException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The sidecar as users run it: {@code java -jar unstall-sidecar.jar serve}, in its own process. */
class SidecarProcessIT {
  static final ObjectMapper JSON = new ObjectMapper();
  static final Path JAR = Path.of(System.getProperty("unstall.sidecar.jar", "../sidecar/target/unstall-sidecar.jar"));

  @TempDir Path dir;

  private Process start(String... args) throws IOException {
    return start(dir.resolve("home"), dir.resolve("log"), args);
  }

  private Process start(Path home, Path log, String... args) throws IOException {
    List<String> cmd = new ArrayList<>(List.of(javaBin(), "-jar", JAR.toString(), "serve", "--home", home.toString()));
    cmd.addAll(List.of(args));
    return new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(log.toFile()).start();
  }

  private static String javaBin() {
    return Path.of(System.getProperty("java.home"), "bin", "java").toString();
  }

  private String log() throws IOException {
    return Files.readString(dir.resolve("log"));
  }

  private String awaitLog(String needle) throws Exception {
    try {
      await("the sidecar logging '" + needle + "'").atMost(Duration.ofSeconds(60)).pollInterval(Duration.ofMillis(50))
          .until(() -> Files.exists(dir.resolve("log")) && log().contains(needle));
    } catch (ConditionTimeoutException e) {
      throw new AssertionError("sidecar never logged '" + needle + "'; log:\n" + log());
    }
    return log();
  }

  @Test
  void servesLogsWhereItListensAndStopsCleanlyOnSigterm() throws Exception {
    Path data = dir.resolve("data/c0/x.png");
    Files.createDirectories(data.getParent());
    Files.write(data, new byte[] {1, 2, 3});
    Process p = start("--port", "0", "--cache-capacity", "1MiB", "--memory-budget", "64MiB");
    String log = awaitLog("unstall sidecar listening: flight=grpc+tcp://127.0.0.1:");
    assertTrue(log.contains("control=127.0.0.1:"), log);

    Path state = dir.resolve("home/sidecar.json");
    assertEquals("rw-------", PosixFilePermissions.toString(Files.getPosixFilePermissions(state)));
    assertEquals("rw-------", PosixFilePermissions.toString(Files.getPosixFilePermissions(dir.resolve("home/token"))));
    JsonNode st = JSON.readTree(state.toFile());
    assertEquals(p.pid(), st.get("pid").asLong());
    String token = Files.readString(dir.resolve("home/token")).trim();
    assertTrue(!log.contains(token), "the token is never logged");

    // Control plane: Py4J's auth handshake on the loopback port accepts the token and refuses anything else.
    assertEquals("!yv", py4jAuth(st.get("control_port").asInt(), token));
    assertTrue(py4jAuth(st.get("control_port").asInt(), "not-the-token").startsWith("!xs"));

    try (BufferAllocator alloc = new RootAllocator();
        FlightClient c = FlightClient.builder(alloc, new Location(st.get("flight").asText())).build()) {
      CallHeaders h = new FlightCallHeaders();
      h.insert("authorization", "Bearer " + token);
      var err = org.junit.jupiter.api.Assertions.assertThrows(
          org.apache.arrow.flight.FlightRuntimeException.class,
          () -> {
            try (FlightStream s =
                c.getStream(new FetchTicket("data", 0, new long[] {0}).toTicket(), new HeaderCallOption(h))) {
              s.next();
            }
          });
      assertTrue(err.getMessage().contains("unknown dataset 'data'; no datasets are registered"), err.getMessage());
    }

    p.destroy(); // SIGTERM
    assertTrue(p.waitFor(30, TimeUnit.SECONDS), "stops within 30 s of SIGTERM");
    assertTrue(awaitLog("unstall sidecar stopped").contains("unstall sidecar stopping"));
    assertTrue(Files.notExists(state), "state file removed on clean shutdown");
  }

  /** Py4J's first command is {@code A\n<token>\n}; the server answers {@code !yv} or an error. */
  private static String py4jAuth(int port, String token) throws IOException {
    try (java.net.Socket s = new java.net.Socket(InetAddress.getLoopbackAddress(), port)) {
      s.getOutputStream().write(("A\n" + token + "\n").getBytes(java.nio.charset.StandardCharsets.UTF_8));
      s.getOutputStream().flush();
      return new java.io.BufferedReader(new java.io.InputStreamReader(s.getInputStream())).readLine();
    }
  }

  @Test
  void refusesATakenPortWithAClearMessage() throws Exception {
    try (ServerSocket taken = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
      Process p = start("--port", Integer.toString(taken.getLocalPort()), "--memory-budget", "64MiB",
          "--cache-capacity", "1MiB");
      assertTrue(p.waitFor(60, TimeUnit.SECONDS));
      assertEquals(3, p.exitValue(), log());
      assertTrue(log().contains("Flight port " + taken.getLocalPort() + " on 127.0.0.1 is already in use"), log());
      assertTrue(Files.notExists(dir.resolve("home/sidecar.json")));
    }
  }

  @Test
  void refusesASecondSidecarOnTheSameHomeOrDiskCacheDirNamingTheHolder() throws Exception {
    Path disk = dir.resolve("disk");
    String[] opts = {"--port", "0", "--memory-budget", "64MiB", "--cache-capacity", "1MiB", "--disk-cache-dir",
        disk.toString(), "--disk-cache-capacity", "1MiB"};
    Process first = start(opts);
    try {
      awaitLog("unstall sidecar listening");
      Process sameHome = start(dir.resolve("home"), dir.resolve("log-home"), opts);
      assertTrue(sameHome.waitFor(60, TimeUnit.SECONDS));
      String log = Files.readString(dir.resolve("log-home"));
      assertEquals(3, sameHome.exitValue(), log);
      assertTrue(
          log.contains("sidecar home " + dir.resolve("home") + " is in use by another process (pid " + first.pid()),
          log);

      Process sameDisk = start(dir.resolve("home2"), dir.resolve("log-disk"), opts);
      assertTrue(sameDisk.waitFor(60, TimeUnit.SECONDS));
      log = Files.readString(dir.resolve("log-disk"));
      assertEquals(3, sameDisk.exitValue(), log);
      assertTrue(log.contains("disk cache directory " + disk + " is in use by another process (pid " + first.pid()),
          log);
      assertTrue(log.contains("give each sidecar its own --disk-cache-dir"), log);

      assertTrue(first.isAlive());
      assertEquals(first.pid(), JSON.readTree(dir.resolve("home/sidecar.json").toFile()).get("pid").asLong(),
          "the refused sidecar left the first one's state file alone");
    } finally {
      first.destroy();
      assertTrue(first.waitFor(30, TimeUnit.SECONDS));
    }
  }

  @Test
  void refusesABadConfigWithAClearMessage() throws Exception {
    Process p = start("--port", "0", "--memory-budget", "a-lot");
    assertTrue(p.waitFor(60, TimeUnit.SECONDS));
    assertEquals(2, p.exitValue(), log());
    assertTrue(log().contains("invalid value for option '--memory-budget': 'a-lot' is not a size"), log());
  }

  @Test
  void helpListsTheOptionsWithDefaults() throws Exception {
    Process p = new ProcessBuilder(javaBin(), "-jar", JAR.toString(), "serve", "--help")
        .redirectErrorStream(true).start();
    String out = new String(p.getInputStream().readAllBytes());
    assertTrue(p.waitFor(60, TimeUnit.SECONDS));
    assertEquals(0, p.exitValue());
    String flat = out.replaceAll("\\s+", " ");
    assertTrue(flat.contains("Flight port (default 8815; 0 picks a free one)"), out);
    assertTrue(flat.contains("Bytes the never-evict cache may hold (default 1GiB; 0 disables it)"), out);
  }
}
