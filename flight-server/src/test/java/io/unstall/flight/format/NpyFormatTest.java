package io.unstall.flight.format;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.ObjectMapper;
import io.unstall.flight.storage.LocalStorage;
import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.zip.CRC32;
import java.util.zip.ZipEntry;
import java.util.zip.ZipOutputStream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class NpyFormatTest {
  @TempDir Path dir;

  /** A .npy file (version 1) as numpy.save writes it: header padded to 64 bytes, then {@code data}. */
  static byte[] npy(String descr, String shape, byte[] data) {
    String dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
    int pad = 64 - (10 + dict.length() + 1) % 64;
    String header = dict + " ".repeat(pad % 64) + "\n";
    ByteBuffer b = ByteBuffer.allocate(10 + header.length() + data.length).order(ByteOrder.LITTLE_ENDIAN);
    b.put(new byte[] {(byte) 0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0}).putShort((short) header.length());
    b.put(header.getBytes(StandardCharsets.ISO_8859_1)).put(data);
    return b.array();
  }

  static byte[] int64s(long... v) {
    ByteBuffer b = ByteBuffer.allocate(8 * v.length).order(ByteOrder.LITTLE_ENDIAN);
    for (long x : v) {
      b.putLong(x);
    }
    return b.array();
  }

  static byte[] counting(int n) {
    byte[] b = new byte[n];
    for (int i = 0; i < n; i++) {
      b[i] = (byte) i;
    }
    return b;
  }

  /** An npz of {@code name -> npy bytes}, each stored or deflated. */
  static byte[] npz(boolean stored, Object... nameAndBytes) throws Exception {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    try (ZipOutputStream z = new ZipOutputStream(out)) {
      for (int i = 0; i < nameAndBytes.length; i += 2) {
        byte[] data = (byte[]) nameAndBytes[i + 1];
        ZipEntry e = new ZipEntry(nameAndBytes[i] + ".npy");
        if (stored) {
          CRC32 crc = new CRC32();
          crc.update(data);
          e.setMethod(ZipEntry.STORED);
          e.setSize(data.length);
          e.setCrc(crc.getValue());
        }
        z.putNextEntry(e);
        z.write(data);
        z.closeEntry();
      }
    }
    return out.toByteArray();
  }

  private static Format format(String name, String json) throws Exception {
    return Formats.create(name, FormatOptions.of(name, new ObjectMapper().readTree(json)));
  }

  private static byte[] read(Format f, LocalStorage s, SampleIndex idx, int id) throws Exception {
    ByteBuffer b = ByteBuffer.allocate(idx.length(id));
    f.read(s, idx, id, b);
    return b.array();
  }

  @Test
  void npyShardsAreRowsWithLabelsFromAFileBeside() throws Exception {
    byte[] a = counting(2 * 3 * 4); // 2 rows of 3 uint32... as '<u4' (3,) rows: 12 bytes each
    byte[] b = Arrays.copyOfRange(counting(100), 50, 62);
    Files.write(dir.resolve("x-0.npy"), npy("<u4", "(2, 3)", a));
    Files.write(dir.resolve("x-1.npy"), npy("<u4", "(1, 3)", b));
    Files.write(dir.resolve("y.npy"), npy("<i8", "(3,)", int64s(5, -1, 9)));
    Format f = format("npy", "{\"label\": \"y.npy\"}");
    LocalStorage s = new LocalStorage(dir);
    SampleIndex idx = f.index(s, n -> {});
    assertEquals(3, idx.size());
    assertArrayEquals(Arrays.copyOfRange(a, 12, 24), read(f, s, idx, 1));
    assertArrayEquals(b, read(f, s, idx, 2));
    assertEquals(Arrays.asList(5L, -1L, 9L), Arrays.asList(idx.label(0), idx.label(1), idx.label(2)));
    assertEquals("{\"dtype\":\"<u4\",\"shape\":[3],\"label\":\"y.npy\"}", idx.layout());
    assertEquals("x-0.npy@" + (128 + 12), f.key(idx, 1));
  }

  @Test
  void npzStoredArrayByName() throws Exception {
    byte[] x = counting(4 * 2);
    Files.write(dir.resolve("d.npz"), npz(true, "x_train", npy("|u1", "(4, 2)", x), "y_train",
        npy("<i8", "(4,)", int64s(0, 1, 2, 3))));
    Format f = format("npz", "{\"array\": \"x_train\", \"label\": \"y_train\"}");
    LocalStorage s = new LocalStorage(dir.resolve("d.npz"));
    SampleIndex idx = f.index(s, n -> {});
    assertEquals(4, idx.size());
    for (int i = 0; i < 4; i++) {
      assertArrayEquals(Arrays.copyOfRange(x, 2 * i, 2 * i + 2), read(f, s, idx, i));
      assertEquals(i, idx.label(i));
    }
    IllegalArgumentException which =
        assertThrows(IllegalArgumentException.class, () -> format("npz", "{}").index(s, n -> {}));
    assertTrue(which.getMessage().endsWith("holds the arrays x_train, y_train; choose one with option 'array'"),
        which.getMessage());
  }

  @Test
  void compressedNpzMembersAreRefusedByName() throws Exception {
    Files.write(dir.resolve("c.npz"), npz(false, "x", npy("<f8", "(2,)", new byte[16])));
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> format("npz", "{}").index(new LocalStorage(dir), n -> {}));
    assertTrue(
        e.getMessage().startsWith("format 'npz': member 'x.npy' of '" + dir.resolve("c.npz") + "' is compressed"),
        e.getMessage());
  }

  @Test
  void truncatedAndCorruptFilesNameFileAndOffset() throws Exception {
    byte[] whole = npy("<f4", "(4, 2)", new byte[32]);
    Path p = dir.resolve("t.npy");
    Files.write(p, Arrays.copyOf(whole, whole.length - 5));
    CorruptRecordException cut = assertThrows(CorruptRecordException.class,
        () -> format("npy", "{}").index(new LocalStorage(p), n -> {}));
    assertTrue(cut.getMessage().startsWith("corrupt npy file '" + p + "' at byte offset " + (128 + 3 * 8) + ": "),
        cut.getMessage());
    assertTrue(cut.getMessage().endsWith(": truncated"), cut.getMessage());
    byte[] bad = whole.clone();
    bad[20] = '"'; // inside the dict
    Files.write(p, bad);
    CorruptRecordException header = assertThrows(CorruptRecordException.class,
        () -> format("npy", "{}").index(new LocalStorage(p), n -> {}));
    assertTrue(
        header.getMessage().startsWith("corrupt npy file '" + p + "' at byte offset 0: .npy header is not a dict"),
        header.getMessage());
    Files.write(p, npy("|O", "(2,)", new byte[16]));
    CorruptRecordException objects = assertThrows(CorruptRecordException.class,
        () -> format("npy", "{}").index(new LocalStorage(p), n -> {}));
    assertTrue(objects.getMessage().contains("dtype '|O' is not a plain"), objects.getMessage());
  }

  @Test
  void headerParsing() {
    NpyHeader h = NpyHeader.parse(npy(">U3", "(10, 2, 5)", new byte[0]));
    assertEquals(12, h.itemSize());
    assertEquals(10, h.rows());
    assertEquals(12 * 10, h.rowBytes());
    byte[] fortran = new String(npy("<f8", "(3, 3)", new byte[0]), StandardCharsets.ISO_8859_1)
        .replace("False", "True ").getBytes(StandardCharsets.ISO_8859_1);
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> NpyHeader.parse(fortran));
    assertTrue(e.getMessage().contains("Fortran order"), e.getMessage());
    assertThrows(IllegalArgumentException.class, () -> NpyHeader.parse(npy("<f8", "()", new byte[0])));
  }
}
