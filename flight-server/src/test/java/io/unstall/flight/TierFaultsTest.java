package io.unstall.flight;

import static io.unstall.flight.FlightTestClient.TOKEN;
import static io.unstall.flight.FlightTestClient.range;
import static org.awaitility.Awaitility.await;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;

import com.fasterxml.jackson.databind.JsonNode;
import io.unstall.flight.cache.DiskTier;
import io.unstall.flight.cache.MinioCache;
import io.unstall.flight.cache.TierBreaker;
import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.dataset.DatasetRegistry;
import io.unstall.flight.format.ImageFolders;
import io.unstall.flight.protocol.BatchSchema;
import io.unstall.flight.protocol.Plan;
import java.io.IOException;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicLong;
import java.util.stream.IntStream;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Faults of the cache tiers and of prefetch staging never fail or hang a batch: the samples are read from
 * storage, and a failing tier is bypassed behind its breaker.
 */
class TierFaultsTest {
  static final int N = 12;
  static final int SAMPLE = 4000;

  @TempDir Path dir;
  List<byte[]> samples;

  private String folder() throws IOException {
    samples = ImageFolders.write(dir.resolve("d"), 2, N / 2, i -> SAMPLE, 7);
    return dir.resolve("d").toString();
  }

  private void assertAllBytes(List<byte[]> got, long[] ids) {
    for (int i = 0; i < ids.length; i++) {
      assertArrayEquals(samples.get((int) ids[i]), got.get(i), "sample " + ids[i]);
    }
  }

  private static JsonNode epoch(JsonNode stats, int e) {
    return stats.at("/datasets/d/epochs/" + e);
  }

  /** Cuts the tier's file under the sidecar (another process truncated it, the disk lost it): reads now fail. */
  private static byte[] truncate(Path tier) throws IOException {
    Path file = tier.resolve(DiskTier.FILE);
    byte[] before = Files.readAllBytes(file);
    try (FileChannel ch = FileChannel.open(file, StandardOpenOption.WRITE)) {
      ch.truncate(0);
    }
    return before;
  }

  @Test
  void aDiskTierThatFailsToReadFallsBackToStorageAndOpensItsBreaker() throws Exception {
    Path tier = dir.resolve("tier");
    try (BufferAllocator root = new RootAllocator(64L << 20);
        DataPlane plane = DataPlane.builder(root, TOKEN).port(0).diskTier(tier, 1 << 20).build().start();
        FlightTestClient c = new FlightTestClient(root, plane)) {
      plane.registry().register("d", "imagefolder", folder());
      c.fetch("d", 0, range(N));
      assertEquals(N, c.stats().at("/disk/entries").asLong());
      truncate(tier);

      assertAllBytes(c.fetch("d", 1, range(N)), range(N)); // every read of the tier fails: served from storage
      JsonNode s = c.stats();
      assertEquals((long) N * SAMPLE, epoch(s, 1).get("storage_bytes").asLong());
      assertEquals(0, epoch(s, 1).get("disk_hits").asLong());
      assertEquals("open", s.at("/disk/breaker/state").asText(), s.toString());
      assertEquals(TierBreaker.THRESHOLD, s.at("/disk/breaker/errors").asLong(),
          "after " + TierBreaker.THRESHOLD + " errors the tier is bypassed: the other samples never touch it");
      assertEquals("closed", s.at("/cache/breaker/state").asText());
    }
  }

  @Test
  void aFullDiskTierFallsBackToStorage() throws Exception {
    Path tier = Files.createDirectories(dir.resolve("full"));
    Files.createSymbolicLink(tier.resolve(DiskTier.FILE), Path.of("/dev/full")); // every write: ENOSPC
    try (BufferAllocator root = new RootAllocator(64L << 20);
        BufferAllocator prefetch = root.newChildAllocator("prefetch", 0, 0); // off
        DatasetRegistry registry = new DatasetRegistry();
        MinioCache cache = new MinioCache(root, 0)) {
      DiskTier disk = new DiskTier(tier, 1 << 20);
      BatchAssembler assembler = new BatchAssembler(cache, disk, prefetch, 0, 1); // one reader: errors in order
      try {
        Dataset d = registry.register("d", "imagefolder", folder());
        assertAllBytes(assemble(assembler, d, 0, root), range(N));
        assertEquals(TierBreaker.State.OPEN, assembler.diskBreaker().state());
        assertEquals(TierBreaker.THRESHOLD, assembler.diskBreaker().errors());
        assertEquals(0, disk.entries());
      } finally {
        assembler.close();
        try {
          disk.close();
        } catch (IOException fsyncOfDevFull) {
          // /dev/full refuses fsync (EINVAL); not what this test is about
        }
      }
    }
  }

  /** The breaker's cycle, on a clock the test moves: open, half-open and failing again, half-open and closed. */
  @Test
  void anOpenDiskBreakerTriesTheTierAgainAfterItsCoolDownAndClosesOnSuccess() throws Exception {
    Path tier = dir.resolve("tier");
    AtomicLong clock = new AtomicLong();
    Duration coolDown = Duration.ofSeconds(30);
    try (BufferAllocator root = new RootAllocator(64L << 20);
        BufferAllocator prefetch = root.newChildAllocator("prefetch", 0, 0); // off
        DatasetRegistry registry = new DatasetRegistry();
        MinioCache cache = new MinioCache(root, 0)) {
      DiskTier disk = new DiskTier(tier, 1 << 20);
      TierBreaker breaker = new TierBreaker("disk tier " + tier, 3, coolDown, clock::get);
      BatchAssembler assembler =
          new BatchAssembler(cache, disk, new TierBreaker("memory cache"), breaker, prefetch, 0, 1);
      try {
        Dataset d = registry.register("d", "imagefolder", folder());
        assemble(assembler, d, 0, root);
        byte[] saved = truncate(tier);

        assertAllBytes(assemble(assembler, d, 1, root), range(N));
        assertEquals(TierBreaker.State.OPEN, breaker.state());
        assertEquals(3, breaker.errors());
        assertAllBytes(assemble(assembler, d, 2, root), range(N));
        assertEquals(3, breaker.errors(), "bypassed during its cool-down");

        clock.addAndGet(coolDown.toNanos());
        assertAllBytes(assemble(assembler, d, 3, root), range(N));
        assertEquals(4, breaker.errors(), "half-open: one more try, which fails");
        assertEquals(TierBreaker.State.OPEN, breaker.state());

        Files.write(tier.resolve(DiskTier.FILE), saved); // the tier works again
        clock.addAndGet(coolDown.toNanos());
        assertAllBytes(assemble(assembler, d, 4, root), range(N));
        assertEquals(TierBreaker.State.CLOSED, breaker.state());
        assertEquals(N, diskHits(d, 4));
        assertEquals(0, d.stats().epoch(4).storageBytes(), "served from the disk tier again");
      } finally {
        assembler.close();
        disk.close();
      }
    }
  }

  private static long diskHits(Dataset d, long epoch) {
    return d.stats().toJson().at("/epochs/" + epoch + "/disk_hits").asLong();
  }

  /** A memory-cache admission that cannot allocate (direct memory exhausted) never fails the batch. */
  @Test
  void aMemoryCacheThatCannotAllocateFallsBackToStorage() throws Exception {
    FailingAllocations cacheMemory = new FailingAllocations("cache");
    try (BufferAllocator root = cacheMemory.root(64L << 20);
        DataPlane plane = DataPlane.builder(root, TOKEN).port(0).sharedMemory(false).cacheCapacity(8L * SAMPLE)
            .prefetch(0, 0, 1).build().start(); // one reader of misses: admissions one after another
        FlightTestClient c = new FlightTestClient(root, plane)) {
      plane.registry().register("d", "imagefolder", folder());
      assertAllBytes(c.fetch("d", 0, range(N)), range(N));
      JsonNode s = c.stats();
      assertEquals(0, s.at("/cache/entries").asLong());
      assertEquals("open", s.at("/cache/breaker/state").asText(), s.toString());
      assertEquals(TierBreaker.THRESHOLD, s.at("/cache/breaker/errors").asLong());
      assertEquals(TierBreaker.THRESHOLD, cacheMemory.failures.get(), "no allocation tried while bypassed");
    }
  }

  /**
   * A prefetch slot whose staging cannot be allocated (direct memory exhausted) completes its future: the batch
   * that needs the sample reads it itself instead of waiting forever.
   */
  @Test
  void aPrefetchSlotWhoseAllocationFailsDoesNotHangItsBatch() throws Exception {
    FailingAllocations staging = new FailingAllocations("prefetch");
    try (BufferAllocator root = staging.root(64L << 20);
        DataPlane plane = DataPlane.builder(root, TOKEN).port(0).prefetch(1L << 20, N, 2).build().start();
        FlightTestClient c = new FlightTestClient(root, plane)) {
      plane.registry().register("d", "imagefolder", folder());
      long[] order = {5, 0, 11, 3, 7, 1, 9, 2, 10, 4, 8, 6};
      c.action("prefetch", new Plan("d", 0, order).toBytes());
      await().atMost(Duration.ofSeconds(20)).until(() -> staging.failures.get() > 0); // sample 5's slot failed
      CompletableFuture<List<byte[]>> batch = CompletableFuture.supplyAsync(() -> {
        try {
          return c.fetch("d", 0, order);
        } catch (Exception e) {
          throw new IllegalStateException(e);
        }
      });
      await().atMost(Duration.ofSeconds(20)).until(batch::isDone);
      assertAllBytes(batch.get(), order);
      assertEquals((long) N * SAMPLE, epoch(c.stats(), 0).get("storage_bytes").asLong());
    }
  }

  private static List<byte[]> assemble(BatchAssembler a, Dataset d, long epoch, BufferAllocator allocator)
      throws IOException {
    List<byte[]> out = new ArrayList<>();
    try (VectorSchemaRoot batch =
        a.assemble(d, BatchAssembler.Requester.of(d), epoch, IntStream.range(0, N).toArray(), allocator)) {
      VarBinaryVector payload = (VarBinaryVector) batch.getVector(BatchSchema.PAYLOAD);
      for (int i = 0; i < batch.getRowCount(); i++) {
        out.add(payload.get(i));
      }
    }
    return out;
  }
}
