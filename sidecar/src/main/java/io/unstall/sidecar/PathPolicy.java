package io.unstall.sidecar;

import io.unstall.flight.auth.PermissionDeniedException;
import io.unstall.flight.fs.FileOwners;
import java.io.IOException;
import java.net.URI;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * Which local paths the control plane touches: a dataset root must be the sidecar user's own (owned by it) or
 * lie under an {@code --allow-root}; digest manifests are read and written only under the sidecar home or an
 * allowed root. Paths are compared by their real path, so neither {@code ..} nor a symbolic link leads out.
 * S3 locations are the sidecar's credentials' to decide.
 */
final class PathPolicy {
  private final Path home;
  private final List<Path> allowRoots;
  private final long uid;

  /** {@code home} and {@code allowRoots} must exist; {@code uid} is the user the sidecar runs as. */
  PathPolicy(Path home, List<Path> allowRoots, long uid) throws IOException {
    this.home = home.toRealPath();
    List<Path> roots = new ArrayList<>();
    for (Path r : allowRoots) {
      roots.add(realDirectory("--allow-root", r));
    }
    this.allowRoots = List.copyOf(roots);
    this.uid = uid;
  }

  /** The real path of an existing directory, or an error naming {@code option}. */
  static Path realDirectory(String option, Path dir) {
    try {
      Path real = dir.toAbsolutePath().toRealPath();
      if (!Files.isDirectory(real)) {
        throw new IllegalArgumentException("invalid value for option '" + option + "': " + dir + " is not a directory");
      }
      return real;
    } catch (IOException e) {
      throw new IllegalArgumentException("invalid value for option '" + option + "': " + dir + " does not exist");
    }
  }

  List<Path> allowRoots() {
    return allowRoots;
  }

  /**
   * Refuses to register {@code uri} for {@code dataset} when it is a local path that belongs to another user and
   * lies under no allowed root. A path that does not exist is left to the registry, whose error names it.
   */
  void checkDatasetRoot(String dataset, String uri) throws IOException {
    Path p = localPath(uri);
    if (p == null || !Files.exists(p)) {
      return;
    }
    Path real = p.toRealPath();
    if (underAllowedRoot(real)) {
      return;
    }
    if (FileOwners.uidOf(real) != uid) {
      throw new PermissionDeniedException("dataset '" + dataset + "': " + p + " belongs to user "
          + FileOwners.userOf(real) + ", not to the sidecar's user, and lies under no --allow-root ("
          + allowed() + "); register your own files, or start the sidecar with --allow-root for a shared directory");
    }
    if (!Files.isReadable(real)) {
      throw new PermissionDeniedException("dataset '" + dataset + "': " + p + " is not readable by the sidecar's user");
    }
  }

  /** The real path of manifest {@code path} for {@code what} (import: it exists; export: its directory does). */
  Path checkManifest(String what, String path, boolean mustExist) throws IOException {
    Path p = Path.of(path);
    if (!p.isAbsolute() || p.getParent() == null) {
      throw new IllegalArgumentException(what + ": manifest path '" + path + "' must be an absolute file path");
    }
    Path real;
    try {
      real = mustExist ? p.toRealPath() : p.getParent().toRealPath().resolve(p.getFileName());
    } catch (NoSuchFileException e) {
      throw new IllegalArgumentException(what + ": " + (mustExist ? "manifest " : "the directory of ") + path
          + " does not exist");
    }
    if (!mustExist && Files.isSymbolicLink(real)) {
      throw new PermissionDeniedException(what + ": " + path + " is a symbolic link; name the file itself");
    }
    if (!real.startsWith(home) && !underAllowedRoot(real)) {
      throw new PermissionDeniedException(what + ": " + path + " is outside the sidecar home " + home
          + " and every --allow-root (" + allowed() + "); manifests are read and written only there");
    }
    return real;
  }

  private boolean underAllowedRoot(Path real) {
    for (Path r : allowRoots) {
      if (real.startsWith(r)) {
        return true;
      }
    }
    return false;
  }

  private String allowed() {
    if (allowRoots.isEmpty()) {
      return "none given";
    }
    List<String> s = new ArrayList<>();
    allowRoots.forEach(r -> s.add(r.toString()));
    return "allowed: " + String.join(", ", s);
  }

  /** The local path a dataset location names, or null for another scheme (s3://) or a relative path. */
  private static Path localPath(String uri) {
    if (uri == null || uri.isBlank()) {
      return null;
    }
    if (uri.startsWith("file:")) {
      return Path.of(URI.create(uri));
    }
    if (uri.contains("://")) {
      return null;
    }
    Path p = Path.of(uri);
    return p.isAbsolute() ? p : null;
  }
}
