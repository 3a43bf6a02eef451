package io.unstall.sidecar;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import io.unstall.flight.Bounds;
import org.junit.jupiter.api.Test;
import picocli.CommandLine;
import org.junit.jupiter.api.io.TempDir;

/** Bad configuration is refused before anything starts, with a message naming the option. */
class ServeCommandTest {
  @TempDir Path home;

  private String runExpecting(int code, String... args) {
    PrintStream old = System.err;
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    System.setErr(new PrintStream(err, true));
    try {
      assertEquals(code, Main.run(args), err::toString);
    } finally {
      System.setErr(old);
    }
    return err.toString();
  }

  @Test
  void badSizeNamesTheOption() {
    String err = runExpecting(2, "serve", "--home", home.toString(), "--cache-capacity", "lots");
    assertTrue(err.contains("invalid value for option '--cache-capacity': 'lots' is not a size"), err);
  }

  @Test
  void aClusterNeedsItsBindAndToken() throws Exception {
    String err = runExpecting(2, "serve", "--home", home.toString(), "--cluster-members", "10.0.0.1,10.0.0.2");
    assertTrue(err.contains("--cluster-members needs --cluster-bind"), err);
    err = runExpecting(2, "serve", "--home", home.toString(), "--cluster-members", "10.0.0.1",
        "--cluster-bind", "127.0.0.1");
    assertTrue(err.contains("--cluster-members needs --cluster-token FILE"), err);
    Path token = home.resolve("cluster-token");
    Files.writeString(token, "0123456789abcdef0123");
    Files.setPosixFilePermissions(token, java.nio.file.attribute.PosixFilePermissions.fromString("rw-r--r--"));
    err = runExpecting(2, "serve", "--home", home.toString(), "--cluster-members", "10.0.0.1",
        "--cluster-bind", "127.0.0.1", "--cluster-token", token.toString());
    assertTrue(err.contains("cluster token file " + token + " is readable by others"), err);
  }

  @Test
  void aPrepWorkerNeedsACluster() {
    String err = runExpecting(2, "serve", "--home", home.toString(), "--prep-worker");
    assertTrue(err.contains("--prep-worker needs --cluster-members"), err);
  }

  @Test
  void anExposedPeerPortWithoutTlsIsRefused() throws Exception {
    String err = runExpecting(2, "serve", "--home", home.toString(), "--cluster-members", "10.0.0.1",
        "--cluster-bind", "0.0.0.0", "--cluster-token", home.resolve("t").toString());
    assertTrue(err.contains("--cluster-bind 0.0.0.0 exposes the peer port beyond this machine; that requires TLS"),
        err);
  }

  @Test
  void exposedBindWithoutTlsIsRefused() {
    String err = runExpecting(2, "serve", "--home", home.toString(), "--bind", "0.0.0.0");
    assertTrue(err.contains("--bind 0.0.0.0 exposes the sidecar beyond this machine; that requires TLS"), err);
  }

  @Test
  void cacheMustLeaveRoomForBatchesInFlight() {
    String err = runExpecting(
        2, "serve", "--home", home.toString(), "--port", "0", "--cache-capacity", "2GiB", "--memory-budget", "1GiB");
    assertTrue(err.contains("--cache-capacity (2147483648 bytes) must be below --memory-budget"), err);
    assertTrue(Files.notExists(home.resolve("sidecar.json")), "nothing is left behind");
  }

  @Test
  void unknownConfigFileKeyIsRefused() throws Exception {
    Path cfg = home.resolve("sidecar.properties");
    Files.writeString(cfg, "cache-capacity=1GiB\ncahce-size=3\n");
    String err = runExpecting(2, "serve", "--config", cfg.toString());
    assertTrue(err.contains("unknown option 'cahce-size' in config file " + cfg), err);
  }

  @Test
  void badValueInConfigFileNamesTheOption() throws Exception {
    Path cfg = home.resolve("sidecar.properties");
    Files.writeString(cfg, "memory-budget=big\nhome=" + home + "\n");
    String err = runExpecting(2, "serve", "--config", cfg.toString());
    assertTrue(err.contains("invalid value for option '--memory-budget': 'big' is not a size"), err);
  }

  @Test
  void decodeCapsAndMemoryNameTheOption() {
    String err = runExpecting(2, "serve", "--home", home.toString(), "--max-decode-pixels", "0");
    assertTrue(err.contains("invalid value for option '--max-decode-pixels': 0 not in 1..1073741824"), err);
    err = runExpecting(2, "serve", "--home", home.toString(), "--max-decode-aspect-ratio", "0.5");
    assertTrue(err.contains("invalid value for option '--max-decode-aspect-ratio': 0.5"), err);
    err = runExpecting(2, "serve", "--home", home.toString(), "--port", "0", "--memory-budget", "256MiB",
        "--cache-capacity", "64MiB", "--decode-memory", "1GiB");
    assertTrue(err.contains("--decode-memory (1073741824 bytes) must be in 1..") && err.contains("the memory left for"
        + " batches in flight"), err);
    assertTrue(Files.notExists(home.resolve("sidecar.json")), "nothing is left behind");
  }

  @Test
  void boundsHaveDefaultsAndEachIsAnOption() throws Exception {
    ServeCommand cmd = new ServeCommand();
    new CommandLine(cmd).parseArgs("--home", home.toString());
    Bounds d = cmd.settings().bounds();
    assertEquals(Bounds.defaults(), d);
    cmd = new ServeCommand();
    new CommandLine(cmd).parseArgs("--home", home.toString(), "--flight-threads", "32", "--flight-queue", "64",
        "--local-connections", "8", "--wait-timeout", "5", "--max-plan-ids", "1000", "--stats-epochs", "4",
        "--prep-groups", "2", "--prep-threads", "3", "--prep-claim-timeout", "7");
    assertEquals(new Bounds(32, 64, 8, Duration.ofSeconds(5), 1000, 4, 2, 3, Duration.ofSeconds(7)),
        cmd.settings().bounds());
  }

  @Test
  void aBadBoundNamesItsOption() {
    String err = runExpecting(2, "serve", "--home", home.toString(), "--port", "0", "--flight-threads", "2");
    assertTrue(err.contains("invalid value for option '--flight-threads': 2 (must be at least 4)"), err);
    err = runExpecting(2, "serve", "--home", home.toString(), "--port", "0", "--prep-claim-timeout", "0");
    assertTrue(err.contains("invalid value for option '--prep-claim-timeout': 0"), err);
    err = runExpecting(2, "serve", "--home", home.toString(), "--port", "0", "--prep-threads", "many");
    assertTrue(err.contains("invalid value for option '--prep-threads': 'many'"), err);
  }
}
