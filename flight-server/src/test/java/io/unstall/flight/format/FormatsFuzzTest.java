package io.unstall.flight.format;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.code_intelligence.jazzer.junit.FuzzTest;
import io.unstall.flight.storage.LocalStorage;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;

/**
 * Fuzz targets for the parsers of the webdataset, npy and csv formats (docs/ARCHITECTURE.md, "Fuzzing"): arbitrary
 * bytes as a tar shard, a .npy file or a CSV file on the local file system, indexed and read back as a registered
 * dataset is. The only error allowed is {@link CorruptRecordException} naming the file and a byte offset; an index
 * must hold samples inside the file, in order and without overlap, each read back as the file's bytes there.
 * Corpus: {@code src/test/resources/io/unstall/flight/format/FormatsFuzzTestInputs/<method>/}.
 */
class FormatsFuzzTest {
  private static Path dir;

  /** On tmpfs where there is one: a fuzzing run rewrites the file some 10^6 times. */
  @BeforeAll
  static void directory() throws IOException {
    dir = FuzzDirs.create("unstall-formats-fuzz");
  }

  @AfterAll
  static void remove() throws IOException {
    FuzzDirs.delete(dir);
  }

  @FuzzTest
  void tarShard(byte[] bytes) throws IOException {
    check("shard-0.tar", "webdataset", bytes);
  }

  @FuzzTest
  void npyFile(byte[] bytes) throws IOException {
    check("x.npy", "npy", bytes);
  }

  @FuzzTest
  void csvFile(byte[] bytes) throws IOException {
    check("t.csv", "csv", bytes);
  }

  private static void check(String name, String format, byte[] bytes) throws IOException {
    Path file = dir.resolve(name);
    Files.write(file, bytes);
    LocalStorage storage = new LocalStorage(file);
    Format f = Formats.byName(format);
    SampleIndex index;
    try {
      index = f.index(storage, n -> {});
    } catch (CorruptRecordException e) {
      assertTrue(e.getMessage().contains("'" + file + "' at byte offset "), e.getMessage());
      return;
    }
    long end = 0;
    for (int id = 0; id < index.size(); id++) {
      long off = index.offset(id);
      int len = index.length(id);
      assertTrue(off >= end && off + len <= bytes.length, "sample " + id + " at " + off + "+" + len);
      ByteBuffer read = ByteBuffer.allocate(len);
      f.read(storage, index, id, read);
      assertArrayEquals(Arrays.copyOfRange(bytes, (int) off, (int) off + len), read.array());
      end = off + len;
    }
    assertTrue(index.files().size() <= 1, "one file, at most");
  }
}
