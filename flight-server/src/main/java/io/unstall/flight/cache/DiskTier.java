package io.unstall.flight.cache;

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
 * served. The file survives restarts: opening it rescans the headers and truncates an unreadable tail.
 *
 * <pre>entry: "UNSD" | digest[32] | u32 length | u32 dataCrc | u32 headerCrc | data[length]   (little-endian)</pre>
 */
public final class DiskTier implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(DiskTier.class);
  static final int MAGIC = 0x44534e55; // "UNSD" little-endian
  static final int HEADER = 4 + Digest.BYTES + 4 + 4 + 4;
  public static final String FILE = "tier.data";

  private record Loc(long offset, int length, int crc) {}

  private final Path file;
  private final FileChannel channel;
  private final long capacity;
  private final ConcurrentHashMap<Digest, Loc> index = new ConcurrentHashMap<>();
  private final AtomicLong corruptDropped = new AtomicLong();
  private long end; // guarded by this

  public DiskTier(Path dir, long capacityBytes) throws IOException {
    Files.createDirectories(dir);
    this.file = dir.resolve(FILE);
    this.capacity = capacityBytes;
    this.channel =
        FileChannel.open(file, StandardOpenOption.CREATE, StandardOpenOption.READ, StandardOpenOption.WRITE);
    recover();
  }

  /** Rebuilds the index from the headers; an unreadable or truncated tail is cut off. */
  private void recover() throws IOException {
    long size = channel.size();
    long pos = 0;
    ByteBuffer h = ByteBuffer.allocate(HEADER).order(ByteOrder.LITTLE_ENDIAN);
    while (pos + HEADER <= size) {
      h.clear();
      readFully(h, pos);
      h.flip();
      Loc loc = parseHeader(h, pos);
      if (loc == null || pos + HEADER + loc.length() > size) {
        break;
      }
      index.put(Digest.fromBytes(ByteBuffer.wrap(h.array(), 4, Digest.BYTES)), loc);
      pos += HEADER + loc.length();
    }
    if (pos < size) {
      LOG.warn("disk tier {}: dropping {} unreadable bytes at offset {}", file, size - pos, pos);
      channel.truncate(pos);
    }
    end = pos;
    if (!index.isEmpty()) {
      LOG.info("disk tier {}: recovered {} entries, {} bytes", file, index.size(), end);
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
    }
    writeFully(h, pos);
    writeFully(data.duplicate(), pos + HEADER);
    index.put(key, new Loc(pos + HEADER, length, (int) c.getValue()));
    return true;
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

  @Override
  public void close() throws IOException {
    channel.force(false);
    channel.close();
  }
}
