package io.unstall.flight.fs;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.PosixFilePermissions;

/** Files replaced whole, so that a crash or a SIGKILL leaves the old content or the new, never a torn file. */
public final class DurableFiles {
  private DurableFiles() {}

  /**
   * Writes {@code content} to {@code file} (mode 0600) atomically and durably: a temp file in the same
   * directory (which must exist) is written and fsynced, renamed over {@code file}, and the directory fsynced.
   */
  public static void writeAtomically(Path file, ByteBuffer content) throws IOException {
    Path dir = file.toAbsolutePath().getParent();
    Path tmp = Files.createTempFile(dir, ".tmp-", "",
        PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rw-------")));
    try {
      try (FileChannel ch = FileChannel.open(tmp, StandardOpenOption.WRITE)) {
        ByteBuffer b = content.duplicate();
        while (b.hasRemaining()) {
          ch.write(b);
        }
        ch.force(true);
      }
      Files.move(tmp, file, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
      try (FileChannel d = FileChannel.open(dir, StandardOpenOption.READ)) {
        d.force(true); // the rename itself
      }
    } finally {
      Files.deleteIfExists(tmp);
    }
  }
}
