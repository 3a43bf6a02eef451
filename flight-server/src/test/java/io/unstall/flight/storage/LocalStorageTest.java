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
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** Pinning of files read in parts (records of a shard): size, mtime and edges are checked when it is opened. */
class LocalStorageTest {
  @TempDir Path dir;

  static final String SHARD = "shard-0.tfrecord";
  final byte[] v1 = new byte[64 << 10];
  LocalStorage storage;

  /** A shard of random bytes, pinned as indexing pins it. */
  @BeforeEach
  void pinnedShard() throws Exception {
    new Random(1).nextBytes(v1);
    Files.write(dir.resolve(SHARD), v1);
    storage = new LocalStorage(dir);
    storage.pin(SHARD);
  }

  @Test
  void aShardRewrittenWithTheSameSizeAndMtimeIsRefusedWhenReadInParts() throws Exception {
    Path p = dir.resolve(SHARD);
    FileTime mtime = Files.getLastModifiedTime(p);
    byte[] v2 = v1.clone();
    v2[10] ^= 1; // the first record changed; the one read below did not
    Files.write(p, v2);
    Files.setLastModifiedTime(p, mtime);

    SourceChangedException e =
        assertThrows(SourceChangedException.class, () -> storage.readFully(SHARD, 30_000, ByteBuffer.allocate(100)));
    assertTrue(e.getMessage().startsWith("file '" + p + "' changed after registration"), e.getMessage());
  }

  @Test
  void aSizeChangeIsRefusedOnEveryReadAndAnUnchangedFileIsRead() throws Exception {
    Path p = dir.resolve(SHARD);
    ByteBuffer got = ByteBuffer.allocate(100);
    storage.readFully(SHARD, 1000, got);
    assertArrayEquals(Arrays.copyOfRange(v1, 1000, 1100), got.array());

    Files.write(p, Arrays.copyOf(v1, v1.length + 1)); // appended to
    SourceChangedException e =
        assertThrows(SourceChangedException.class, () -> storage.readFully(SHARD, 1000, ByteBuffer.allocate(100)));
    assertTrue(e.getMessage().contains("size was " + v1.length + " bytes when indexed"), e.getMessage());
    Files.write(p, v1);
    assertThrows(SourceChangedException.class, () -> storage.readFully(SHARD, 0, ByteBuffer.allocate(100)),
        "once seen changed, a file stays refused: its cached samples and index are of the old version");
  }
}
