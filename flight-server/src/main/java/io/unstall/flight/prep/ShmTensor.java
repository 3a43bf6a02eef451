package io.unstall.flight.prep;

import java.io.IOException;
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.Comparator;
import java.util.stream.Stream;
import org.apache.arrow.memory.ForeignAllocation;
import org.apache.arrow.memory.util.MemoryUtil;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A prepared batch's tensor bytes in a file on /dev/shm, mapped into the sidecar and wrapped as Arrow memory
 * (so the group's allocator counts it against the staging limit). Members on this host map the same file
 * instead of receiving the bytes over Flight: no copy per member. Releasing the Arrow buffer unmaps and
 * deletes the file; a member that still maps it keeps its pages until it unmaps (Linux unlink semantics).
 */
final class ShmTensor extends ForeignAllocation {
  private static final Logger LOG = LoggerFactory.getLogger(ShmTensor.class);
  static final Path ROOT = Path.of("/dev/shm");

  private final Path path;
  private MappedByteBuffer map;

  private ShmTensor(Path path, MappedByteBuffer map, long size) {
    super(size, MemoryUtil.getByteBufferAddress(map));
    this.path = path;
    this.map = map;
  }

  static boolean available() {
    return Files.isDirectory(ROOT) && Files.isWritable(ROOT);
  }

  /** This sidecar's directory (0700); stale ones of dead sidecars are removed on first use. */
  static synchronized Path dir() throws IOException {
    long pid = ProcessHandle.current().pid();
    Path d = ROOT.resolve("unstall-prep-" + pid);
    if (!Files.isDirectory(d)) {
      try (Stream<Path> s = Files.list(ROOT)) {
        s.filter(p -> p.getFileName().toString().startsWith("unstall-prep-")).forEach(ShmTensor::removeIfStale);
      }
      Files.createDirectories(d, PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rwx------")));
    }
    return d;
  }

  private static void removeIfStale(Path p) {
    try {
      long pid = Long.parseLong(p.getFileName().toString().substring("unstall-prep-".length()));
      if (ProcessHandle.of(pid).map(ProcessHandle::isAlive).orElse(false)) {
        return;
      }
      try (Stream<Path> s = Files.walk(p)) {
        s.sorted(Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
      }
    } catch (NumberFormatException | IOException e) {
      LOG.debug("leaving {}: {}", p, e.toString());
    }
  }

  /** Removes this sidecar's (empty) directory at shutdown. */
  static void removeDir() {
    Path d = ROOT.resolve("unstall-prep-" + ProcessHandle.current().pid());
    try {
      Files.deleteIfExists(d);
    } catch (IOException e) {
      LOG.warn("cannot remove {}: {}", d, e.toString());
    }
  }

  static ShmTensor create(Path path, long size) throws IOException {
    if (size > Integer.MAX_VALUE) {
      throw new IOException("a shared-memory batch is limited to 2 GiB, this one needs " + size + " bytes");
    }
    try (FileChannel ch = FileChannel.open(path, java.util.Set.of(StandardOpenOption.CREATE_NEW,
        StandardOpenOption.READ, StandardOpenOption.WRITE),
        PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rw-------")))) {
      return new ShmTensor(path, ch.map(FileChannel.MapMode.READ_WRITE, 0, Math.max(1, size)), size);
    }
  }

  Path path() {
    return path;
  }

  @Override
  protected void release0() {
    MappedByteBuffer m = map;
    map = null;
    unmap(m);
    try {
      Files.deleteIfExists(path);
    } catch (IOException e) {
      LOG.warn("cannot delete {}: {}", path, e.toString());
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
      LOG.warn("cannot unmap shared-memory batches eagerly ({}); the GC will", e.toString());
    }
    INVOKE_CLEANER = m;
    UNSAFE = u;
  }

  /** Unmaps now rather than at some GC: the staging bound is about memory, not about reachability. */
  private static void unmap(MappedByteBuffer m) {
    if (m != null && INVOKE_CLEANER != null) {
      try {
        INVOKE_CLEANER.invoke(UNSAFE, m);
      } catch (ReflectiveOperationException e) {
        LOG.debug("unmap failed: {}", e.toString());
      }
    }
  }
}
