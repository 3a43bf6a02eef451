package io.unstall.flight.dataset;

import io.unstall.flight.format.SampleIndex;
import io.unstall.flight.fs.DurableFiles;
import io.unstall.flight.storage.Storage;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.zip.CRC32C;

/**
 * A dataset's index saved next to its manifest ({@code <id>.index}), for formats whose indexing reads the data
 * (Parquet decodes every row group): a restarted sidecar registering the same dataset loads it instead. It is
 * used only while the dataset is unchanged: the same format and options, location, listing, and each file's
 * version as pinned now (size, mtime, edge CRCs, inode and ctime; an S3 ETag). A torn, corrupt or stale file is
 * ignored: the dataset is indexed again and the file rewritten. Layout (little-endian): magic {@code UNSX}, u8
 * version, UTF-8 header (format spec, location, listing; u32 length each), u32 files, per file its path and
 * version, u8 labelled, u32 samples, per sample (u32 file, i64 offset, i32 length, i64 label), u32 CRC32C of all.
 */
final class PersistedIndexes {
  private static final byte[] MAGIC = {'U', 'N', 'S', 'X'};
  private static final byte VERSION = 1;
  private static final int ROW = 4 + 8 + 4 + 8;

  private PersistedIndexes() {}

  static void write(Path file, String spec, Storage storage, SampleIndex index) throws IOException {
    List<String> files = index.files();
    byte[][] head = {utf8(spec), utf8(storage.uri()), utf8(listing(storage))};
    byte[][] names = new byte[files.size() * 2][];
    long size = MAGIC.length + 1 + 4L + 1 + 4 + 4 + (long) ROW * index.size();
    for (byte[] h : head) {
      size += 4 + h.length;
    }
    for (int i = 0; i < files.size(); i++) {
      names[2 * i] = utf8(files.get(i));
      names[2 * i + 1] = utf8(storage.version(files.get(i)));
      size += 8 + names[2 * i].length + names[2 * i + 1].length;
    }
    ByteBuffer b = ByteBuffer.allocate(Math.toIntExact(size)).order(ByteOrder.LITTLE_ENDIAN);
    b.put(MAGIC).put(VERSION);
    for (byte[] h : head) {
      b.putInt(h.length).put(h);
    }
    b.putInt(files.size());
    for (byte[] n : names) {
      b.putInt(n.length).put(n);
    }
    b.put((byte) (index.labelled() ? 1 : 0)).putInt(index.size());
    java.util.Map<String, Integer> fileNos = new java.util.HashMap<>();
    for (int i = 0; i < files.size(); i++) {
      fileNos.put(files.get(i), i);
    }
    for (int id = 0; id < index.size(); id++) {
      b.putInt(fileNos.get(index.file(id))).putLong(index.offset(id)).putInt(index.length(id)).putLong(index.label(id));
    }
    b.putInt(crc(b.array(), b.position()));
    Files.createDirectories(file.toAbsolutePath().getParent());
    DurableFiles.writeAtomically(file, b.flip());
  }

  /**
   * The index saved in {@code file} if it is intact and the dataset unchanged (its files pinned again here), else
   * null; {@code why} receives the reason it is not used.
   */
  static SampleIndex load(Path file, String spec, Storage storage, java.util.function.Consumer<String> why)
      throws IOException {
    byte[] all = Files.readAllBytes(file);
    if (all.length < MAGIC.length + 5 || crc(all, all.length - 4)
        != ByteBuffer.wrap(all, all.length - 4, 4).order(ByteOrder.LITTLE_ENDIAN).getInt()) {
      why.accept("it is torn or corrupt (CRC32C)");
      return null;
    }
    ByteBuffer b = ByteBuffer.wrap(all, 0, all.length - 4).order(ByteOrder.LITTLE_ENDIAN);
    byte[] magic = new byte[4];
    b.get(magic);
    if (!java.util.Arrays.equals(magic, MAGIC) || b.get() != VERSION) {
      why.accept("it is not an index of this version");
      return null;
    }
    if (!string(b).equals(spec) || !string(b).equals(storage.uri())) {
      why.accept("it is of another format, options or location");
      return null;
    }
    if (!string(b).equals(listing(storage))) {
      why.accept("files were added or removed");
      return null;
    }
    int files = b.getInt();
    SampleIndex.Builder builder = null;
    String[] paths = new String[files];
    for (int i = 0; i < files; i++) {
      paths[i] = string(b);
      String version = string(b);
      storage.pin(paths[i]);
      if (!storage.version(paths[i]).equals(version)) {
        why.accept("'" + storage.describe(paths[i]) + "' changed");
        return null;
      }
    }
    builder = new SampleIndex.Builder(b.get() == 1);
    for (String p : paths) {
      builder.file(p);
    }
    int n = b.getInt();
    for (int id = 0; id < n; id++) {
      builder.add(b.getInt(), b.getLong(), b.getInt(), b.getLong());
    }
    return builder.build();
  }

  /** Every object under the root, as one string: a new or removed file changes it. */
  private static String listing(Storage storage) throws IOException {
    return String.join("\n", storage.listObjects(""));
  }

  private static byte[] utf8(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  private static String string(ByteBuffer b) {
    byte[] s = new byte[b.getInt()];
    b.get(s);
    return new String(s, StandardCharsets.UTF_8);
  }

  private static int crc(byte[] b, int len) {
    CRC32C c = new CRC32C();
    c.update(b, 0, len);
    return (int) c.getValue();
  }
}
