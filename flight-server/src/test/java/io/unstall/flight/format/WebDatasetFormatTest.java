package io.unstall.flight.format;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.ObjectMapper;
import io.unstall.flight.storage.LocalStorage;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.Map;
import org.apache.commons.compress.archivers.tar.TarArchiveEntry;
import org.apache.commons.compress.archivers.tar.TarArchiveOutputStream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class WebDatasetFormatTest {
  @TempDir Path dir;

  /** A tar of {@code members} (name -> content) in order; {@code longNames}: TarArchiveOutputStream.LONGFILE_*. */
  static byte[] tar(Map<String, byte[]> members, int longNames) throws IOException {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    try (TarArchiveOutputStream t = new TarArchiveOutputStream(out)) {
      t.setLongFileMode(longNames);
      for (var e : members.entrySet()) {
        TarArchiveEntry entry = new TarArchiveEntry(e.getKey());
        entry.setSize(e.getValue().length);
        t.putArchiveEntry(entry);
        t.write(e.getValue());
        t.closeArchiveEntry();
      }
    }
    return out.toByteArray();
  }

  static Map<String, byte[]> samples(String prefix, int n) {
    Map<String, byte[]> m = new LinkedHashMap<>();
    for (int i = 0; i < n; i++) {
      m.put(prefix + i + ".jpg", ("image " + prefix + i).repeat(i + 1).getBytes(StandardCharsets.UTF_8));
      m.put(prefix + i + ".cls", String.valueOf(i % 3).getBytes(StandardCharsets.UTF_8));
    }
    return m;
  }

  private static WebDatasetFormat format(String json) throws IOException {
    return (WebDatasetFormat)
        Formats.create("webdataset", FormatOptions.of("webdataset", new ObjectMapper().readTree(json)));
  }

  @Test
  void groupsMembersByKeyAndReadsEachSampleAsItsMembers() throws Exception {
    Map<String, byte[]> a = samples("dir/s", 3);
    a.put("__meta__", "skipped".getBytes()); // webdataset's meta rule
    a.put("README", "no dot: skipped".getBytes());
    byte[] shard0 = tar(a, TarArchiveOutputStream.LONGFILE_POSIX);
    String longKey = "x".repeat(150); // a pax path record
    Map<String, byte[]> b = new LinkedHashMap<>();
    b.put(longKey + ".JPG", "upper".getBytes());
    b.put(longKey + ".cls", " 7\n".getBytes());
    Files.write(dir.resolve("shard-0.tar"), shard0);
    Files.write(dir.resolve("shard-1.tar"), tar(b, TarArchiveOutputStream.LONGFILE_GNU));
    Files.write(dir.resolve("notes.txt"), "not a shard".getBytes());
    WebDatasetFormat f = format("{\"payload\": \"jpg;png\", \"label\": \"cls\"}");
    LocalStorage storage = new LocalStorage(dir);
    SampleIndex idx = f.index(storage, n -> {});
    assertEquals(4, idx.size());
    assertTrue(idx.labelled());
    assertEquals(Arrays.asList(0L, 1L, 2L, 7L), Arrays.asList(idx.label(0), idx.label(1), idx.label(2), idx.label(3)));
    assertEquals("shard-0.tar@0", f.key(idx, 0));
    // a sample's bytes are its members with their headers: the first starts at a header of its jpg
    ByteBuffer s1 = ByteBuffer.allocate(idx.length(1));
    f.read(storage, idx, 1, s1);
    assertArrayEquals(Arrays.copyOfRange(shard0, (int) idx.offset(1), (int) idx.offset(1) + idx.length(1)), s1.array());
    TarArchiveEntry first = new TarArchiveEntry(Arrays.copyOf(s1.array(), 512));
    assertEquals("dir/s1.jpg", first.getName());
    byte[] tail = Arrays.copyOfRange(s1.array(), s1.capacity() - 1, s1.capacity());
    assertArrayEquals("1".getBytes(), tail); // ends with its label member's data
    assertEquals("{\"payload\":[[\"jpg\",\"png\"]],\"label\":\"cls\"}", idx.layout());
  }

  @Test
  void withoutOptionsEverySampleIsKeptUnlabelled() throws Exception {
    Files.write(dir.resolve("a.tar"), tar(samples("k", 2), TarArchiveOutputStream.LONGFILE_ERROR));
    SampleIndex idx = format("{}").index(new LocalStorage(dir), n -> {});
    assertEquals(2, idx.size());
    assertFalse(idx.labelled());
    assertEquals("{\"payload\":null,\"label\":null}", idx.layout());
  }

  @Test
  void corruptAndTruncatedShardsNameFileAndOffset() throws Exception {
    byte[] good = tar(samples("s", 3), TarArchiveOutputStream.LONGFILE_ERROR);
    Path shard = dir.resolve("s.tar");
    byte[] flipped = good.clone();
    flipped[1024 + 5] ^= 0x20; // a byte of the second member's header (the first's data fits one block)
    Files.write(shard, flipped);
    CorruptRecordException bad = assertThrows(CorruptRecordException.class,
        () -> format("{}").index(new LocalStorage(dir), n -> {}));
    assertEquals("corrupt tar file '" + shard + "' at byte offset 1024: header checksum mismatch", bad.getMessage());

    Files.write(shard, Arrays.copyOf(good, 2048 + 512 + 5)); // cut inside the third member's data
    CorruptRecordException cut = assertThrows(CorruptRecordException.class,
        () -> format("{}").index(new LocalStorage(dir), n -> {}));
    assertTrue(cut.getMessage().startsWith("corrupt tar file '" + shard + "' at byte offset 2048: member 's1.jpg' of 16"
        + " bytes runs past the end"), cut.getMessage());
    // only the padding after the data is cut: read, as tarfile does
    Files.write(shard, Arrays.copyOf(good, 2048 + 512 + 16));
    assertEquals(2, format("{}").index(new LocalStorage(dir), n -> {}).size());
    assertTrue(cut.getMessage().endsWith("truncated"), cut.getMessage());

    Files.write(shard, Arrays.copyOf(good, 1024 + 100)); // cut inside a header
    CorruptRecordException half = assertThrows(CorruptRecordException.class,
        () -> format("{}").index(new LocalStorage(dir), n -> {}));
    assertEquals("corrupt tar file '" + shard + "' at byte offset 1024: truncated header (100 bytes left in the file)",
        half.getMessage());
  }

  @Test
  void optionsAreCheckedAgainstEverySample() throws Exception {
    Map<String, byte[]> m = samples("s", 2);
    m.put("s2.png", "no label".getBytes());
    Files.write(dir.resolve("s.tar"), tar(m, TarArchiveOutputStream.LONGFILE_ERROR));
    CorruptRecordException noLabel = assertThrows(CorruptRecordException.class,
        () -> format("{\"label\": \"cls\"}").index(new LocalStorage(dir), n -> {}));
    assertTrue(noLabel.getMessage().endsWith("sample 's2' has no .cls member (option label; it has png)"),
        noLabel.getMessage());
    CorruptRecordException noPayload = assertThrows(CorruptRecordException.class,
        () -> format("{\"payload\": [\"txt\"]}").index(new LocalStorage(dir), n -> {}));
    assertTrue(noPayload.getMessage().contains("sample 's0' has no .txt member (option payload"),
        noPayload.getMessage());

    m.put("s2.cls", "two".getBytes());
    Files.write(dir.resolve("s.tar"), tar(m, TarArchiveOutputStream.LONGFILE_ERROR));
    CorruptRecordException text = assertThrows(CorruptRecordException.class,
        () -> format("{\"label\": \"cls\"}").index(new LocalStorage(dir), n -> {}));
    assertTrue(text.getMessage().endsWith("member 's2.cls' (option label) holds 'two', not an integer"),
        text.getMessage());

    IllegalArgumentException unknown =
        assertThrows(IllegalArgumentException.class, () -> format("{\"labels\": \"x\"}"));
    assertEquals("format 'webdataset': unknown option 'labels' (its options: label, payload; any format's: manifest)",
        unknown.getMessage());
    IllegalArgumentException dot =
        assertThrows(IllegalArgumentException.class, () -> format("{\"payload\": \".jpg\"}"));
    assertTrue(dot.getMessage().startsWith("format 'webdataset': option 'payload' has the field '.jpg'"),
        dot.getMessage());
  }

  @Test
  void aRepeatedExtensionInOneSampleIsAnError() throws Exception {
    byte[] one = tar(Map.of("a.jpg", new byte[3]), TarArchiveOutputStream.LONGFILE_ERROR);
    byte[] twice = new byte[2048 + 1024];
    System.arraycopy(one, 0, twice, 0, 1024); // a.jpg
    System.arraycopy(one, 0, twice, 1024, 1024); // a.jpg again
    Files.write(dir.resolve("d.tar"), twice);
    CorruptRecordException e = assertThrows(CorruptRecordException.class,
        () -> format("{}").index(new LocalStorage(dir), n -> {}));
    assertTrue(e.getMessage().endsWith("at byte offset 1024: member 'a.jpg': the extension 'jpg' twice in sample 'a'"
        + " (webdataset: duplicate file name)"), e.getMessage());
  }
}
