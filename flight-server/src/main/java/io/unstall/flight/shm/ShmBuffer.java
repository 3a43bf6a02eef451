package io.unstall.flight.shm;

import java.io.IOException;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.Set;
import org.apache.arrow.memory.ForeignAllocation;
import org.apache.arrow.memory.util.MemoryUtil;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A file on /dev/shm (mode 0600) mapped into the sidecar and wrapped as Arrow memory, so the allocator that
 * wraps it ({@code allocator.wrapForeignAllocation}) counts it against its limit. Processes on this host map
 * the same file instead of receiving the bytes. Releasing the Arrow buffer unmaps and deletes the file; a
 * process that still maps it keeps its pages until it unmaps (Linux unlink semantics).
 */
public final class ShmBuffer extends ForeignAllocation {
  private static final Logger LOG = LoggerFactory.getLogger(ShmBuffer.class);

  private final Path path;
  private MappedByteBuffer map;

  private ShmBuffer(Path path, MappedByteBuffer map, long size) {
    super(size, MemoryUtil.getByteBufferAddress(map));
    this.path = path;
    this.map = map;
  }

  /**
   * Creates {@code path} of {@code size} bytes (at most 2 GiB) and maps it. With {@code commit} its tmpfs pages
   * are allocated now, so a full /dev/shm is an IOException here rather than a fault on first write.
   */
  public static ShmBuffer create(Path path, long size, boolean commit) throws IOException {
    if (size > Integer.MAX_VALUE) {
      throw new IOException(
          "a shared-memory file is limited to 2 GiB, " + path.getFileName() + " needs " + size + " bytes");
    }
    long n = Math.max(1, size);
    long free = Files.getFileStore(path.getParent()).getUsableSpace();
    if (free < n) {
      throw new IOException("shared memory is full: " + path.getParent() + " has " + free + " bytes free, "
          + path.getFileName() + " needs " + n + " (raise /dev/shm's size or lower --cache-capacity)");
    }
    try (FileChannel ch = FileChannel.open(
        path,
        Set.of(StandardOpenOption.CREATE_NEW, StandardOpenOption.READ, StandardOpenOption.WRITE),
        PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rw-------")))) {
      if (commit) {
        Commit.zeros(ch, 0, n);
      }
      return new ShmBuffer(path, ch.map(FileChannel.MapMode.READ_WRITE, 0, n), size);
    } catch (IOException | RuntimeException e) {
      Files.deleteIfExists(path);
      throw e;
    }
  }

  /** Allocates the tmpfs pages under {@code [from, to)} now (see {@link #create}). */
  public void commit(long from, long to) throws IOException {
    try (FileChannel ch = FileChannel.open(path, StandardOpenOption.WRITE)) {
      Commit.zeros(ch, from, Math.min(to, getSize()));
    }
  }

  /** Frees a buffer that was never handed to an allocator. */
  public void discard() {
    release0();
  }

  public Path path() {
    return path;
  }

  /** Where the mapping starts, for an allocation that accounts for it without owning it. */
  public long address() {
    return memoryAddress();
  }

  @Override
  protected void release0() {
    MappedByteBuffer m = map;
    map = null;
    SharedMemory.unmap(m);
    try {
      Files.deleteIfExists(path);
    } catch (IOException e) {
      LOG.warn("cannot delete {}: {}", path, e.toString());
    }
  }

  /** Allocates tmpfs pages by writing zeros through the file (never through the mapping, which would fault). */
  static final class Commit {
    private static final java.nio.ByteBuffer ZEROS = java.nio.ByteBuffer.allocateDirect(1 << 20);

    static void zeros(FileChannel ch, long from, long to) throws IOException {
      long pos = from;
      while (pos < to) {
        java.nio.ByteBuffer z = ZEROS.duplicate();
        z.limit((int) Math.min(z.capacity(), to - pos));
        pos += ch.write(z, pos);
      }
    }
  }
}
