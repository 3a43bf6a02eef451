package io.unstall.flight.fs;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * An exclusive lock file held for the life of what it guards (a disk tier's directory, a sidecar's home): a
 * {@link FileChannel#tryLock} (an fcntl lock, which the kernel releases when the process dies, SIGKILL
 * included), with the holder's pid written in the file so that the process refused can name it. A second
 * acquisition within one JVM is refused here as well: the JVM would throw, and closing a second channel to the
 * file would drop the first one's lock.
 */
public final class LockFile implements AutoCloseable {
  private static final Set<Path> HELD = ConcurrentHashMap.newKeySet();

  private final Path path;
  private final FileChannel channel;
  private final FileLock lock;

  private LockFile(Path path, FileChannel channel, FileLock lock) {
    this.path = path;
    this.channel = channel;
    this.lock = lock;
  }

  /**
   * Locks {@code file} (created with mode 0600 if missing). If another process (or this one) holds it, fails
   * with an IOException that names {@code what} it guards, the holder's pid when known, and {@code remedy}.
   */
  public static LockFile acquire(Path file, String what, String remedy) throws IOException {
    Path abs = file.toAbsolutePath().normalize();
    if (!HELD.add(abs)) {
      throw held(abs, what, remedy, ProcessHandle.current().pid());
    }
    FileChannel ch = null;
    try {
      ch = FileChannel.open(abs, Set.of(StandardOpenOption.CREATE, StandardOpenOption.READ, StandardOpenOption.WRITE),
          PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rw-------")));
      FileLock lock = ch.tryLock();
      if (lock == null) {
        throw held(abs, what, remedy, holder(ch));
      }
      ch.truncate(0);
      ch.write(ByteBuffer.wrap((ProcessHandle.current().pid() + "\n").getBytes(StandardCharsets.US_ASCII)), 0);
      return new LockFile(abs, ch, lock);
    } catch (IOException | RuntimeException e) {
      if (ch != null) {
        ch.close();
      }
      HELD.remove(abs);
      throw e;
    }
  }

  /** The pid the holder wrote, or -1 if it has not written it yet (or the file holds something else). */
  private static long holder(FileChannel ch) throws IOException {
    ByteBuffer b = ByteBuffer.allocate(32);
    ch.read(b, 0);
    try {
      return Long.parseLong(new String(b.array(), 0, b.position(), StandardCharsets.US_ASCII).trim());
    } catch (NumberFormatException e) {
      return -1;
    }
  }

  private static IOException held(Path file, String what, String remedy, long pid) {
    String by = pid == ProcessHandle.current().pid() ? "owner in this process" : "process";
    return new IOException(what + " is in use by another " + by
        + " (pid " + (pid < 0 ? "unknown" : Long.toString(pid)) + ", holding " + file + "); " + remedy);
  }

  public Path path() {
    return path;
  }

  /** Releases the lock; the file stays (removing it would race with a process about to lock it). */
  @Override
  public void close() throws IOException {
    try {
      channel.truncate(0);
      lock.release();
      channel.close();
    } finally {
      HELD.remove(path);
    }
  }
}
