package io.unstall.sidecar;

import io.unstall.flight.fs.DurableFiles;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermission;
import java.nio.file.attribute.PosixFilePermissions;
import java.security.SecureRandom;
import java.util.HexFormat;
import java.util.Set;

/** Files only the user may read: the token file and the state file. The token is never logged. */
public final class Secrets {
  private static final Set<PosixFilePermission> OWNER_RWX = PosixFilePermissions.fromString("rwx------");

  private Secrets() {}

  /** Reads the token, creating a random one (mode 0600) if the file does not exist. */
  public static String readOrCreateToken(Path file) throws IOException {
    if (Files.exists(file)) {
      return readToken(file, "token file");
    }
    byte[] raw = new byte[32];
    new SecureRandom().nextBytes(raw);
    String token = HexFormat.of().formatHex(raw);
    writePrivate(file, token + "\n");
    return token;
  }

  /** Reads a token from a file only its owner may read; {@code what} names the file in errors. */
  public static String readToken(Path file, String what) throws IOException {
    if (!Files.isRegularFile(file)) {
      throw new IllegalArgumentException(what + " " + file + " does not exist");
    }
    Set<PosixFilePermission> perms = Files.getPosixFilePermissions(file);
    if (perms.stream().anyMatch(p -> p.name().startsWith("GROUP") || p.name().startsWith("OTHERS"))) {
      throw new IllegalArgumentException(
          what + " " + file + " is readable by others (" + PosixFilePermissions.toString(perms)
              + "); run: chmod 600 " + file);
    }
    String token = Files.readString(file, StandardCharsets.UTF_8).trim();
    if (token.length() < 16) {
      throw new IllegalArgumentException(what + " " + file + " holds fewer than 16 characters");
    }
    return token;
  }

  /** Creates {@code dir} with mode 0700 if it does not exist; returns it. */
  public static Path privateDirectory(Path dir) throws IOException {
    if (!Files.isDirectory(dir)) {
      Files.createDirectories(dir, PosixFilePermissions.asFileAttribute(OWNER_RWX));
    }
    return dir;
  }

  /**
   * Writes {@code content} atomically (and durably) to a file of mode 0600 in a directory it creates with mode
   * 0700.
   */
  public static void writePrivate(Path file, String content) throws IOException {
    privateDirectory(file.toAbsolutePath().getParent());
    DurableFiles.writeAtomically(file, StandardCharsets.UTF_8.encode(content));
  }
}
