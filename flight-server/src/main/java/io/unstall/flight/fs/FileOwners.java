package io.unstall.flight.fs;

import com.sun.security.auth.module.UnixSystem;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;

/** Whose a file is, compared with the user the sidecar runs as (numeric uids: names may be missing). */
public final class FileOwners {
  private static final long UID = new UnixSystem().getUid();

  private FileOwners() {}

  /** The sidecar process's uid. */
  public static long processUid() {
    return UID;
  }

  public static long uidOf(Path p) throws IOException {
    return ((Number) Files.getAttribute(p, "unix:uid", LinkOption.NOFOLLOW_LINKS)).longValue();
  }

  /** The owner's name, or its uid where it has none. */
  public static String userOf(Path p) {
    try {
      return Files.getOwner(p, LinkOption.NOFOLLOW_LINKS).getName();
    } catch (IOException | RuntimeException e) {
      return "?";
    }
  }

  /** The user name of the process, or its uid where it has none. */
  public static String processUser() {
    String name = new UnixSystem().getUsername();
    return name == null || name.isEmpty() ? "uid " + UID : name;
  }
}
