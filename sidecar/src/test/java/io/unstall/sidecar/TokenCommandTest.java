package io.unstall.sidecar;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.unstall.flight.auth.TenantTokens;
import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** {@code unstall-sidecar token ...}: the owner's offline way to issue, list and revoke tenant tokens. */
class TokenCommandTest {
  @TempDir Path home;

  private record Run(int code, String out, String err) {}

  private Run run(String... args) {
    PrintStream oldOut = System.out;
    PrintStream oldErr = System.err;
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    System.setOut(new PrintStream(out, true, StandardCharsets.UTF_8));
    System.setErr(new PrintStream(err, true, StandardCharsets.UTF_8));
    try {
      int code = Main.run(args);
      return new Run(code, out.toString(StandardCharsets.UTF_8), err.toString(StandardCharsets.UTF_8));
    } finally {
      System.setOut(oldOut);
      System.setErr(oldErr);
    }
  }

  @Test
  void issueListRevoke() throws Exception {
    Run issued =
        run("token", "issue", "--home", home.toString(), "--dataset", "imgs", "--dataset", "tf", "--name", "bob");
    assertEquals(0, issued.code(), issued.err());
    String token = issued.out().trim();
    assertEquals(64, token.length(), issued.out());
    assertFalse(issued.err().contains(token), "the token is printed once, on stdout only");
    Path file = home.resolve(TenantTokens.FILE_NAME);
    assertFalse(Files.readString(file).contains(token), "stored hashed");
    assertEquals("rw-------", PosixFilePermissions.toString(Files.getPosixFilePermissions(file)));
    String id = TenantTokens.open(file).list().get(0).id();

    Run listed = run("token", "list", "--home", home.toString());
    assertEquals(0, listed.code(), listed.err());
    assertTrue(listed.out().contains("\"id\":\"" + id + "\"") && listed.out().contains("\"datasets\":[\"imgs\",\"tf\"]")
        && listed.out().contains("\"name\":\"bob\"") && !listed.out().contains(token), listed.out());

    assertEquals(0, run("token", "revoke", "--home", home.toString(), id).code());
    assertTrue(TenantTokens.open(file).list().isEmpty());
    Run again = run("token", "revoke", "--home", home.toString(), id);
    assertEquals(2, again.code());
    assertTrue(again.err().contains("no tenant token has id '" + id + "'"), again.err());
    Run noDataset = run("token", "issue", "--home", home.toString());
    assertEquals(2, noDataset.code());
    assertTrue(noDataset.err().contains("--dataset"), noDataset.err());
  }
}
