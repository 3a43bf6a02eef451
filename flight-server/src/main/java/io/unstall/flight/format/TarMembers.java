package io.unstall.flight.format;

import io.unstall.flight.storage.Storage;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import org.apache.commons.compress.archivers.tar.TarArchiveEntry;
import org.apache.commons.compress.archivers.tar.TarUtils;
import org.apache.commons.compress.archivers.zip.ZipEncodingHelper;

/**
 * Walks the members of a tar file (ustar, GNU and POSIX pax, as Python's {@code tarfile} and GNU tar write them),
 * reading only headers: each 512-byte header is checked (checksum) and decoded by commons-compress's {@link
 * TarArchiveEntry}; this class follows the member sizes, applies pax {@code path}/{@code size} records and GNU long
 * names, and insists that every member lies inside the file. Anything else is a {@link CorruptRecordException}
 * naming the file and the byte offset of the header at fault: a checksum mismatch, an unparsable field, a member
 * running past the end (a truncated file), a partial header, a sparse member.
 */
final class TarMembers {
  static final int BLOCK = 512;
  /** Pax and GNU long-name records longer than this are refused (a name is at most a few KiB). */
  private static final int MAX_EXTENDED = 1 << 20;

  /** A regular file's member: its name, where its first header starts, and its data. */
  record Member(String name, long headerOffset, long dataOffset, long size) {}

  private final Storage storage;
  private final String path;
  private final StorageChannel channel;
  private final long size;
  private final ByteBuffer header = ByteBuffer.allocate(BLOCK);
  private long pos;

  TarMembers(Storage storage, String path, long size) {
    this.storage = storage;
    this.path = path;
    this.size = size;
    this.channel = new StorageChannel(storage, path, size, 1 << 20);
  }

  /** The next regular file member, or null at the end of the archive; other members are skipped. */
  Member next() throws IOException {
    String longName = null;
    Long paxSize = null;
    long first = -1;
    while (true) {
      long at = pos;
      if (size - at < BLOCK) { // the end: nothing, the last member's padding cut short, or part of a header
        if (at < size && !zeros(at, size)) {
          throw corrupt(at, "truncated header (" + (size - at) + " bytes left in the file)");
        }
        if (first >= 0) {
          throw corrupt(first, "an extended header with no member after it");
        }
        return null;
      }
      header.clear();
      channel.readFully(at, header);
      byte[] h = header.array();
      if (allZero(h)) { // the end-of-archive marker; whatever follows is not read (as tarfile does)
        if (first >= 0) {
          throw corrupt(first, "an extended header with no member after it");
        }
        return null;
      }
      boolean sumOk;
      try {
        sumOk = TarUtils.verifyCheckSum(h);
      } catch (IllegalArgumentException ex) { // the checksum field itself is not a number
        throw corrupt(at, "unreadable header checksum (" + ex.getMessage() + ")");
      }
      if (!sumOk) {
        throw corrupt(at, "header checksum mismatch");
      }
      TarArchiveEntry e;
      try {
        e = new TarArchiveEntry(h, ZipEncodingHelper.getZipEncoding(StandardCharsets.UTF_8), false, at + BLOCK);
      } catch (IOException | RuntimeException ex) {
        throw corrupt(at, "unreadable header (" + ex.getMessage() + ")");
      }
      long dataSize = e.getSize();
      boolean extended = e.isPaxHeader() || e.isGNULongNameEntry() || e.isGNULongLinkEntry() || e.isGlobalPaxHeader();
      if (!extended && paxSize != null) {
        dataSize = paxSize;
      }
      long data = at + BLOCK;
      if (dataSize < 0 || dataSize > size - data) {
        throw corrupt(at, "member '" + e.getName() + "' of " + dataSize + " bytes runs past the end of the file ("
            + size + " bytes): truncated");
      }
      pos = data + (dataSize + BLOCK - 1) / BLOCK * BLOCK;
      if (first < 0) {
        first = at;
      }
      if (e.isPaxHeader()) {
        String[] sizeAndPath = pax(at, data, dataSize);
        paxSize = sizeAndPath[0] == null ? null : Long.parseLong(sizeAndPath[0]);
        longName = sizeAndPath[1] != null ? sizeAndPath[1] : longName;
        continue;
      }
      if (e.isGNULongNameEntry()) {
        longName = trimNul(new String(extendedBytes(at, data, dataSize), StandardCharsets.UTF_8));
        continue;
      }
      if (e.isGNULongLinkEntry() || e.isGlobalPaxHeader()) {
        continue;
      }
      if (e.isSparse()) {
        throw corrupt(at, "member '" + e.getName() + "' is a sparse file, which unstall does not read");
      }
      // directories, links, devices: skipped, as webdataset does
      if (!isRegular(h[156], longName != null ? longName : e.getName())) {
        first = -1;
        longName = null;
        paxSize = null;
        continue;
      }
      return new Member(longName != null ? longName : e.getName(), first, data, dataSize);
    }
  }

  /** Reads a small member's data (a label) whole. */
  byte[] read(Member m, int max) throws IOException {
    if (m.size() > max) {
      throw corrupt(m.headerOffset(), "member '" + m.name() + "' has " + m.size() + " bytes, more than " + max);
    }
    ByteBuffer b = ByteBuffer.allocate((int) m.size());
    channel.readFully(m.dataOffset(), b);
    return b.array();
  }

  private byte[] extendedBytes(long at, long data, long len) throws IOException {
    if (len > MAX_EXTENDED) {
      throw corrupt(at, "extended header of " + len + " bytes (at most " + MAX_EXTENDED + ")");
    }
    ByteBuffer b = ByteBuffer.allocate((int) len);
    channel.readFully(data, b);
    return b.array();
  }

  /** The {@code size} and {@code path} records of a pax header ("LEN key=value\n" each), strictly parsed. */
  private String[] pax(long at, long data, long len) throws IOException {
    byte[] b = extendedBytes(at, data, len);
    String[] out = new String[2];
    int i = 0;
    while (i < b.length) {
      int sp = i;
      long recLen = 0;
      while (sp < b.length && b[sp] >= '0' && b[sp] <= '9' && sp - i < 10) {
        recLen = recLen * 10 + (b[sp] - '0');
        sp++;
      }
      if (sp == i || sp >= b.length || b[sp] != ' ' || recLen <= sp - i + 1 || i + recLen > b.length
          || b[(int) (i + recLen - 1)] != '\n') {
        throw corrupt(at, "malformed pax record at byte " + i + " of its extended header");
      }
      String rec = new String(b, sp + 1, (int) (i + recLen - sp - 2), StandardCharsets.UTF_8);
      int eq = rec.indexOf('=');
      if (eq <= 0) {
        throw corrupt(at, "malformed pax record at byte " + i + " of its extended header");
      }
      String key = rec.substring(0, eq);
      String value = rec.substring(eq + 1);
      if (key.equals("size")) {
        if (value.isEmpty() || value.length() > 18 || !value.chars().allMatch(c -> c >= '0' && c <= '9')) {
          throw corrupt(at, "pax size '" + value + "' is not a byte count");
        }
        out[0] = value;
      } else if (key.equals("path")) {
        out[1] = value;
      }
      i += (int) recLen;
    }
    return out;
  }

  private boolean zeros(long from, long to) throws IOException {
    ByteBuffer b = ByteBuffer.allocate((int) (to - from));
    channel.readFully(from, b);
    return allZero(b.array());
  }

  private static boolean allZero(byte[] b) {
    for (byte x : b) {
      if (x != 0) {
        return false;
      }
    }
    return true;
  }

  /** Python's {@code TarInfo.isreg()}: types '0', '7' and the old '\0' (unless its name ends in '/'). */
  private static boolean isRegular(byte type, String name) {
    return type == '0' || type == '7' || (type == 0 && !name.endsWith("/"));
  }

  private static String trimNul(String s) {
    int end = s.indexOf('\0');
    return end < 0 ? s : s.substring(0, end);
  }

  CorruptRecordException corrupt(long offset, String what) {
    return new CorruptRecordException(storage.describe(path), offset, "corrupt tar file '" + storage.describe(path)
        + "' at byte offset " + offset + ": " + what);
  }
}
