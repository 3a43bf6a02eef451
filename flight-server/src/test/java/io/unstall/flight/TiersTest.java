package io.unstall.flight;

import static io.unstall.flight.FlightTestClient.TOKEN;
import static io.unstall.flight.FlightTestClient.range;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import io.unstall.flight.cache.DiskTier;
import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.dataset.Manifests;
import io.unstall.flight.format.ImageFolders;
import io.unstall.flight.protocol.Plan;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** Content-addressed sharing, the disk tier across restarts, and clairvoyant prefetch, through real Flight. */
class TiersTest {
  static final int N = 12;
  static final int SAMPLE = 4000;

  @TempDir Path dir;
  final List<byte[]> samples = new ArrayList<>();

  /** Writes the same image folder at {@code name}; returns its path. */
  private String folder(String name) throws Exception {
    if (samples.isEmpty()) {
      Random rnd = new Random(11);
      for (int i = 0; i < N; i++) {
        byte[] b = new byte[SAMPLE];
        rnd.nextBytes(b);
        samples.add(b);
      }
    }
    for (int i = 0; i < N; i++) {
      Path p = dir.resolve(name + "/c" + (i % 2) + "/s" + String.format("%02d", i) + ".jpg");
      Files.createDirectories(p.getParent());
      Files.write(p, samples.get(i));
    }
    return dir.resolve(name).toString();
  }

  private static JsonNode epoch(JsonNode stats, String ds, int e) {
    return stats.at("/datasets/" + ds + "/epochs/" + e);
  }

  private void assertAllBytes(String ds, List<byte[]> got, long[] ids) {
    for (int i = 0; i < ids.length; i++) {
      assertArrayEquals(payloadOf(ds, (int) ids[i]), got.get(i), ds + " sample " + ids[i]);
    }
  }

  /** imagefolder ids follow class then name: c0 holds even samples, c1 odd ones. */
  private byte[] payloadOf(String ds, int id) {
    int half = (N + 1) / 2;
    return samples.get(id < half ? 2 * id : 2 * (id - half) + 1);
  }

  @Test
  void datasetsOfTheSameContentShareEntriesAndAnImportedManifestIsOnlyAClaim() throws Exception {
    try (BufferAllocator root = new RootAllocator(64L << 20);
        DataPlane plane = DataPlane.builder(root, TOKEN).port(0).cacheCapacity(5L * SAMPLE).build().start();
        FlightTestClient c = new FlightTestClient(root, plane)) {
      plane.registry().register("a", "imagefolder", folder("a"));
      plane.registry().register("b", "imagefolder", folder("b"));
      assertAllBytes("a", c.fetch("a", 0, range(N)), range(N));
      assertAllBytes("b", c.fetch("b", 0, range(N)), range(N));
      JsonNode s = c.stats();
      assertEquals(5L * SAMPLE, s.at("/cache/used_bytes").asLong(), "b's copies take no more room");
      assertEquals(5L * SAMPLE, s.at("/cache/shared_bytes").asLong(), "b uses a's 5 entries");
      assertEquals((long) N * SAMPLE, epoch(s, "b", 0).get("storage_bytes").asLong(),
          "without a manifest b reads its own storage before it can name any entry");
      assertAllBytes("b", c.fetch("b", 1, range(N)), range(N));
      assertEquals(5, epoch(c.stats(), "b", 1).get("hits").asLong());

      // An imported manifest is a claim: c's first read of each sample is the proof, then it shares a's entries.
      Path manifest = dir.resolve("a.manifest");
      assertEquals(N, Manifests.write(plane.registry().get("a"), manifest));
      Dataset cd = plane.registry().register("c", "imagefolder", folder("c"), manifest);
      assertNull(cd.digest(0), "a claim does not key a lookup");
      assertNotNull(cd.claimed(0));
      assertAllBytes("c", c.fetch("c", 0, range(N)), range(N));
      JsonNode c0 = epoch(c.stats(), "c", 0);
      assertEquals(0, c0.get("hits").asLong());
      assertEquals((long) N * SAMPLE, c0.get("storage_bytes").asLong());
      assertEquals(N, c0.get("verified").asLong());
      assertEquals(0, c0.get("verify_mismatches").asLong());
      assertAllBytes("c", c.fetch("c", 1, range(N)), range(N));
      assertEquals(5, epoch(c.stats(), "c", 1).get("hits").asLong());

      // A manifest of another sample count is refused, naming the first difference.
      Files.createDirectories(dir.resolve("other/c0"));
      Files.write(dir.resolve("other/c0/x.jpg"), new byte[10]);
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
          () -> plane.registry().register("other", "imagefolder", dir.resolve("other").toString(), manifest));
      assertTrue(e.getMessage().contains("describes " + N + " samples but dataset 'other' has 1"), e.getMessage());
    }
  }

  /**
   * The defect of issue 11: a dataset whose files have the sizes of another's but other bytes, given that one's
   * manifest, was served its cached bytes as hits. Now every claim is refused on first read, and counted.
   */
  @Test
  void aManifestOfOtherContentOfTheSameSizesGrantsNoHitAndEachMismatchIsCounted() throws Exception {
    try (BufferAllocator root = new RootAllocator(64L << 20);
        DataPlane plane = DataPlane.builder(root, TOKEN).port(0).cacheCapacity(4L * N * SAMPLE)
            .prefetch(4L * 8192, 6, 2).build().start();
        FlightTestClient c = new FlightTestClient(root, plane)) {
      plane.registry().register("a", "imagefolder", folder("a"));
      c.fetch("a", 0, range(N)); // every sample of a is cached
      Path manifest = dir.resolve("a.manifest");
      assertEquals(N, Manifests.write(plane.registry().get("a"), manifest));

      List<byte[]> own = ImageFolders.write(dir.resolve("x"), 2, N / 2, i -> SAMPLE, 99); // same sizes, other bytes
      Dataset x = plane.registry().register("x", "imagefolder", dir.resolve("x").toString(), manifest);
      long[] order = {11, 3, 7, 0, 5, 9, 1, 10, 2, 8, 4, 6};
      c.action("prefetch", new Plan("x", 0, order).toBytes()); // claims are checked by prefetch reads as well
      for (int e = 0; e < 2; e++) {
        List<byte[]> got = new ArrayList<>();
        for (int i = 0; i < N; i += 4) {
          got.addAll(c.fetch("x", e, java.util.Arrays.copyOfRange(order, i, i + 4)));
        }
        for (int i = 0; i < N; i++) {
          assertArrayEquals(own.get((int) order[i]), got.get(i), "x sample " + order[i] + " in epoch " + e);
        }
      }
      JsonNode s = c.stats();
      JsonNode x0 = epoch(s, "x", 0);
      assertEquals(0, x0.get("hits").asLong(), "a's entries are never served to x");
      assertEquals(N, x0.get("verify_mismatches").asLong(), x0.toString());
      assertEquals(0, x0.get("verified").asLong());
      assertEquals((long) N * SAMPLE, x0.get("storage_bytes").asLong());
      JsonNode x1 = epoch(s, "x", 1);
      assertEquals(N, x1.get("hits").asLong(), "x's own entries, learned from its own bytes, are hits");
      assertEquals(0, x1.get("verify_mismatches").asLong(), "a claim is checked once");
      assertEquals(0, s.at("/cache/shared_bytes").asLong(), "nothing is shared between a and x");
      for (int i = 0; i < N; i++) {
        assertNull(x.claimed(i), "no claim is left pending on sample " + i);
      }
      // x's manifest holds only digests of its own bytes: exported and imported elsewhere, they verify.
      Path xm = dir.resolve("x.manifest");
      assertEquals(N, Manifests.write(x, xm));
      ImageFolders.write(dir.resolve("y"), 2, N / 2, i -> SAMPLE, 99);
      plane.registry().register("y", "imagefolder", dir.resolve("y").toString(), xm);
      c.fetch("y", 0, range(N));
      assertEquals(N, epoch(c.stats(), "y", 0).get("verified").asLong());
    }
  }

  private static DataPlane withDiskTier(BufferAllocator root, Path tier, long memoryCache) throws Exception {
    return DataPlane.builder(root, TOKEN).port(0).cacheCapacity(memoryCache).diskTier(tier, 1 << 20).build().start();
  }

  @Test
  void theDiskTierSurvivesARestartAndACorruptEntryIsRefetched() throws Exception {
    Path tier = dir.resolve("tier");
    String data = folder("d");
    try (BufferAllocator root = new RootAllocator(64L << 20);
        DataPlane plane = withDiskTier(root, tier, 2L * SAMPLE);
        FlightTestClient c = new FlightTestClient(root, plane)) {
      plane.registry().register("d", "imagefolder", data);
      c.fetch("d", 0, range(N));
      assertEquals(N, c.stats().at("/disk/entries").asLong());
    }
    // Restart: the memory cache is empty, the disk tier and the manifest are not.
    try (BufferAllocator root = new RootAllocator(64L << 20);
        DataPlane plane = withDiskTier(root, tier, 0);
        FlightTestClient c = new FlightTestClient(root, plane)) {
      plane.registry().register("d", "imagefolder", data);
      assertAllBytes("d", c.fetch("d", 0, range(N)), range(N));
      JsonNode e0 = epoch(c.stats(), "d", 0);
      assertEquals(N, e0.get("disk_hits").asLong());
      assertEquals(0, e0.get("storage_bytes").asLong(), "nothing cached is read from storage after a restart");
    }
    // Flip one byte of the third entry's data: detected, dropped, refetched from storage, never served.
    try (FileChannel ch =
        FileChannel.open(tier.resolve(DiskTier.FILE), StandardOpenOption.READ, StandardOpenOption.WRITE)) {
      long pos = 2L * (48 + SAMPLE) + 48 + 100;
      ByteBuffer one = ByteBuffer.allocate(1);
      ch.read(one, pos);
      one.put(0, (byte) ~one.get(0)).rewind();
      ch.write(one, pos);
    }
    try (BufferAllocator root = new RootAllocator(64L << 20);
        DataPlane plane = withDiskTier(root, tier, 0);
        FlightTestClient c = new FlightTestClient(root, plane)) {
      plane.registry().register("d", "imagefolder", data);
      assertAllBytes("d", c.fetch("d", 0, range(N)), range(N));
      JsonNode s = c.stats();
      assertEquals(1, s.at("/disk/corrupt_dropped").asLong());
      assertEquals(N - 1, epoch(s, "d", 0).get("disk_hits").asLong());
      assertEquals(SAMPLE, epoch(s, "d", 0).get("storage_bytes").asLong());
    }
  }

  @Test
  void prefetchReadsTheEpochAheadWithinItsWindowAndKeepsMinioArithmetic() throws Exception {
    long window = 4L * 8192; // four staged samples (each rounds up to 8 KiB)
    try (BufferAllocator root = new RootAllocator(64L << 20);
        DataPlane plane = DataPlane.builder(root, TOKEN).port(0).cacheCapacity(3L * SAMPLE)
            .prefetch(window, 6, 2).build().start();
        FlightTestClient c = new FlightTestClient(root, plane)) {
      plane.registry().register("p", "imagefolder", folder("p"));
      c.fetch("p", 0, range(N)); // epoch 0 fills the MinIO cache with 3 samples
      long[] order = {11, 3, 7, 0, 5, 9, 1, 10, 2, 8, 4, 6};
      JsonNode ack = c.action("prefetch", new Plan("p", 1, order).toBytes());
      assertEquals(N, ack.get("planned").asLong());
      List<byte[]> got = new ArrayList<>();
      for (int i = 0; i < N; i += 4) {
        long[] batch = java.util.Arrays.copyOfRange(order, i, i + 4);
        got.addAll(c.fetch("p", 1, batch));
      }
      assertAllBytes("p", got, order);
      JsonNode e1 = epoch(c.stats(), "p", 1);
      assertEquals(N, e1.get("samples").asLong());
      assertEquals(3, e1.get("hits").asLong(), "the cached samples are still hits");
      assertEquals((long) (N - 3) * SAMPLE, e1.get("storage_bytes").asLong(), "each miss read exactly once");
      assertTrue(e1.get("prefetch_hits").asLong() > 0, e1.toString());
      assertTrue(plane.prefetcher().peakStagedBytes() <= window, "staging stays within its window");
    }
  }
}
