package io.unstall.flight.storage;

import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.nio.file.attribute.BasicFileAttributes;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.zip.CRC32C;
import java.util.stream.Stream;

/**
 * The local file system. Files are opened per read: the OS keeps no descriptors for millions of samples.
 *
 * <p>A pinned file ({@link #pin}) is known by its size, mtime (ns) and the CRC32C of its first and last
 * {@link #EDGE} bytes. A read checks the size on the channel it opens (an fstat), and the edges' CRCs from
 * the bytes it read when it reads them whole (an image: the whole file); other reads (records inside a shard)
 * also stat the file and read its edges, at most once per {@link #RECHECK_NANOS} per file. A change fails the
 * read, and every later one of that file, with {@link SourceChangedException}. The pin's {@linkplain #version
 * version} also carries the inode number and ctime, which a rewrite changes even when it restores the size and
 * mtime (reads do not check them: a chmod changes the ctime too, and must not fail training); it decides whether
 * a persisted digest manifest still describes the file.
 */
public final class LocalStorage implements Storage {
  /** Bytes at each end of a file whose CRC32C pins its content. */
  static final int EDGE = 4096;
  /** A file read in parts is checked fully (stat and edges) at most this often. */
  static final long RECHECK_NANOS = 1_000_000_000L;

  private final Path root;
  /** Set when the location is one file: the root is then its directory and this its only object. */
  private final String only;
  private final Map<String, Pin> pins = new ConcurrentHashMap<>();

  /** A file as indexed. */
  private static final class Pin {
    final long size;
    final long mtimeNs;
    final int head;
    final int tail;
    /**
     * The inode's identity and change time ("ino:ctime ns"; "" where the file system has no unix view): unlike
     * the mtime, no user can set the ctime back, so a rewrite that restores size and mtime still changes it.
     */
    final String inode;
    /** When a read in parts last checked it in full; "long ago" until the first such read. */
    volatile long checkedAt = System.nanoTime() - RECHECK_NANOS;
    /** Why the file no longer matches, once a read saw it; then every read of it fails at once. */
    volatile String changed;

    Pin(long size, long mtimeNs, int head, int tail, String inode) {
      this.size = size;
      this.mtimeNs = mtimeNs;
      this.head = head;
      this.tail = tail;
      this.inode = inode;
    }

    boolean due(long now) {
      return now - checkedAt >= RECHECK_NANOS;
    }
  }

  public LocalStorage(Path location) throws IOException {
    Path abs = location.toAbsolutePath().normalize();
    if (!Files.exists(abs)) {
      throw new NoSuchFileException(abs.toString(), null, "dataset location does not exist");
    }
    boolean file = Files.isRegularFile(abs);
    this.root = file ? abs.getParent() : abs;
    this.only = file ? abs.getFileName().toString() : null;
  }

  @Override
  public String uri() {
    return (only == null ? root : root.resolve(only)).toUri().toString();
  }

  @Override
  public boolean isSingleObject() {
    return only != null;
  }

  @Override
  public List<String> listDirectories(String dir) throws IOException {
    List<String> out = new ArrayList<>();
    try (Stream<Path> s = Files.list(resolve(dir))) {
      s.filter(Files::isDirectory).forEach(p -> out.add(relative(p)));
    }
    out.sort(null);
    return out;
  }

  @Override
  public List<String> listObjects(String dir) throws IOException {
    if (only != null) {
      return List.of(only);
    }
    Path base = resolve(dir);
    List<String> out = new ArrayList<>();
    try (Stream<Path> s = Files.walk(base, java.nio.file.FileVisitOption.FOLLOW_LINKS)) {
      s.filter(Files::isRegularFile).forEach(p -> out.add(relative(p)));
    }
    out.sort(null);
    return out;
  }

  @Override
  public long size(String path) throws IOException {
    return Files.size(resolve(path));
  }

  @Override
  public long pin(String path) throws IOException {
    Path p = resolve(path);
    try (FileChannel ch = FileChannel.open(p, StandardOpenOption.READ)) {
      BasicFileAttributes a = Files.readAttributes(p, BasicFileAttributes.class);
      long size = a.size();
      pins.put(path, new Pin(size, a.lastModifiedTime().to(TimeUnit.NANOSECONDS),
          edgeCrc(ch, 0, Math.min(EDGE, size)), edgeCrc(ch, Math.max(0, size - EDGE), size), inode(p)));
      return size;
    }
  }

  /** "inode:ctime ns" of {@code p}, or "" without a unix attribute view. */
  private static String inode(Path p) throws IOException {
    try {
      Map<String, Object> u = Files.readAttributes(p, "unix:ino,ctime");
      return u.get("ino") + ":" + ((java.nio.file.attribute.FileTime) u.get("ctime")).to(TimeUnit.NANOSECONDS);
    } catch (UnsupportedOperationException | IllegalArgumentException e) {
      return "";
    }
  }

  /** The CRC32C of bytes [from, to) of the file. */
  private static int edgeCrc(FileChannel ch, long from, long to) throws IOException {
    ByteBuffer b = ByteBuffer.allocate((int) (to - from));
    while (b.hasRemaining() && ch.read(b, from + b.position()) >= 0) {
      // until full or at the end
    }
    return crc(b, 0, b.position());
  }

  /** Checks a pinned file before a read of [offset, end) through {@code ch}; returns whether it reads both edges. */
  private boolean checkBeforeRead(Path p, Pin pin, FileChannel ch, long offset, long end)
      throws IOException {
    if (pin.changed != null) {
      throw new SourceChangedException("file '" + p + "'", pin.changed);
    }
    long size = ch.size();
    if (size != pin.size) {
      throw changed(p, pin, "its size was " + pin.size + " bytes when indexed and is " + size + " now");
    }
    boolean whole = offset <= 0 && end >= size;
    long now = System.nanoTime();
    if (!whole && pin.due(now)) {
      long mtime = Files.getLastModifiedTime(p).to(TimeUnit.NANOSECONDS);
      if (mtime != pin.mtimeNs) {
        throw changed(p, pin, "its mtime moved");
      }
      if (edgeCrc(ch, 0, Math.min(EDGE, size)) != pin.head || edgeCrc(ch, Math.max(0, size - EDGE), size) != pin.tail) {
        throw changed(p, pin, "its content differs from when it was indexed, though its size and mtime do not");
      }
      pin.checkedAt = now;
    }
    return whole;
  }

  /** After a whole-file read into {@code read} (from its position): its edges must match the pin. */
  private void checkEdges(Path p, Pin pin, ByteBuffer read) throws IOException {
    int start = read.position() - (int) pin.size;
    if (crc(read, start, start + Math.min(EDGE, pin.size)) != pin.head
        || crc(read, start + Math.max(0, pin.size - EDGE), start + pin.size) != pin.tail) {
      throw changed(p, pin, "its content differs from when it was indexed, though its size does not");
    }
  }

  /** The CRC32C of bytes [from, to) of {@code b}. */
  private static int crc(ByteBuffer b, long from, long to) {
    CRC32C c = new CRC32C();
    c.update(b.duplicate().position((int) from).limit((int) to));
    return (int) c.getValue();
  }

  private static SourceChangedException changed(Path p, Pin pin, String how) {
    pin.changed = how;
    return new SourceChangedException("file '" + p + "'", how);
  }

  @Override
  public void readFully(String path, long offset, ByteBuffer dst) throws IOException {
    Path p = resolve(path);
    Pin pin = pins.get(path);
    try (FileChannel ch = FileChannel.open(p, StandardOpenOption.READ)) {
      boolean whole = pin != null && checkBeforeRead(p, pin, ch, offset, offset + dst.remaining());
      long pos = offset;
      while (dst.hasRemaining()) {
        int n = ch.read(dst, pos);
        if (n < 0) {
          throw new EOFException(
              "file '" + p + "' ended at byte " + pos + " but the index expects " + dst.remaining()
                  + " more bytes (truncated or changed after registration)");
        }
        pos += n;
      }
      if (whole) {
        checkEdges(p, pin, dst);
      }
    } catch (NoSuchFileException e) {
      throw new NoSuchFileException(p.toString(), null, "file no longer exists (deleted after registration?)");
    }
  }

  @Override
  public String version(String path) throws IOException {
    Pin pin = pins.get(path);
    if (pin != null) {
      return pin.mtimeNs + ":" + pin.size + ":" + Integer.toHexString(pin.head) + ":" + Integer.toHexString(pin.tail)
          + ":" + pin.inode;
    }
    Path p = resolve(path);
    return Files.getLastModifiedTime(p).toMillis() + ":" + Files.size(p) + ":" + inode(p);
  }

  @Override
  public String describe(String path) {
    return resolve(path).toString();
  }

  private Path resolve(String rel) {
    if (rel.isEmpty()) {
      return root;
    }
    Path p = root.resolve(rel).normalize();
    if (!p.startsWith(root)) {
      throw new IllegalArgumentException("path '" + rel + "' escapes the dataset root " + root);
    }
    return p;
  }

  private String relative(Path p) {
    return root.relativize(p).toString().replace(java.io.File.separatorChar, '/');
  }
}
