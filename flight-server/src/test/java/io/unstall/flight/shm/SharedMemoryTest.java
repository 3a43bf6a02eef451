package io.unstall.flight.shm;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.unstall.flight.fs.FileOwners;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;

/** The sidecar's shared-memory directory is its user's alone, even if someone made it first. */
class SharedMemoryTest {
  private static final String PREFIX = "unstall-shmtest-";
  private final Path dir = SharedMemory.ROOT.resolve(PREFIX + ProcessHandle.current().pid());

  @AfterEach
  void cleanUp() {
    SharedMemory.removeOwn(PREFIX);
  }

  @Test
  void aDirectoryOpenToOthersIsClosedToMode0700() throws Exception {
    Assumptions.assumeTrue(SharedMemory.available(), "needs /dev/shm");
    Files.createDirectory(dir);
    Files.setPosixFilePermissions(dir, PosixFilePermissions.fromString("rwxrwxrwx"));
    SharedMemory shm = SharedMemory.create(PREFIX);
    assertEquals(dir, shm.dir());
    assertEquals("rwx------", PosixFilePermissions.toString(Files.getPosixFilePermissions(dir)));
  }

  @Test
  void aDirectoryAnotherUserMadeIsRefused() throws Exception {
    Assumptions.assumeTrue(SharedMemory.available(), "needs /dev/shm");
    Assumptions.assumeTrue(FileOwners.processUid() == 0, "making a directory another user's needs root");
    Files.createDirectory(dir);
    Files.setAttribute(dir, "unix:uid", 65534); // as if "nobody" made it, guessing the sidecar's pid
    IOException e = assertThrows(IOException.class, () -> SharedMemory.create(PREFIX));
    assertTrue(e.getMessage().contains(dir.toString()) && e.getMessage().contains("not to the sidecar's user"),
        e.getMessage());
  }
}
