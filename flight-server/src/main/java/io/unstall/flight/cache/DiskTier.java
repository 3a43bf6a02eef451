package io.unstall.flight.cache;

import io.unstall.flight.fs.DurableFiles;
import io.unstall.flight.fs.LockFile;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.zip.CRC32C;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The second cache tier, on local disk, with MinIO semantics too: entries are appended to one file until the
 * capacity is reached and never evicted. Every entry carries a CRC32C of its header and of its data; a read
 * whose data fails the check is dropped and reported as a miss (the caller refetches from storage), never
 * served. The file survives restarts, SIGKILL included: opening it rescans the headers and truncates an
 * unreadable tail. {@link #checkpoint()} (the registry calls it periodically) fsyncs the file and records how
 * far it is durable in {@code tier.checkpoint}; entries past that mark (written after the last checkpoint, so
 * possibly torn) have their data verified at opening, and a torn one is dropped. One sidecar at a time owns
 * the directory: a second one is refused at opening ({@code tier.lock}, naming the holder's pid).
 *
 * <p>A write that fails (disk full, EIO) gives its space back, or, when entries were placed after it, marks it
 * as a hole (a header with the all-zero digest) that opening steps over: one failed write never costs the
 * entries after it.
 *
 * <pre>entry: "UNSD" | digest[32] | u32 length | u32 dataCrc | u32 headerCrc | data[length]   (little-endian)
 * tier.checkpoint: "UNSC" | u64 durableEnd | u32 crc   (little-endian)</pre>
 */
public final class DiskTier implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(DiskTier.class);
  static final int MAGIC = 0x44534e55; // "UNSD" little-endian
  static final int HEADER = 4 + Digest.BYTES + 4 + 4 + 4;
  public static final String FILE = "tier.data";
  public static final String CHECKPOINT = "tier.checkpoint";
  public static final String LOCK = "tier.lock";
  private static final int CHECKPOINT_MAGIC = 0x43534e55; // "UNSC" little-endian

  private record Loc(long offset, int length, int crc) {}

  private final Path file;
  private final Path checkpointFile;
  private final LockFile lock;
  private final FileChannel channel;
  private final long capacity;
  private final ConcurrentHashMap<Digest, Loc> index = new ConcurrentHashMap<>();
  private final AtomicLong corruptDropped = new AtomicLong();
  private long end; // guarded by this
  /** Offsets of entries reserved whose bytes are still being written; guarded by this. */
  private final java.util.TreeSet<Long> writing = new java.util.TreeSet<>();
  private final Object checkpointing = new Object();
  /** Writes {@code src} at a position of the file (the file itself; tests put a failing one in front). */
  private final Writer writes;

  /** A positional write to the tier's file. */
  interface Writer {
    void write(ByteBuffer src, long pos) throws IOException;
  }

  /** Opens (or creates) the tier in {@code dir}; fails naming the directory if another sidecar holds it. */
  public DiskTier(Path dir, long capacityBytes) throws IOException {
    this(dir, capacityBytes, null);
  }

  /** With the file's writes passed through {@code writes} (a test's injected fault), when not null. */
  DiskTier(Path dir, long capacityBytes, java.util.function.UnaryOperator<Writer> writes) throws IOException {
    Files.createDirectories(dir);
    this.file = dir.resolve(FILE);
    this.checkpointFile = dir.resolve(CHECKPOINT);
    this.capacity = capacityBytes;
    this.writes = writes == null ? this::writeFully : writes.apply(this::writeFully);
    this.lock = LockFile.acquire(dir.resolve(LOCK), "disk cache directory " + dir.toAbsolutePath(),
        "give each sidecar its own --disk-cache-dir");
    FileChannel ch = null;
    try {
      ch = FileChannel.open(file, StandardOpenOption.CREATE, StandardOpenOption.READ, StandardOpenOption.WRITE);
      this.channel = ch;
      recover();
      if (end > 0 || Files.exists(checkpointFile)) {
        checkpoint(); // what was verified is the new durable mark (a truncated tail never lies below it)
      } // an empty new tier has nothing to make durable yet
    } catch (IOException | RuntimeException e) {
      if (ch != null) {
        ch.close();
      }
      lock.close();
      throw e;
    }
  }

  /**
   * Rebuilds the index from the headers; an unreadable or truncated tail is cut off. Entries past the last
   * checkpoint have their data checked too: a SIGKILL or a crash may have left them torn.
   */
  private void recover() throws IOException {
    long size = channel.size();
    long durable = Math.min(readCheckpoint(), size);
    long pos = 0;
    int torn = 0;
    int holes = 0;
    ByteBuffer h = ByteBuffer.allocate(HEADER).order(ByteOrder.LITTLE_ENDIAN);
    while (pos + HEADER <= size) {
      h.clear();
      readFully(h, pos);
      h.flip();
      Loc loc = parseHeader(h, pos);
      if (loc == null || pos + HEADER + loc.length() > size) {
        break;
      }
      Digest key = Digest.fromBytes(ByteBuffer.wrap(h.array(), 4, Digest.BYTES));
      if (key.equals(HOLE)) {
        holes++; // the space of a write that failed: skipped, never indexed
      } else if (pos + HEADER + loc.length() <= durable || dataCrc(loc) == loc.crc()) {
        index.put(key, loc);
      } else {
        torn++;
      }
      pos += HEADER + loc.length();
    }
    if (pos < size) {
      LOG.warn("disk tier {}: dropping {} unreadable bytes at offset {}", file, size - pos, pos);
      channel.truncate(pos);
    }
    if (torn > 0) {
      corruptDropped.addAndGet(torn);
      LOG.warn("disk tier {}: dropped {} entries written after the last checkpoint whose data is torn", file, torn);
    }
    end = pos;
    if (holes > 0) {
      LOG.info("disk tier {}: skipped {} holes left by failed writes", file, holes);
    }
    if (!index.isEmpty()) {
      LOG.info("disk tier {}: recovered {} entries, {} bytes ({} checkpointed)", file, index.size(), end, durable);
    }
  }

  /** The durable end recorded by the last checkpoint; 0 if none (or unreadable: then everything is verified). */
  private long readCheckpoint() {
    try {
      byte[] b = Files.readAllBytes(checkpointFile);
      ByteBuffer c = ByteBuffer.wrap(b).order(ByteOrder.LITTLE_ENDIAN);
      if (b.length == 16 && c.getInt(0) == CHECKPOINT_MAGIC && c.getInt(12) == crc(b, 12)) {
        return c.getLong(4);
      }
      LOG.warn("disk tier {}: checkpoint {} is unreadable; verifying every entry", file, checkpointFile);
    } catch (java.nio.file.NoSuchFileException e) {
      // a tier from before checkpoints, or never checkpointed: verify everything
    } catch (IOException e) {
      LOG.warn("disk tier {}: cannot read checkpoint {} ({}); verifying every entry", file, checkpointFile,
          e.toString());
    }
    return 0;
  }

  private static int crc(byte[] b, int len) {
    CRC32C c = new CRC32C();
    c.update(b, 0, len);
    return (int) c.getValue();
  }

  /** The CRC32C of an entry's data as stored, read in chunks. */
  private int dataCrc(Loc loc) throws IOException {
    CRC32C c = new CRC32C();
    ByteBuffer chunk = ByteBuffer.allocate((int) Math.min(loc.length(), 1 << 20));
    for (long pos = loc.offset(), left = loc.length(); left > 0; ) {
      chunk.clear().limit((int) Math.min(left, chunk.capacity()));
      readFully(chunk, pos);
      c.update(chunk.flip());
      pos += chunk.limit();
      left -= chunk.limit();
    }
    return (int) c.getValue();
  }

  /**
   * Makes every entry admitted so far durable (fsync), then records how far the file is durable, so that a
   * sidecar reopening the tier after a crash or a SIGKILL trusts those entries without rereading them.
   */
  public void checkpoint() throws IOException {
    synchronized (checkpointing) {
      long upTo;
      synchronized (this) {
        upTo = writing.isEmpty() ? end : writing.first(); // entries from the first still being written on: not yet
      }
      channel.force(false);
      ByteBuffer c = ByteBuffer.allocate(16).order(ByteOrder.LITTLE_ENDIAN);
      c.putInt(CHECKPOINT_MAGIC).putLong(upTo);
      c.putInt(crc(c.array(), 12)).flip();
      DurableFiles.writeAtomically(checkpointFile, c);
    }
  }

  private static Loc parseHeader(ByteBuffer h, long pos) {
    if (h.getInt(0) != MAGIC) {
      return null;
    }
    CRC32C c = new CRC32C();
    c.update(h.array(), 0, HEADER - 4);
    if ((int) c.getValue() != h.getInt(HEADER - 4)) {
      return null;
    }
    int length = h.getInt(4 + Digest.BYTES);
    return length < 0 ? null : new Loc(pos + HEADER, length, h.getInt(4 + Digest.BYTES + 4));
  }

  public boolean contains(Digest key) {
    return index.containsKey(key);
  }

  /**
   * Reads the entry into {@code dst} (exactly its length remaining). Returns false if absent, or if its data
   * fails the checksum: then the entry is dropped and counted, and the caller must refetch.
   */
  public boolean read(Digest key, ByteBuffer dst) throws IOException {
    Loc loc = index.get(key);
    if (loc == null || loc.length() != dst.remaining()) {
      return false;
    }
    int start = dst.position();
    readFully(dst, loc.offset());
    CRC32C c = new CRC32C();
    c.update(dst.duplicate().position(start).limit(start + loc.length()));
    if ((int) c.getValue() != loc.crc()) {
      index.remove(key, loc);
      corruptDropped.incrementAndGet();
      LOG.warn("disk tier {}: entry {} at offset {} failed its CRC32C check; dropped, refetching from storage",
          file, key, loc.offset() - HEADER);
      dst.position(start);
      return false;
    }
    return true;
  }

  /** Appends the remaining bytes of {@code data} if they fit; returns whether they were admitted. */
  public boolean admit(Digest key, ByteBuffer data) throws IOException {
    if (index.containsKey(key)) {
      return false;
    }
    int length = data.remaining();
    ByteBuffer h = ByteBuffer.allocate(HEADER).order(ByteOrder.LITTLE_ENDIAN);
    h.putInt(MAGIC);
    ByteBuffer digest = ByteBuffer.allocate(Digest.BYTES);
    key.write(digest);
    h.put(digest.array());
    CRC32C c = new CRC32C();
    c.update(data.duplicate());
    h.putInt(length).putInt((int) c.getValue());
    CRC32C hc = new CRC32C();
    hc.update(h.array(), 0, HEADER - 4);
    h.putInt((int) hc.getValue());
    h.flip();
    long pos;
    synchronized (this) {
      if (end + HEADER + length > capacity || index.containsKey(key)) {
        return false;
      }
      pos = end;
      end += HEADER + length;
      writing.add(pos);
    }
    boolean written = false;
    try {
      writes.write(h, pos);
      writes.write(data.duplicate(), pos + HEADER);
      index.put(key, new Loc(pos + HEADER, length, (int) c.getValue()));
      written = true;
    } finally {
      synchronized (this) {
        writing.remove(pos);
        if (!written) {
          giveBack(pos, length);
        }
      }
    }
    return true;
  }

  /** The digest a hole's header carries: no SHA-256 is all zeros. */
  static final Digest HOLE = Digest.fromBytes(ByteBuffer.allocate(Digest.BYTES));

  /**
   * The space of a failed write (disk full, EIO). The last reservation is simply given back; one with later
   * entries after it becomes a hole: a header naming {@link #HOLE} and the length, so that reopening the tier
   * steps over it instead of cutting off every entry after it. Called holding this.
   */
  private void giveBack(long pos, int length) {
    if (end == pos + HEADER + length) {
      end = pos;
      return;
    }
    ByteBuffer h = ByteBuffer.allocate(HEADER).order(ByteOrder.LITTLE_ENDIAN);
    h.putInt(MAGIC).put(new byte[Digest.BYTES]).putInt(length).putInt(0);
    CRC32C hc = new CRC32C();
    hc.update(h.array(), 0, HEADER - 4);
    h.putInt((int) hc.getValue()).flip();
    try {
      writes.write(h, pos);
    } catch (IOException e) {
      LOG.warn("disk tier {}: cannot mark the failed write at offset {} as a hole ({}); entries after it are"
          + " lost when the tier is reopened", file, pos, e.toString());
    }
  }

  private void readFully(ByteBuffer dst, long pos) throws IOException {
    while (dst.hasRemaining()) {
      int n = channel.read(dst, pos);
      if (n < 0) {
        throw new IOException("disk tier " + file + " ended at byte " + pos);
      }
      pos += n;
    }
  }

  private void writeFully(ByteBuffer src, long pos) throws IOException {
    while (src.hasRemaining()) {
      pos += channel.write(src, pos);
    }
  }

  public long capacityBytes() {
    return capacity;
  }

  public synchronized long usedBytes() {
    return end;
  }

  public long entries() {
    return index.size();
  }

  public long corruptDropped() {
    return corruptDropped.get();
  }

  public Path file() {
    return file;
  }

  /** Checkpoints, closes the file and releases the directory. */
  @Override
  public void close() throws IOException {
    try (lock; channel) {
      checkpoint();
    }
  }
}
