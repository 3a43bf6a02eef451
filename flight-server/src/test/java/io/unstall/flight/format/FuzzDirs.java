package io.unstall.flight.format;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.stream.Stream;

/** The scratch directory of a format fuzz target: on tmpfs where there is one (a run rewrites its file ~10^6 times). */
final class FuzzDirs {
  private FuzzDirs() {}

  static Path create(String prefix) throws IOException {
    Path shm = Path.of("/dev/shm");
    return Files.isDirectory(shm) && Files.isWritable(shm)
        ? Files.createTempDirectory(shm, prefix)
        : Files.createTempDirectory(prefix);
  }

  static void delete(Path dir) throws IOException {
    try (Stream<Path> s = Files.walk(dir)) {
      for (Path p : s.sorted(Comparator.reverseOrder()).toList()) {
        Files.delete(p);
      }
    }
  }
}
