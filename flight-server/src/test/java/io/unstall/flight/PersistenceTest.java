package io.unstall.flight;

import static io.unstall.flight.FlightTestClient.TOKEN;
import static io.unstall.flight.FlightTestClient.range;
import static org.awaitility.Awaitility.await;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.dataset.DatasetRegistry;
import io.unstall.flight.dataset.Manifests;
import io.unstall.flight.format.ImageFolders;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * What a disk tier keeps across a restart, clean or not: manifests are checkpointed while the sidecar runs
 * (so a SIGKILL loses at most what came after the last checkpoint), and a torn manifest is relearned, not an
 * error that blocks registration.
 */
class PersistenceTest {
  static final int N = 8;

  @TempDir Path dir;

  private List<byte[]> data() throws Exception {
    return ImageFolders.write(dir.resolve("data"), 2, N / 2, i -> 3000 + 100 * i, 5);
  }

  private static DataPlane plane(BufferAllocator root, Path tier, Duration checkpointEvery) throws Exception {
    return DataPlane.builder(root, TOKEN).port(0).cacheCapacity(0).diskTier(tier, 1 << 20)
        .checkpointEvery(checkpointEvery).build().start();
  }

  private static List<Path> manifests(Path tier) throws Exception {
    Path m = tier.resolve("manifests");
    if (!Files.isDirectory(m)) {
      return List.of();
    }
    try (Stream<Path> s = Files.list(m)) {
      return s.filter(p -> p.getFileName().toString().endsWith(".manifest")).toList();
    }
  }

  /** One sidecar's life: registers "d" at {@code uri}, reads its epoch 0, closes (persisting the manifest). */
  private void readEpochZero(Path tier, String uri) throws Exception {
    try (BufferAllocator root = new RootAllocator(64L << 20);
        DataPlane plane = plane(root, tier, Duration.ofHours(1));
        FlightTestClient c = new FlightTestClient(root, plane)) {
      plane.registry().register("d", "imagefolder", uri);
      c.fetch("d", 0, range(N));
    }
  }

  @Test
  void aTornManifestIsRelearnedNotAnError() throws Exception {
    List<byte[]> samples = data();
    Path tier = dir.resolve("tier");
    String uri = dir.resolve("data").toString();
    readEpochZero(tier, uri);
    Path manifest = manifests(tier).get(0);
    byte[] whole = Files.readAllBytes(manifest);
    Files.write(manifest, java.util.Arrays.copyOf(whole, whole.length / 2)); // a crash while it was written

    try (BufferAllocator root = new RootAllocator(64L << 20);
        DataPlane plane = plane(root, tier, Duration.ofHours(1));
        FlightTestClient c = new FlightTestClient(root, plane)) {
      Dataset d = plane.registry().register("d", "imagefolder", uri);
      assertNull(d.digest(0), "nothing is trusted from a torn manifest");
      List<byte[]> got = c.fetch("d", 0, range(N));
      for (int i = 0; i < N; i++) {
        assertArrayEquals(samples.get(i), got.get(i));
      }
    }
    try (BufferAllocator root = new RootAllocator(64L << 20);
        DataPlane plane = plane(root, tier, Duration.ofHours(1))) {
      Dataset d = plane.registry().register("d", "imagefolder", uri);
      for (int i = 0; i < N; i++) {
        assertNotNull(d.digest(i), "the rebuilt manifest restores sample " + i);
      }
    }
  }

  /** A sidecar's data plane in its own process: fetches everything, says so, then runs until killed. */
  public static final class Child {
    public static void main(String[] args) throws Exception {
      BufferAllocator root = new RootAllocator(64L << 20);
      DataPlane plane = plane(root, Path.of(args[0]), Duration.ofMillis(50));
      plane.registry().register("d", "imagefolder", args[1]);
      new FlightTestClient(root, plane).fetch("d", 0, range(N));
      System.out.println("fetched");
      System.out.flush();
      Thread.sleep(Long.MAX_VALUE);
    }
  }

  /** How many digests the manifest persisted in {@code tier} knows, read into a dataset registered apart. */
  private static int persistedDigests(Path tier, String uri) throws Exception {
    List<Path> m = manifests(tier);
    if (m.isEmpty()) {
      return 0;
    }
    try (DatasetRegistry r = new DatasetRegistry()) {
      return Manifests.restore(r.register("probe", "imagefolder", uri), m.get(0));
    }
  }

  @Test
  void aSidecarKilledAfterACheckpointServesWhatItCheckpointedAfterARestart() throws Exception {
    List<byte[]> samples = data();
    Path tier = dir.resolve("tier");
    String uri = dir.resolve("data").toString();
    Process child = new ProcessBuilder(
        Path.of(System.getProperty("java.home"), "bin", "java").toString(),
        "--add-opens=java.base/java.nio=ALL-UNNAMED",
        "-cp", System.getProperty("java.class.path"), Child.class.getName(), tier.toString(), uri)
        .redirectErrorStream(true).start();
    try (BufferedReader out =
        new BufferedReader(new InputStreamReader(child.getInputStream(), StandardCharsets.UTF_8))) {
      StringBuilder log = new StringBuilder();
      for (String line; (line = out.readLine()) != null && !line.equals("fetched"); ) {
        log.append(line).append('\n');
      }
      assertTrue(child.isAlive(), "the child died before it fetched:\n" + log);
      // The checkpoint daemon persists what it learned while it runs: no clean close is needed.
      await().atMost(Duration.ofSeconds(60)).until(() -> persistedDigests(tier, uri) == N);
    } finally {
      child.destroyForcibly(); // SIGKILL: no shutdown hook, no close
      assertTrue(child.waitFor(60, TimeUnit.SECONDS));
    }
    try (BufferAllocator root = new RootAllocator(64L << 20);
        DataPlane plane = plane(root, tier, Duration.ofHours(1));
        FlightTestClient c = new FlightTestClient(root, plane)) {
      assertEquals(N, plane.disk().entries());
      Dataset d = plane.registry().register("d", "imagefolder", uri);
      for (int i = 0; i < N; i++) {
        assertNotNull(d.digest(i), "the checkpointed manifest names sample " + i);
      }
      List<byte[]> got = c.fetch("d", 0, range(N));
      for (int i = 0; i < N; i++) {
        assertArrayEquals(samples.get(i), got.get(i));
      }
      JsonNode e0 = c.stats().at("/datasets/d/epochs/0");
      assertEquals(N, e0.get("disk_hits").asLong());
      assertEquals(0, e0.get("storage_bytes").asLong(), "served from the disk tier, not storage");
    }
  }

  /**
   * Issue 11: files rewritten under the same size and mtime, their first and last 4 KiB unchanged (what the pins'
   * edge CRCs see), do not keep a persisted manifest valid: the inode's ctime moved, so it is relearned and the
   * disk tier's entries of the old bytes are never served.
   */
  @Test
  void aManifestOfFilesRewrittenUnderTheSameSizeAndMtimeIsRelearnedNotTrusted() throws Exception {
    int size = 3 * 4096;
    List<byte[]> old = ImageFolders.write(dir.resolve("data"), 2, N / 2, i -> size, 5);
    Path tier = dir.resolve("tier");
    String uri = dir.resolve("data").toString();
    readEpochZero(tier, uri);
    assertEquals(N, persistedDigests(tier, uri), "the manifest was persisted at close");
    List<byte[]> now = new java.util.ArrayList<>();
    for (int i = 0; i < N; i++) {
      Path f = dir.resolve("data/class" + (i / (N / 2)) + "/img" + (i % (N / 2)) + ".jpg");
      java.nio.file.attribute.FileTime mtime = Files.getLastModifiedTime(f);
      byte[] b = old.get(i).clone();
      for (int k = 4096; k < 2 * 4096; k++) {
        b[k] ^= 0x5a; // the middle only: the edges the pin checks are unchanged
      }
      Files.write(f, b);
      Files.setLastModifiedTime(f, mtime);
      now.add(b);
    }
    try (BufferAllocator root = new RootAllocator(64L << 20);
        DataPlane plane = plane(root, tier, Duration.ofHours(1));
        FlightTestClient c = new FlightTestClient(root, plane)) {
      Dataset d = plane.registry().register("d", "imagefolder", uri);
      for (int i = 0; i < N; i++) {
        assertNull(d.digest(i), "no digest of the old bytes is trusted: sample " + i);
      }
      for (int e = 0; e < 2; e++) {
        List<byte[]> got = c.fetch("d", e, range(N));
        for (int i = 0; i < N; i++) {
          assertArrayEquals(now.get(i), got.get(i), "sample " + i + " in epoch " + e);
        }
      }
      JsonNode s = c.stats();
      assertEquals(0, s.at("/datasets/d/epochs/0/disk_hits").asLong(), "the old entries are not served");
      assertEquals((long) N * size, s.at("/datasets/d/epochs/0/storage_bytes").asLong(), "relearned from storage");
      assertEquals(N, s.at("/datasets/d/epochs/1/disk_hits").asLong(), "the new bytes' entries serve epoch 1");
    }
  }
}
