package io.unstall.flight.format;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.ObjectMapper;
import io.unstall.flight.storage.LocalStorage;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.List;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * HDF5 datasets written by h5py ({@code src/test/resources/formats/make_fixtures.py}): contiguous, chunked with
 * gzip and shuffle (chunks that split rows), big-endian; each row's payload is its stored bytes, labels come from
 * the label dataset, and truncated or corrupt files are errors naming the file and offset.
 */
class Hdf5FormatTest {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final int ROWS = 10;
  @TempDir Path dir;
  private final BufferAllocator root = new RootAllocator(64 << 20);

  @AfterEach
  void closeRoot() {
    root.close(); // a leaked chunk would fail here
  }

  private Format open(String options) throws Exception {
    Format f = Formats.create("hdf5", FormatOptions.of("hdf5", JSON.readTree(options)));
    f.decodeIn("t", root);
    return f;
  }

  private static com.fasterxml.jackson.databind.JsonNode layout(SampleIndex idx) throws Exception {
    return JSON.readTree(idx.layout());
  }

  private static ByteBuffer read(Format f, SampleIndex idx, LocalStorage storage, int id) throws Exception {
    ByteBuffer dst = ByteBuffer.allocate(idx.length(id));
    f.read(storage, idx, id, dst);
    assertFalse(dst.hasRemaining());
    return dst.flip();
  }

  @Test
  void contiguousRowsAreRangesOfTheFileWithLabels() throws Exception {
    LocalStorage storage = new LocalStorage(ParquetFormatTest.fixture("arrays.h5"));
    try (Format f = open("{\"dataset\": \"/contig\", \"label\": \"/labels\"}")) {
      SampleIndex idx = f.index(storage, n -> {});
      assertEquals(ROWS, idx.size());
      assertTrue(f.coalesces());
      assertEquals("<f4", layout(idx).get("dtype").asText());
      assertEquals(List.of(2, 3), JSON.convertValue(layout(idx).get("shape"), List.class));
      for (int k = 0; k < ROWS; k++) {
        assertEquals(k % 4, idx.label(k));
        assertEquals(24, idx.length(k));
        ByteBuffer row = read(f, idx, storage, k).order(ByteOrder.LITTLE_ENDIAN);
        for (int j = 0; j < 6; j++) {
          assertEquals((k * 6 + j) / 2.0f, row.getFloat(4 * j));
        }
        assertEquals("arrays.h5:/contig[" + k + "]", f.key(idx, k));
      }
    }
  }

  @Test
  void chunkedRowsAreCutFromInflatedUnshuffledChunks() throws Exception {
    LocalStorage storage = new LocalStorage(ParquetFormatTest.fixture("arrays.h5"));
    try (Format f = open("{\"dataset\": \"chunked\"}")) {
      SampleIndex idx = f.index(storage, n -> {});
      assertFalse(f.coalesces());
      assertFalse(idx.labelled());
      assertEquals("<i2", layout(idx).get("dtype").asText());
      for (int k : new int[] {9, 0, 4, 3, 8, 1, 2, 5, 6, 7}) { // out of order: chunks decoded, kept, reused
        ByteBuffer row = read(f, idx, storage, k).order(ByteOrder.LITTLE_ENDIAN);
        short[] got = new short[20];
        row.asShortBuffer().get(got);
        short[] want = new short[20];
        for (int j = 0; j < 20; j++) {
          want[j] = (short) (k * 20 + j - 100);
        }
        assertArrayEquals(want, got, "row " + k);
      }
    }
    try (Format f = open("{\"dataset\": \"/big\"}")) {
      SampleIndex idx = f.index(storage, n -> {});
      assertEquals(">f8", layout(idx).get("dtype").asText());
      ByteBuffer row = read(f, idx, storage, 7); // big-endian, as stored
      assertEquals(21.0, row.getDouble(0));
      assertEquals(23.0, row.getDouble(16));
    }
  }

  @Test
  void datasetsShareTheFormatsMemoryAndFreeEachOthersIdleChunks() throws Exception {
    LocalStorage storage = new LocalStorage(ParquetFormatTest.fixture("arrays.h5"));
    long all; // what dataset a's chunks take, all decoded
    try (BufferAllocator formats = root.newChildAllocator("formats", 0, 1 << 20); Format a = chunked("a", formats)) {
      SampleIndex ia = a.index(storage, n -> {});
      for (int k = 0; k < ROWS; k++) {
        read(a, ia, storage, k);
      }
      all = formats.getAllocatedMemory();
    }
    // Room for all of a's chunks and less than one of b's (96 bytes): b must free a's idle ones to read.
    try (BufferAllocator formats = root.newChildAllocator("formats", 0, all + 50);
        Format a = chunked("a", formats);
        Format b = Formats.create("hdf5", FormatOptions.of("hdf5", JSON.readTree("{\"dataset\": \"/big\"}")))) {
      b.decodeIn("b", formats);
      SampleIndex ia = a.index(storage, n -> {});
      SampleIndex ib = b.index(storage, n -> {});
      for (int round = 0; round < 2; round++) {
        for (int k = 0; k < ROWS; k++) {
          assertEquals((short) (k * 20 - 100), read(a, ia, storage, k).order(ByteOrder.LITTLE_ENDIAN).getShort(0));
        }
        assertTrue(round > 0 || formats.getHeadroom() < 96, "a's chunks fill the memory");
        for (int k = 0; k < ROWS; k++) {
          assertEquals(3.0 * k, read(b, ib, storage, k).getDouble(0), "b row " + k);
        }
      }
    }
  }

  private static Format chunked(String name, BufferAllocator formats) throws Exception {
    Format f = Formats.create("hdf5", FormatOptions.of("hdf5", JSON.readTree("{\"dataset\": \"/chunked\"}")));
    f.decodeIn(name, formats);
    return f;
  }

  @Test
  void optionsAreChecked() throws Exception {
    LocalStorage storage = new LocalStorage(ParquetFormatTest.fixture("arrays.h5"));
    IllegalArgumentException none = assertThrows(IllegalArgumentException.class, () -> open("{}"));
    assertTrue(none.getMessage().contains("option 'dataset' is required"), none.getMessage());
    try (Format f = open("{\"dataset\": \"/nope\"}")) {
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> f.index(storage, n -> {}));
      assertTrue(e.getMessage().contains("arrays.h5' has no dataset at '/nope'"), e.getMessage());
    }
    try (Format f = open("{\"dataset\": \"/contig\", \"label\": \"/big\"}")) {
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> f.index(storage, n -> {}));
      assertTrue(e.getMessage().contains("label dataset '/big'"), e.getMessage());
    }
  }

  @Test
  void aTruncatedFileIsAnErrorNamingItAndTheOffset() throws Exception {
    Path whole = ParquetFormatTest.fixture("contig.h5");
    long address;
    try (Format f = open("{\"dataset\": \"/x\"}")) {
      address = f.index(new LocalStorage(whole), n -> {}).offset(0);
    }
    byte[] bytes = Files.readAllBytes(whole);
    Path cut = dir.resolve("cut.h5");
    Files.write(cut, Arrays.copyOf(bytes, bytes.length - 100)); // the data runs past the end
    try (Format f = open("{\"dataset\": \"/x\"}")) {
      CorruptRecordException e =
          assertThrows(CorruptRecordException.class, () -> f.index(new LocalStorage(cut), n -> {}));
      assertTrue(e.getMessage().contains("cut.h5") && e.getMessage().contains("byte offset " + address + ".."
          + bytes.length), e.getMessage());
    }
    Path stub = dir.resolve("stub.h5");
    Files.write(stub, Arrays.copyOf(bytes, 300)); // the metadata is cut
    try (Format f = open("{\"dataset\": \"/x\"}")) {
      CorruptRecordException e =
          assertThrows(CorruptRecordException.class, () -> f.index(new LocalStorage(stub), n -> {}));
      assertTrue(e.getMessage().contains("stub.h5") && e.getMessage().contains("(300 bytes)"), e.getMessage());
    }
  }

  @Test
  void aCorruptChunkIsAnErrorNamingTheFileChunkAndOffset() throws Exception {
    Path bad = dir.resolve("bad.h5");
    Files.copy(ParquetFormatTest.fixture("arrays.h5"), bad);
    try (Format f = open("{\"dataset\": \"/chunked\"}")) {
      SampleIndex idx = f.index(new LocalStorage(bad), n -> {});
      Hdf5Format h = (Hdf5Format) f;
      long[] chunk = h.chunkOf(0); // address, size of the chunk holding row 0's first elements
      byte[] bytes = Files.readAllBytes(bad);
      for (int i = 2; i < chunk[1]; i++) {
        bytes[(int) chunk[0] + i] ^= 0x5A;
      }
      Files.write(bad, bytes);
      // the file changed after indexing: index again, then read
      try (Format g = open("{\"dataset\": \"/chunked\"}")) {
        LocalStorage storage = new LocalStorage(bad);
        SampleIndex again = g.index(storage, n -> {});
        CorruptRecordException e = assertThrows(CorruptRecordException.class, () -> read(g, again, storage, 0));
        assertTrue(e.getMessage().contains("bad.h5") && e.getMessage().contains("corrupt HDF5 chunk [0, 0, 0]")
            && e.getMessage().contains("byte offset " + chunk[0]), e.getMessage());
        assertEquals(idx.size(), again.size());
      }
    }
  }
}
