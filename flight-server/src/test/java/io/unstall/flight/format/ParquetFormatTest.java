package io.unstall.flight.format;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.ObjectMapper;
import io.unstall.flight.storage.LocalStorage;
import java.io.ByteArrayInputStream;
import java.nio.ByteBuffer;
import java.nio.channels.Channels;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.List;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.VectorLoader;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ReadChannel;
import org.apache.arrow.vector.ipc.message.ArrowRecordBatch;
import org.apache.arrow.vector.ipc.message.MessageSerializer;
import org.apache.arrow.vector.types.pojo.Schema;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Parquet files written by pyarrow ({@code src/test/resources/formats/make_fixtures.py}): every row's payload
 * decodes, with the schema the description carries, to the values the generator wrote; labels come from the
 * label column; a truncated or corrupt file is an error naming the file and where.
 */
class ParquetFormatTest {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final int ROWS = 10;
  @TempDir Path dir;
  private final BufferAllocator root = new RootAllocator(64 << 20);

  @AfterEach
  void closeRoot() {
    root.close(); // a leaked row group would fail here
  }

  static Path fixture(String name) throws Exception {
    return Path.of(ParquetFormatTest.class.getResource("/formats/" + name).toURI());
  }

  private Format open(String options) throws Exception {
    Format f = Formats.create("parquet", FormatOptions.of("parquet", JSON.readTree(options)));
    f.decodeIn("t", root);
    return f;
  }

  private static com.fasterxml.jackson.databind.JsonNode layout(SampleIndex idx) throws Exception {
    return JSON.readTree(idx.layout());
  }

  /** The rows of {@code format}'s dataset as Arrow's Java reader sees their payloads. */
  private List<List<Object>> rows(Format format, SampleIndex idx, LocalStorage storage) throws Exception {
    byte[] schemaBytes = Base64.getDecoder().decode(layout(idx).get("arrow_schema").asText());
    Schema schema = MessageSerializer.deserializeSchema(
        new ReadChannel(Channels.newChannel(new ByteArrayInputStream(schemaBytes))));
    List<List<Object>> out = new ArrayList<>();
    for (int id = 0; id < idx.size(); id++) {
      ByteBuffer dst = ByteBuffer.allocate(idx.length(id));
      format.read(storage, idx, id, dst);
      assertFalse(dst.hasRemaining(), "row " + id + " fills its indexed length");
      try (ArrowRecordBatch batch = MessageSerializer.deserializeRecordBatch(
              new ReadChannel(Channels.newChannel(new ByteArrayInputStream(dst.array()))), root);
          VectorSchemaRoot one = VectorSchemaRoot.create(schema, root)) {
        new VectorLoader(one).load(batch);
        assertEquals(1, one.getRowCount());
        List<Object> row = new ArrayList<>();
        for (var v : one.getFieldVectors()) {
          Object o = v.getObject(0);
          row.add(o == null ? null : o instanceof byte[] b ? Arrays.toString(b) : o.toString());
        }
        out.add(row);
      }
    }
    return out;
  }

  private static byte[] read(Format f, SampleIndex idx, LocalStorage storage, int id) throws Exception {
    ByteBuffer dst = ByteBuffer.allocate(idx.length(id));
    f.read(storage, idx, id, dst);
    return dst.array();
  }

  /** What make_fixtures.py wrote in row {@code k}, as strings (Arrow's Java getObject, printed). */
  private static List<Object> expected(int k) {
    List<String> v = new ArrayList<>();
    for (int j = 0; j < k % 3; j++) {
      v.add(String.valueOf(k + j / 2.0));
    }
    return Arrays.asList(String.valueOf(k * 3L), String.valueOf(k / 4.0f), k % 4 == 3 ? null : "row " + k,
        k == 5 ? null : "[" + String.join(",", v) + "]", Arrays.toString(repeat((byte) k, k)),
        String.valueOf((byte) -k), String.valueOf((char) (k * 1000)));
  }

  private static byte[] repeat(byte b, int n) {
    byte[] out = new byte[n];
    Arrays.fill(out, b);
    return out;
  }

  @Test
  void everyRowOfEveryRowGroupDecodesToWhatPyarrowWrote() throws Exception {
    for (String file : List.of("rows.parquet", "rows-zstd.parquet")) {
      LocalStorage storage = new LocalStorage(fixture(file));
      try (Format f = open("{\"columns\": [\"x\", \"f\", \"s\", \"v\", \"b\", \"i8\", \"u16\"], \"label\": \"y\"}")) {
        List<Long> progress = new ArrayList<>();
        SampleIndex idx = f.index(storage, progress::add);
        assertEquals(ROWS, idx.size());
        assertEquals(ROWS, progress.size());
        assertTrue(idx.labelled());
        assertFalse(f.coalesces());
        for (int k = 0; k < ROWS; k++) {
          assertEquals(k % 3, idx.label(k));
          assertEquals(file + "#" + k, f.key(idx, k));
        }
        List<List<Object>> rows = rows(f, idx, storage);
        for (int k = 0; k < ROWS; k++) {
          assertEquals(expected(k), rows.get(k), file + " row " + k);
        }
        // the same bytes however often, and in whatever order, a row is built (content-addressed caches)
        List<byte[]> forward = new ArrayList<>();
        for (int k = 0; k < ROWS; k++) {
          forward.add(read(f, idx, storage, k));
        }
        // 4 threads at once, in random orders, from the same decoded row groups (the assembler's I/O pool does this)
        java.util.concurrent.ExecutorService pool = java.util.concurrent.Executors.newFixedThreadPool(4);
        try {
          List<java.util.concurrent.Future<?>> done = new ArrayList<>();
          for (int t = 0; t < 4; t++) {
            java.util.Random random = new java.util.Random(t);
            done.add(pool.submit(() -> {
              for (int n = 0; n < 500; n++) {
                int k = random.nextInt(ROWS);
                org.junit.jupiter.api.Assertions.assertArrayEquals(
                    forward.get(k), read(f, idx, storage, k), "row " + k);
              }
              return null;
            }));
          }
          for (var d : done) {
            d.get();
          }
        } finally {
          pool.shutdown();
        }
        assertEquals(List.of("x", "f", "s", "v", "b", "i8", "u16"),
            JSON.convertValue(layout(idx).get("columns"), List.class));
      }
    }
  }

  @Test
  void columnsDefaultToAllButTheLabelAndADirectoryIsItsFilesInOrder() throws Exception {
    Files.copy(fixture("rows.parquet"), dir.resolve("a.parquet"));
    Files.copy(fixture("rows-zstd.parquet"), dir.resolve("b.parquet"));
    Files.writeString(dir.resolve("_SUCCESS"), "");
    LocalStorage storage = new LocalStorage(dir);
    try (Format f = open("{\"label\": \"y\"}")) {
      SampleIndex idx = f.index(storage, n -> {});
      assertEquals(2 * ROWS, idx.size());
      assertEquals(List.of("a.parquet", "b.parquet"), idx.files());
      assertEquals(List.of("x", "f", "s", "v", "b", "i8", "u16"),
          JSON.convertValue(layout(idx).get("columns"), List.class));
      List<List<Object>> rows = rows(f, idx, storage);
      assertEquals(expected(7), rows.get(ROWS + 7));
    }
    try (Format f = open("{\"columns\": \"s\"}")) {
      SampleIndex idx = f.index(storage, n -> {});
      assertFalse(idx.labelled());
      assertEquals(Arrays.asList((Object) null), rows(f, idx, storage).get(3));
      assertNull(layout(idx).get("label"));
    }
  }

  @Test
  void optionsAndColumnsAreChecked() throws Exception {
    LocalStorage storage = new LocalStorage(fixture("rows.parquet"));
    IllegalArgumentException unknown =
        assertThrows(IllegalArgumentException.class, () -> open("{\"colums\": [\"x\"]}"));
    assertTrue(unknown.getMessage().contains("unknown option 'colums'"), unknown.getMessage());
    try (Format f = open("{\"columns\": [\"nope\"]}")) {
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> f.index(storage, n -> {}));
      assertTrue(e.getMessage().contains("has no column 'nope'"), e.getMessage());
      assertTrue(e.getMessage().contains("rows.parquet"), e.getMessage());
    }
    try (Format f = open("{\"label\": \"s\"}")) {
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> f.index(storage, n -> {}));
      assertTrue(e.getMessage().contains("label column 's'") && e.getMessage().contains("integers"), e.getMessage());
    }
  }

  @Test
  void aTruncatedFileIsAnErrorNamingItAndItsSize() throws Exception {
    byte[] whole = Files.readAllBytes(fixture("rows.parquet"));
    Path cut = dir.resolve("cut.parquet");
    Files.write(cut, Arrays.copyOf(whole, whole.length - 100));
    try (Format f = open("{}")) {
      CorruptRecordException e =
          assertThrows(CorruptRecordException.class, () -> f.index(new LocalStorage(cut), n -> {}));
      assertTrue(e.getMessage().contains("cut.parquet") && e.getMessage().contains("(" + (whole.length - 100)
          + " bytes)") && e.getMessage().contains("footer"), e.getMessage());
    }
  }

  @Test
  void aCorruptRowGroupIsAnErrorNamingTheFileRowGroupAndOffset() throws Exception {
    byte[] bytes = Files.readAllBytes(fixture("rows.parquet"));
    // Overwrite the middle of row group 1's data (its pages; the footer stays intact).
    org.apache.parquet.hadoop.metadata.BlockMetaData g1;
    try (var r = new org.apache.parquet.hadoop.ParquetFileReader(
        new org.apache.parquet.io.LocalInputFile(fixture("rows.parquet")),
        org.apache.parquet.UnstallReadOptions.of(ParquetCodecs.INSTANCE))) {
      g1 = r.getFooter().getBlocks().get(1);
    }
    int from = (int) g1.getStartingPos() + 8;
    for (int i = from; i < from + (int) g1.getCompressedSize() - 16; i++) {
      bytes[i] = (byte) 0xA5;
    }
    Path bad = dir.resolve("bad.parquet");
    Files.write(bad, bytes);
    try (Format f = open("{}")) {
      CorruptRecordException e =
          assertThrows(CorruptRecordException.class, () -> f.index(new LocalStorage(bad), n -> {}));
      assertTrue(e.getMessage().contains("bad.parquet") && e.getMessage().contains("row group 1")
          && e.getMessage().contains("byte offset " + g1.getStartingPos()), e.getMessage());
    }
  }
}
