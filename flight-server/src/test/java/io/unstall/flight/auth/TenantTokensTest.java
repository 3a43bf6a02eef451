package io.unstall.flight.auth;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The tenant token store: hashed at rest, owner-only, and every change seen at the next authentication. */
class TenantTokensTest {
  @TempDir Path home;

  private static byte[] bytes(String token) {
    return token.getBytes(StandardCharsets.UTF_8);
  }

  @Test
  void issuedTokensAreStoredHashedInAnOwnerOnlyFile() throws Exception {
    Path file = home.resolve(TenantTokens.FILE_NAME);
    TenantTokens tokens = TenantTokens.open(file);
    TenantTokens.Issued issued = tokens.issue(List.of("imgs", "b"), "bob");
    assertEquals(64, issued.token().length());
    assertFalse(issued.toString().contains(issued.token()), "a value that prints never shows the token");
    String stored = Files.readString(file);
    assertFalse(stored.contains(issued.token()), "the token is never stored in plaintext");
    assertTrue(stored.contains(TenantTokens.sha256(bytes(issued.token()))), stored);
    assertEquals("rw-------", PosixFilePermissions.toString(Files.getPosixFilePermissions(file)));
    Principal p = tokens.authenticate(bytes(issued.token()));
    assertNotNull(p);
    assertEquals(List.of("b", "imgs"), issued.tenant().datasets());
    assertTrue(p.mayRead("imgs") && p.mayRead("b") && !p.mayRead("other") && !p.owner());
    assertEquals("tenant token " + issued.tenant().id() + " (bob)", p.toString());
    assertNull(tokens.authenticate(bytes("0".repeat(64))));
  }

  @Test
  void revocationAndIssuesByAnotherWriterCountFromTheNextCall() throws Exception {
    Path file = home.resolve(TenantTokens.FILE_NAME);
    TenantTokens sidecar = TenantTokens.open(file);
    TenantTokens cli = TenantTokens.open(file); // e.g. `unstall-sidecar token ...` in another process
    TenantTokens.Issued issued = cli.issue(List.of("imgs"), "");
    Principal p = sidecar.authenticate(bytes(issued.token()));
    assertNotNull(p, "a token issued by another writer is accepted at the next call");
    assertTrue(sidecar.principal(p.identity()).mayRead("imgs"));
    cli.revoke(issued.tenant().id());
    assertNull(sidecar.authenticate(bytes(issued.token())), "revoked: refused at the next call");
    Principal gone = sidecar.principal(p.identity());
    assertTrue(gone.revoked() && !gone.mayRead("imgs"), "a call already authenticated reads nothing more");
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> sidecar.revoke("nope"));
    assertTrue(e.getMessage().contains("'nope'"), e.getMessage());
  }

  @Test
  void aFileOthersCanReadDisablesTenantsAndIsRefusedAtStart() throws Exception {
    Path file = home.resolve(TenantTokens.FILE_NAME);
    TenantTokens tokens = TenantTokens.open(file);
    TenantTokens.Issued issued = tokens.issue(List.of("imgs"), "");
    Files.setPosixFilePermissions(file, PosixFilePermissions.fromString("rw-r--r--"));
    assertNull(tokens.authenticate(bytes(issued.token())), "no tenant is trusted from a file others may read");
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> TenantTokens.open(file));
    assertTrue(e.getMessage().contains("chmod 600 " + file), e.getMessage());
    Files.setPosixFilePermissions(file, PosixFilePermissions.fromString("rw-------"));
    assertNotNull(tokens.authenticate(bytes(issued.token())), "fixed: accepted again");
  }

  @Test
  void grantsMustBeDatasetNames() throws Exception {
    TenantTokens tokens = TenantTokens.open(home.resolve(TenantTokens.FILE_NAME));
    assertThrows(IllegalArgumentException.class, () -> tokens.issue(List.of(), ""));
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> tokens.issue(List.of("../x"), ""));
    assertTrue(e.getMessage().contains("invalid dataset name '../x'"), e.getMessage());
    assertNull(TenantTokens.none().authenticate(bytes("x".repeat(64))));
  }
}
