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
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.List;
import java.util.zip.CRC32C;

/**
 * A dataset's {@link SampleIndex}, as a file next to its persisted manifest, for formats whose indexing reads the
 * files ({@code Format#persistsIndex}): a restarted sidecar, or a registration after it, loads it instead of
 * rereading every header, row or member, as long as nothing changed: the same format, location and options, the
 * same listing of objects under the root, and each indexed file at the size and version it had ({@link
 * Storage#version}: a rewrite changes it). Otherwise, or if the file is torn or corrupt, the dataset is indexed
 * again. Written atomically and durably, with a CRC32C at the end.
 *
 * <pre>"UNSI" u8 version=1 | str identity | byte[32] listing | u32 files | files x (str path | u64 size | str version)
 * | u8 labelled | str layout | u32 n | n x (u32 file | u64 offset | u32 length | u64 label) | u32 crc32c
 * (str: u32 length, UTF-8)</pre>
 */
final class PersistedIndexes {
  private static final byte[] MAGIC = {'U', 'N', 'S', 'I'};
  private static final byte VERSION = 1;

  private PersistedIndexes() {}

  /** Writes {@code index} of {@code storage} under {@code identity} to {@code file}. */
  static void write(Path file, String identity, Storage storage, SampleIndex index) throws IOException {
    List<String> files = index.files();
    List<byte[]> strings = new ArrayList<>();
    long size = 4 + 1 + 32 + 4 + 1 + 4 + 4 + (long) index.size() * 24 + 4;
    for (String s : header(identity, index.layout())) {
      strings.add(s.getBytes(StandardCharsets.UTF_8));
    }
    for (String f : files) {
      strings.add(f.getBytes(StandardCharsets.UTF_8));
      strings.add(storage.version(f).getBytes(StandardCharsets.UTF_8));
      size += 8;
    }
    for (byte[] s : strings) {
      size += 4 + s.length;
    }
    if (size > Integer.MAX_VALUE - 8) {
      return; // an index of ~90M samples: rebuilt at each registration rather than persisted
    }
    ByteBuffer b = ByteBuffer.allocate((int) size).order(ByteOrder.LITTLE_ENDIAN);
    b.put(MAGIC).put(VERSION);
    put(b, strings.get(0));
    b.put(listing(storage));
    b.putInt(files.size());
    for (int i = 0; i < files.size(); i++) {
      put(b, strings.get(2 + 2 * i));
      b.putLong(storage.size(files.get(i)));
      put(b, strings.get(3 + 2 * i));
    }
    b.put((byte) (index.labelled() ? 1 : 0));
    put(b, strings.get(1));
    b.putInt(index.size());
    java.util.Map<String, Integer> fileNo = new java.util.HashMap<>();
    for (int i = 0; i < files.size(); i++) {
      fileNo.put(files.get(i), i);
    }
    for (int i = 0; i < index.size(); i++) {
      b.putInt(fileNo.get(index.file(i))).putLong(index.offset(i)).putInt(index.length(i)).putLong(index.label(i));
    }
    b.putInt(crc(b.array(), b.position()));
    Files.createDirectories(file.toAbsolutePath().getParent());
    DurableFiles.writeAtomically(file, b.flip());
  }

  /**
   * The index persisted in {@code file} if it still describes {@code storage} under {@code identity} (each of its
   * files pinned again), else null: changed, torn, corrupt or of another version.
   */
  static SampleIndex read(Path file, String identity, Storage storage) throws IOException {
    if (!Files.exists(file)) {
      return null;
    }
    byte[] bytes = Files.readAllBytes(file);
    if (bytes.length < 9 || crc(bytes, bytes.length - 4)
        != ByteBuffer.wrap(bytes, bytes.length - 4, 4).order(ByteOrder.LITTLE_ENDIAN).getInt()) {
      return null;
    }
    ByteBuffer b = ByteBuffer.wrap(bytes, 0, bytes.length - 4).order(ByteOrder.LITTLE_ENDIAN);
    try {
      byte[] magic = new byte[4];
      b.get(magic);
      if (!java.util.Arrays.equals(magic, MAGIC) || b.get() != VERSION || !identity.equals(str(b))) {
        return null;
      }
      byte[] list = new byte[32];
      b.get(list);
      if (!java.util.Arrays.equals(list, listing(storage))) {
        return null;
      }
      int nFiles = b.getInt();
      List<String> files = new ArrayList<>();
      for (int i = 0; i < nFiles; i++) {
        String f = str(b);
        long size = b.getLong();
        String version = str(b);
        if (storage.pin(f) != size || !storage.version(f).equals(version)) {
          return null;
        }
        files.add(f);
      }
      boolean labelled = b.get() == 1;
      SampleIndex.Builder out = new SampleIndex.Builder(labelled).layout(str(b));
      files.forEach(out::file);
      int n = b.getInt();
      for (int i = 0; i < n; i++) {
        out.add(b.getInt(), b.getLong(), b.getInt(), b.getLong());
      }
      return b.hasRemaining() ? null : out.build();
    } catch (java.nio.BufferUnderflowException | IndexOutOfBoundsException | IllegalArgumentException
        | java.io.FileNotFoundException | java.nio.file.NoSuchFileException e) {
      return null; // a file of the index is gone, or the bytes are not an index: index again
    }
  }

  private static String[] header(String identity, String layout) {
    return new String[] {identity, layout};
  }

  /** SHA-256 of the objects under the root, in order: a file added or removed makes another listing. */
  private static byte[] listing(Storage storage) throws IOException {
    try {
      MessageDigest md = MessageDigest.getInstance("SHA-256");
      for (String p : storage.listObjects("")) {
        md.update((p + "\n").getBytes(StandardCharsets.UTF_8));
      }
      return md.digest();
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }

  private static void put(ByteBuffer b, byte[] s) {
    b.putInt(s.length).put(s);
  }

  private static String str(ByteBuffer b) {
    int len = b.getInt();
    if (len < 0 || len > b.remaining()) {
      throw new IllegalArgumentException("string of " + len + " bytes");
    }
    byte[] s = new byte[len];
    b.get(s);
    return new String(s, StandardCharsets.UTF_8);
  }

  private static int crc(byte[] b, int len) {
    CRC32C c = new CRC32C();
    c.update(b, 0, len);
    return (int) c.getValue();
  }
}
