package io.unstall.flight.cache;

import static org.awaitility.Awaitility.await;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.time.Duration;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.function.UnaryOperator;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class DiskTierTest {
  @TempDir Path dir;

  static byte[] bytes(int seed, int n) {
    byte[] b = new byte[n];
    new Random(seed).nextBytes(b);
    return b;
  }

  static byte[] read(DiskTier t, Digest k, int n) throws Exception {
    ByteBuffer b = ByteBuffer.allocate(n);
    assertTrue(t.read(k, b), "expected " + k + " on disk");
    return b.array();
  }

  @Test
  void admitsUntilFullNeverEvictsAndSurvivesRestart() throws Exception {
    byte[] a = bytes(1, 1000);
    byte[] b = bytes(2, 3000);
    Digest ka = Digest.of(ByteBuffer.wrap(a));
    Digest kb = Digest.of(ByteBuffer.wrap(b));
    try (DiskTier t = new DiskTier(dir, DiskTier.HEADER * 2 + 4000)) {
      assertTrue(t.admit(ka, ByteBuffer.wrap(a)));
      assertTrue(t.admit(kb, ByteBuffer.wrap(b)));
      assertFalse(t.admit(Digest.of(ByteBuffer.wrap(new byte[1])), ByteBuffer.wrap(new byte[1])), "full: never evicts");
      assertEquals(DiskTier.HEADER * 2 + 4000, t.usedBytes());
    }
    try (DiskTier t = new DiskTier(dir, 1 << 20)) {
      assertEquals(2, t.entries());
      assertArrayEquals(a, read(t, ka, 1000));
      assertArrayEquals(b, read(t, kb, 3000));
    }
  }

  @Test
  void aFlippedByteIsDetectedDroppedAndNeverServed() throws Exception {
    byte[] a = bytes(3, 5000);
    Digest ka = Digest.of(ByteBuffer.wrap(a));
    try (DiskTier t = new DiskTier(dir, 1 << 20)) {
      t.admit(ka, ByteBuffer.wrap(a));
    }
    try (FileChannel ch =
        FileChannel.open(dir.resolve(DiskTier.FILE), StandardOpenOption.READ, StandardOpenOption.WRITE)) {
      ByteBuffer one = ByteBuffer.allocate(1);
      ch.read(one, DiskTier.HEADER + 1234);
      one.put(0, (byte) (one.get(0) ^ 0x10)).rewind();
      ch.write(one, DiskTier.HEADER + 1234);
    }
    try (DiskTier t = new DiskTier(dir, 1 << 20)) {
      assertTrue(t.contains(ka), "the header is intact, so the entry is indexed");
      assertFalse(t.read(ka, ByteBuffer.allocate(5000)), "corrupt data is not served");
      assertEquals(1, t.corruptDropped());
      assertFalse(t.contains(ka), "dropped");
      assertTrue(t.admit(ka, ByteBuffer.wrap(a)), "refetched bytes are admitted again");
      assertArrayEquals(a, read(t, ka, 5000));
    }
  }

  @Test
  void aTruncatedTailIsCutOffAtRestart() throws Exception {
    byte[] a = bytes(4, 100);
    byte[] b = bytes(5, 100);
    Digest ka = Digest.of(ByteBuffer.wrap(a));
    try (DiskTier t = new DiskTier(dir, 1 << 20)) {
      t.admit(ka, ByteBuffer.wrap(a));
      t.admit(Digest.of(ByteBuffer.wrap(b)), ByteBuffer.wrap(b));
    }
    try (FileChannel ch = FileChannel.open(dir.resolve(DiskTier.FILE), StandardOpenOption.WRITE)) {
      ch.truncate(DiskTier.HEADER * 2 + 150); // the second entry lost its last 50 bytes (a crash mid-write)
    }
    try (DiskTier t = new DiskTier(dir, 1 << 20)) {
      assertEquals(1, t.entries());
      assertEquals(DiskTier.HEADER + 100, t.usedBytes());
      assertArrayEquals(a, read(t, ka, 100));
    }
  }

  @Test
  void aSecondOwnerOfTheDirectoryIsRefusedNamingItAndTheHolder() throws Exception {
    try (DiskTier t = new DiskTier(dir, 1 << 20)) {
      t.admit(Digest.of(ByteBuffer.wrap(new byte[] {1})), ByteBuffer.wrap(new byte[] {1}));
      IOException e = assertThrows(IOException.class, () -> new DiskTier(dir, 1 << 20));
      assertTrue(e.getMessage().startsWith("disk cache directory " + dir.toAbsolutePath() + " is in use"),
          e.getMessage());
      assertTrue(e.getMessage().contains("pid " + ProcessHandle.current().pid()), e.getMessage());
      assertTrue(e.getMessage().contains("--disk-cache-dir"), e.getMessage());
      assertEquals(1, t.entries(), "the refused open truncated nothing");
    }
    try (DiskTier t = new DiskTier(dir, 1 << 20)) {
      assertEquals(1, t.entries(), "closing releases the directory");
    }
  }

  @Test
  void anEntryTornAfterTheLastCheckpointIsDroppedAtOpening() throws Exception {
    byte[] a = bytes(6, 2000);
    byte[] b = bytes(7, 2000);
    Digest ka = Digest.of(ByteBuffer.wrap(a));
    Digest kb = Digest.of(ByteBuffer.wrap(b));
    try (DiskTier t = new DiskTier(dir, 1 << 20)) {
      t.admit(ka, ByteBuffer.wrap(a));
    }
    byte[] checkpointBeforeB = Files.readAllBytes(dir.resolve(DiskTier.CHECKPOINT));
    try (DiskTier t = new DiskTier(dir, 1 << 20)) {
      t.admit(kb, ByteBuffer.wrap(b));
    }
    // As if killed after b's header was written but before its data: b lies past the last checkpoint, torn.
    Files.write(dir.resolve(DiskTier.CHECKPOINT), checkpointBeforeB);
    try (FileChannel ch = FileChannel.open(dir.resolve(DiskTier.FILE), StandardOpenOption.WRITE)) {
      ch.write(ByteBuffer.allocate(1000), DiskTier.HEADER * 2 + 2000 + 500);
    }
    try (DiskTier t = new DiskTier(dir, 1 << 20)) {
      assertTrue(t.contains(ka), "checkpointed entries are trusted");
      assertFalse(t.contains(kb), "a torn entry past the checkpoint is dropped at opening");
      assertEquals(1, t.corruptDropped());
      assertArrayEquals(a, read(t, ka, 2000));
    }
  }

  /**
   * A write that fails (disk full, EIO) while a later entry was already placed after it: reopening the tier
   * must step over its space, not cut off every entry after it.
   */
  @Test
  void aFailedWriteLeavesAHoleThatReopeningStepsOver() throws Exception {
    byte[] a = bytes(11, 2000);
    byte[] b = bytes(12, 3000);
    byte[] c = bytes(13, 4000);
    Digest ka = Digest.of(ByteBuffer.wrap(a));
    Digest kb = Digest.of(ByteBuffer.wrap(b));
    Digest kc = Digest.of(ByteBuffer.wrap(c));
    ByteBuffer kbBytes = ByteBuffer.allocate(Digest.BYTES);
    kb.write(kbBytes);
    CountDownLatch cWritten = new CountDownLatch(1);
    UnaryOperator<DiskTier.Writer> failB = file -> (src, pos) -> {
      if (src.remaining() == DiskTier.HEADER && src.duplicate().position(src.position() + 4)
          .limit(src.position() + 4 + Digest.BYTES).equals(kbBytes.duplicate().flip())) {
        try {
          cWritten.await(5, TimeUnit.SECONDS); // C is placed after B and written before B's write fails
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
        }
        throw new IOException("injected: No space left on device");
      }
      file.write(src, pos);
    };
    try (DiskTier t = new DiskTier(dir, 1 << 20, failB)) {
      assertTrue(t.admit(ka, ByteBuffer.wrap(a)));
      CompletableFuture<Boolean> bAdmit = CompletableFuture.supplyAsync(() -> {
        try {
          return t.admit(kb, ByteBuffer.wrap(b));
        } catch (IOException e) {
          throw new UncheckedIOException(e);
        }
      });
      await("B's space reserved").atMost(Duration.ofSeconds(10))
          .until(() -> t.usedBytes() == 2L * DiskTier.HEADER + a.length + b.length);
      assertTrue(t.admit(kc, ByteBuffer.wrap(c)));
      cWritten.countDown();
      ExecutionException e = assertThrows(ExecutionException.class, bAdmit::get);
      assertTrue(e.getCause() instanceof UncheckedIOException, e.toString());
    }
    try (DiskTier t = new DiskTier(dir, 1 << 20)) {
      assertEquals(2, t.entries(), "A and C survive; B's space is a hole");
      assertArrayEquals(a, read(t, ka, a.length));
      assertArrayEquals(c, read(t, kc, c.length));
      assertFalse(t.contains(kb));
    }
  }
}
