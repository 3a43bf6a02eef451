package io.unstall.flight.storage;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.FileTime;
import java.util.Arrays;
import java.util.Random;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** Pinning of files read in parts (records of a shard): size, mtime and edges are checked when it is opened. */
class LocalStorageTest {
  @TempDir Path dir;

  private byte[] shard(Path p, long seed) throws Exception {
    byte[] b = new byte[64 << 10];
    new Random(seed).nextBytes(b);
    Files.write(p, b);
    return b;
  }

  @Test
  void aShardRewrittenWithTheSameSizeAndMtimeIsRefusedWhenReadInParts() throws Exception {
    Path p = dir.resolve("shard-0.tfrecord");
    byte[] v1 = shard(p, 1);
    LocalStorage s = new LocalStorage(dir);
    s.pin("shard-0.tfrecord");
    FileTime mtime = Files.getLastModifiedTime(p);
    byte[] v2 = v1.clone();
    v2[10] ^= 1; // the first record changed; the one read below did not
    Files.write(p, v2);
    Files.setLastModifiedTime(p, mtime);

    SourceChangedException e =
        assertThrows(SourceChangedException.class, () -> s.readFully("shard-0.tfrecord", 30_000, ByteBuffer.allocate(100)));
    assertTrue(e.getMessage().startsWith("file '" + p + "' changed after registration"), e.getMessage());
  }

  @Test
  void aSizeChangeIsRefusedOnEveryReadAndAnUnchangedFileIsRead() throws Exception {
    Path p = dir.resolve("a.tfrecord");
    byte[] v1 = shard(p, 2);
    LocalStorage s = new LocalStorage(dir);
    s.pin("a.tfrecord");
    ByteBuffer got = ByteBuffer.allocate(100);
    s.readFully("a.tfrecord", 1000, got);
    assertArrayEquals(Arrays.copyOfRange(v1, 1000, 1100), got.array());

    Files.write(p, Arrays.copyOf(v1, v1.length + 1)); // appended to
    SourceChangedException e =
        assertThrows(SourceChangedException.class, () -> s.readFully("a.tfrecord", 1000, ByteBuffer.allocate(100)));
    assertTrue(e.getMessage().contains("size was " + v1.length + " bytes when indexed"), e.getMessage());
    Files.write(p, v1);
    assertThrows(SourceChangedException.class, () -> s.readFully("a.tfrecord", 0, ByteBuffer.allocate(100)),
        "once seen changed, a file stays refused: its cached samples and index are of the old version");
  }
}
