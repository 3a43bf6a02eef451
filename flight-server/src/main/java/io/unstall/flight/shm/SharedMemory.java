package io.unstall.flight.shm;

import java.io.IOException;
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;
import io.unstall.flight.fs.FileOwners;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermission;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.Set;
import java.util.Comparator;
import java.util.stream.Stream;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A directory of this sidecar's on /dev/shm ({@code /dev/shm/<prefix><pid>}, mode 0700): files the trainer's
 * processes on this host map instead of receiving bytes through a socket. Directories of dead sidecars with
 * the same prefix are removed when a live one creates its own; the owner removes its directory at shutdown.
 */
public final class SharedMemory {
  private static final Logger LOG = LoggerFactory.getLogger(SharedMemory.class);
  public static final Path ROOT = Path.of("/dev/shm");
  private static final Set<PosixFilePermission> OWNER_ONLY = PosixFilePermissions.fromString("rwx------");

  private final Path dir;

  private SharedMemory(Path dir) {
    this.dir = dir;
  }

  /** Whether shared memory files can be made here (Linux with a writable /dev/shm). */
  public static boolean available() {
    return Files.isDirectory(ROOT) && Files.isWritable(ROOT);
  }

  /**
   * Creates (or reuses) this process's directory {@code /dev/shm/<prefix><pid>}, removing stale ones. It is the
   * sidecar user's alone: mode 0700, and one that another user made beforehand (guessing the pid) is refused.
   */
  public static synchronized SharedMemory create(String prefix) throws IOException {
    Path d = ROOT.resolve(prefix + ProcessHandle.current().pid());
    if (!Files.isDirectory(d, LinkOption.NOFOLLOW_LINKS)) {
      try (Stream<Path> s = Files.list(ROOT)) {
        s.filter(p -> p.getFileName().toString().startsWith(prefix)).forEach(p -> removeIfStale(p, prefix));
      }
      Files.createDirectory(d, PosixFilePermissions.asFileAttribute(OWNER_ONLY));
    }
    if (FileOwners.uidOf(d) != FileOwners.processUid()) {
      throw new IOException("shared-memory directory " + d + " belongs to user " + FileOwners.userOf(d)
          + ", not to the sidecar's user " + FileOwners.processUser() + "; remove it, or start with --no-shm");
    }
    if (!Files.getPosixFilePermissions(d, LinkOption.NOFOLLOW_LINKS).equals(OWNER_ONLY)) {
      Files.setPosixFilePermissions(d, OWNER_ONLY); // only the sidecar's user may reach the socket and the files
    }
    return new SharedMemory(d);
  }

  public Path dir() {
    return dir;
  }

  public Path resolve(String name) {
    return dir.resolve(name);
  }

  /** Removes the directory and whatever is left in it (at shutdown; mappings held by clients stay valid). */
  public void remove() {
    removeTree(dir);
  }

  /** Removes this process's directory of {@code prefix}, if it was ever made. */
  public static void removeOwn(String prefix) {
    removeTree(ROOT.resolve(prefix + ProcessHandle.current().pid()));
  }

  private static void removeIfStale(Path p, String prefix) {
    try {
      long pid = Long.parseLong(p.getFileName().toString().substring(prefix.length()));
      if (ProcessHandle.of(pid).map(ProcessHandle::isAlive).orElse(false)) {
        return;
      }
      removeTree(p);
    } catch (NumberFormatException e) {
      LOG.debug("leaving {}: {}", p, e.toString());
    }
  }

  private static void removeTree(Path p) {
    if (!Files.exists(p)) {
      return;
    }
    try (Stream<Path> s = Files.walk(p)) {
      s.sorted(Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
    } catch (IOException e) {
      LOG.warn("cannot remove {}: {}", p, e.toString());
    }
  }

  private static final Method INVOKE_CLEANER;
  private static final Object UNSAFE;

  static {
    Method m = null;
    Object u = null;
    try {
      Class<?> c = Class.forName("sun.misc.Unsafe");
      Field f = c.getDeclaredField("theUnsafe");
      f.setAccessible(true);
      u = f.get(null);
      m = c.getMethod("invokeCleaner", ByteBuffer.class);
    } catch (ReflectiveOperationException | RuntimeException e) {
      LOG.warn("cannot unmap shared-memory files eagerly ({}); the GC will", e.toString());
    }
    INVOKE_CLEANER = m;
    UNSAFE = u;
  }

  /** Unmaps now rather than at some GC: memory bounds are about bytes, not about reachability. */
  static void unmap(MappedByteBuffer m) {
    if (m != null && INVOKE_CLEANER != null) {
      try {
        INVOKE_CLEANER.invoke(UNSAFE, m);
      } catch (ReflectiveOperationException e) {
        LOG.debug("unmap failed: {}", e.toString());
      }
    }
  }
}
