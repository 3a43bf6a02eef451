package io.unstall.flight.format;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
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
 * Fuzz target for the TFRecord reader (docs/ARCHITECTURE.md, "Fuzzing"): arbitrary bytes as a shard on the local
 * file system, indexed and read back through {@link LocalStorage} as a registered dataset is (indexing pins the
 * shard anew, so one storage serves every input). The only error
 * allowed is {@link CorruptRecordException} naming the shard and a byte offset; an index must tile the shard
 * exactly (each record's header, data and CRC, nothing between or after), and every record either reads back
 * as its data, the same through {@link TfRecordFormat#read} and {@link TfRecordFormat#extract}, or fails its CRC
 * through both. Corpus: {@code src/test/resources/io/unstall/flight/format/TfRecordFuzzTestInputs/indexAndRead/}.
 */
class TfRecordFuzzTest {
  private static final int HEADER = 12;
  private static final int FOOTER = 4;
  private static Path dir;
  private static LocalStorage storage;

  /** On tmpfs where there is one: a fuzzing run rewrites the shard some 10^6 times. */
  @BeforeAll
  static void shardDirectory() throws IOException {
    dir = FuzzDirs.create("unstall-tfrecord-fuzz");
    storage = new LocalStorage(dir);
  }

  @AfterAll
  static void removeShardDirectory() throws IOException {
    FuzzDirs.delete(dir);
  }

  @FuzzTest
  void indexAndRead(byte[] shard) throws IOException {
    Path file = dir.resolve("train-00000.tfrecord");
    Files.write(file, shard);
    TfRecordFormat format = new TfRecordFormat();
    SampleIndex index;
    try {
      index = format.index(storage, n -> {});
    } catch (CorruptRecordException e) {
      assertNamesShardAndOffset(e, file);
      return;
    }
    ByteBuffer whole = ByteBuffer.wrap(shard);
    long pos = 0;
    for (int id = 0; id < index.size(); id++) {
      assertEquals(pos + HEADER, index.offset(id), "record " + id);
      assertEquals("train-00000.tfrecord@" + pos, format.key(index, id));
      int len = index.length(id);
      ByteBuffer read = ByteBuffer.allocate(len);
      ByteBuffer extracted = ByteBuffer.allocate(len);
      final int sample = id;
      try {
        format.read(storage, index, id, read);
      } catch (CorruptRecordException e) {
        assertNamesShardAndOffset(e, file);
        assertThrows(CorruptRecordException.class, () -> format.extract(storage, index, sample, whole, 0, extracted));
        pos += HEADER + len + FOOTER;
        continue;
      }
      format.extract(storage, index, id, whole, 0, extracted);
      int from = (int) pos + HEADER;
      assertArrayEquals(Arrays.copyOfRange(shard, from, from + len), read.array());
      assertArrayEquals(read.array(), extracted.array());
      pos += HEADER + len + FOOTER;
    }
    assertEquals(shard.length, pos, "the index must cover the shard exactly");
  }

  private static void assertNamesShardAndOffset(CorruptRecordException e, Path file) {
    assertTrue(e.getMessage().startsWith("corrupt TFRecord record in '" + file + "' at byte offset "), e.getMessage());
  }
}
