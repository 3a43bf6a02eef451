package io.unstall.flight.format;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.unstall.flight.storage.LocalStorage;
import java.io.FileNotFoundException;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class FormatsTest {
  @TempDir Path dir;

  private void file(String rel, int size) throws Exception {
    Path p = dir.resolve(rel);
    Files.createDirectories(p.getParent());
    Files.write(p, new byte[size]);
  }

  @Test
  void imageFolderFollowsTorchvisionOrderAndLabels() throws Exception {
    file("dog/b.png", 2);
    file("dog/a.JPG", 1);
    file("cat/z.jpg", 3);
    file("cat/sub/a.jpg", 4); // os.walk: files of cat/ before those of cat/sub/
    file("cat/notes.txt", 5); // not an image: skipped
    SampleIndex idx = new ImageFolderFormat().index(new LocalStorage(dir), n -> {});
    List<String> files = new ArrayList<>();
    for (int i = 0; i < idx.size(); i++) {
      files.add(idx.file(i) + ":" + idx.label(i) + ":" + idx.length(i));
    }
    assertEquals(List.of("cat/z.jpg:0:3", "cat/sub/a.jpg:0:4", "dog/a.JPG:1:1", "dog/b.png:1:2"), files);
    assertEquals(10, idx.totalBytes());
    assertEquals(List.of("cat", "dog"), new ImageFolderFormat().classes(new LocalStorage(dir)));
  }

  @Test
  void imageFolderErrorsNameTheProblem() throws Exception {
    FileNotFoundException none =
        assertThrows(FileNotFoundException.class, () -> new ImageFolderFormat().index(new LocalStorage(dir), n -> {}));
    assertTrue(none.getMessage().startsWith("Couldn't find any class folder in"), none.getMessage());
    file("cat/a.jpg", 1);
    file("empty/readme.txt", 1);
    FileNotFoundException empty =
        assertThrows(FileNotFoundException.class, () -> new ImageFolderFormat().index(new LocalStorage(dir), n -> {}));
    assertTrue(empty.getMessage().contains("Found no valid file for the classes empty"), empty.getMessage());
  }

  @Test
  void tfRecordIndexesRecordsAndReadsThemVerified() throws Exception {
    List<byte[]> recs = List.of("alpha".getBytes(), new byte[0], "gamma-gamma".getBytes());
    long[] offsets = TfRecords.write(dir.resolve("train-00000.tfrecord"), recs);
    TfRecords.write(dir.resolve("train-00001.tfrecord"), List.of("delta".getBytes()));
    Files.write(dir.resolve(".hidden"), new byte[3]);
    TfRecordFormat f = new TfRecordFormat();
    LocalStorage storage = new LocalStorage(dir);
    SampleIndex idx = f.index(storage, n -> {});
    assertEquals(4, idx.size());
    assertFalse(idx.labelled());
    assertEquals("train-00000.tfrecord@" + offsets[2], f.key(idx, 2));
    assertEquals("train-00001.tfrecord@0", f.key(idx, 3));
    for (int i = 0; i < 3; i++) {
      ByteBuffer b = ByteBuffer.allocate(idx.length(i));
      f.read(storage, idx, i, b);
      assertArrayEquals(recs.get(i), b.array());
    }
  }

  @Test
  void corruptRecordDataIsDetectedAtReadWithFileAndOffset() throws Exception {
    Path shard = dir.resolve("s.tfrecord");
    long[] offsets = TfRecords.write(shard, List.of("first".getBytes(), "second".getBytes()));
    byte[] raw = Files.readAllBytes(shard);
    raw[(int) offsets[1] + 12 + 2] ^= 0x01; // flip a bit of record 1's data
    Files.write(shard, raw);
    TfRecordFormat f = new TfRecordFormat();
    LocalStorage storage = new LocalStorage(shard);
    SampleIndex idx = f.index(storage, n -> {});
    f.read(storage, idx, 0, ByteBuffer.allocate(idx.length(0)));
    CorruptRecordException e =
        assertThrows(CorruptRecordException.class, () -> f.read(storage, idx, 1, ByteBuffer.allocate(idx.length(1))));
    assertEquals(
        "corrupt TFRecord record in '" + shard + "' at byte offset " + offsets[1] + ": data CRC32C mismatch",
        e.getMessage());
  }

  @Test
  void corruptLengthIsDetectedAtIndexWithFileAndOffset() throws Exception {
    Path shard = dir.resolve("s.tfrecord");
    long[] offsets = TfRecords.write(shard, List.of("first".getBytes(), "second".getBytes()));
    byte[] raw = Files.readAllBytes(shard);
    raw[(int) offsets[1]] ^= 0x40;
    Files.write(shard, raw);
    CorruptRecordException e =
        assertThrows(CorruptRecordException.class, () -> new TfRecordFormat().index(new LocalStorage(dir), n -> {}));
    assertEquals(
        "corrupt TFRecord record in '" + shard + "' at byte offset " + offsets[1] + ": length CRC32C mismatch",
        e.getMessage());
  }

  @Test
  void unknownFormatListsTheSupportedOnes() {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> Formats.byName("hdf9"));
    assertTrue(e.getMessage().startsWith("unknown format 'hdf9'; supported formats: csv, "), e.getMessage());
    for (String f : List.of("imagefolder", "npy", "npz", "tfrecord", "webdataset")) {
      assertTrue(e.getMessage().contains(", " + f), e.getMessage());
    }
  }
}
