package io.unstall.sidecar;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.unstall.flight.auth.PermissionDeniedException;
import io.unstall.flight.fs.FileOwners;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** Which paths registration and manifests may touch: the sidecar user's own, an allowed root, the home. */
class PathPolicyTest {
  @TempDir Path dir;

  /** A policy for a sidecar run by another user than the one who owns the test's files. */
  private PathPolicy asAnotherUser(List<Path> allowRoots) throws Exception {
    Files.createDirectories(dir.resolve("home"));
    return new PathPolicy(dir.resolve("home"), allowRoots, FileOwners.processUid() + 4242);
  }

  @Test
  void aDatasetRootMustBeTheSidecarUsersOwnOrUnderAnAllowedRoot() throws Exception {
    Path data = Files.createDirectories(dir.resolve("shared/data"));
    PathPolicy own = new PathPolicy(Files.createDirectories(dir.resolve("home")), List.of(), FileOwners.processUid());
    assertDoesNotThrow(() -> own.checkDatasetRoot("d", data.toString()));
    assertDoesNotThrow(() -> own.checkDatasetRoot("d", data.toUri().toString()));

    PermissionDeniedException e = assertThrows(PermissionDeniedException.class,
        () -> asAnotherUser(List.of()).checkDatasetRoot("d", data.toString()));
    assertTrue(e.getMessage().contains("dataset 'd': " + data) && e.getMessage().contains("--allow-root (none given)"),
        e.getMessage());
    PathPolicy allowed = asAnotherUser(List.of(dir.resolve("shared")));
    assertDoesNotThrow(() -> allowed.checkDatasetRoot("d", data.toString()));
    // neither '..' nor a symbolic link leads out of an allowed root
    Path outside = Files.createDirectories(dir.resolve("private"));
    Files.createSymbolicLink(dir.resolve("shared/link"), outside);
    assertThrows(PermissionDeniedException.class,
        () -> allowed.checkDatasetRoot("d", dir.resolve("shared/link").toString()));
    assertThrows(PermissionDeniedException.class,
        () -> allowed.checkDatasetRoot("d", dir.resolve("shared/../private").toString()));
    // missing paths are the registry's to name; other schemes the storage's credentials'
    assertDoesNotThrow(() -> allowed.checkDatasetRoot("d", dir.resolve("missing").toString()));
    assertDoesNotThrow(() -> allowed.checkDatasetRoot("d", "s3://bucket/prefix"));
  }

  @Test
  void manifestsAreReadAndWrittenUnderTheHomeOrAnAllowedRootOnly() throws Exception {
    Path shared = Files.createDirectories(dir.resolve("shared"));
    PathPolicy p = asAnotherUser(List.of(shared));
    Path inHome = dir.resolve("home/a.manifest");
    assertEquals(dir.resolve("home").toRealPath().resolve("a.manifest"),
        p.checkManifest("export", inHome.toString(), false));
    assertDoesNotThrow(() -> p.checkManifest("export", shared.resolve("b.manifest").toString(), false));
    PermissionDeniedException e = assertThrows(PermissionDeniedException.class,
        () -> p.checkManifest("exportManifest of dataset 'd'", "/etc/unstall.manifest", false));
    assertTrue(
        e.getMessage().contains("exportManifest of dataset 'd': /etc/unstall.manifest is outside the sidecar home")
            && e.getMessage().contains("allowed: " + shared.toRealPath()),
        e.getMessage());
    Files.writeString(dir.resolve("x.manifest"), "x");
    assertThrows(PermissionDeniedException.class,
        () -> p.checkManifest("import", dir.resolve("x.manifest").toString(), true));
    Files.createSymbolicLink(dir.resolve("home/out.manifest"), dir.resolve("x.manifest"));
    assertThrows(PermissionDeniedException.class,
        () -> p.checkManifest("import", dir.resolve("home/out.manifest").toString(), true),
        "a link out is followed, then refused");
    assertThrows(PermissionDeniedException.class,
        () -> p.checkManifest("export", dir.resolve("home/out.manifest").toString(), false),
        "never written through a link");
    IllegalArgumentException rel =
        assertThrows(IllegalArgumentException.class, () -> p.checkManifest("export", "a.manifest", false));
    assertTrue(rel.getMessage().contains("must be an absolute file path"), rel.getMessage());
    IllegalArgumentException missing = assertThrows(IllegalArgumentException.class,
        () -> p.checkManifest("import", dir.resolve("home/none.manifest").toString(), true));
    assertTrue(missing.getMessage().contains("does not exist"), missing.getMessage());
  }

  @Test
  void anAllowedRootMustBeAnExistingDirectory() {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> PathPolicy.realDirectory("--allow-root", dir.resolve("nope")));
    assertTrue(e.getMessage().contains("invalid value for option '--allow-root'"), e.getMessage());
  }
}
