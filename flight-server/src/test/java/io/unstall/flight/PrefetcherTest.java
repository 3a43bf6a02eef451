package io.unstall.flight;

import static org.awaitility.Awaitility.await;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;

import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.dataset.DatasetRegistry;
import io.unstall.flight.format.ImageFolders;
import java.time.Duration;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.stream.IntStream;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The prefetcher's staging on its own: a real dataset and allocator, the caches replaced by the test's hooks. */
class PrefetcherTest {
  static final int N = 32;
  static final int SAMPLE = 3000;
  static final Duration PROMPTLY = Duration.ofSeconds(20);

  @TempDir Path dir;

  private List<byte[]> samples;

  private Dataset dataset(DatasetRegistry registry) throws Exception {
    samples = ImageFolders.write(dir.resolve("d"), 4, N / 4, i -> SAMPLE, 5); // < 10 a class: in id order
    return registry.register("d", "imagefolder", dir.resolve("d").toString());
  }

  /** Awaitility polling at once and often: the race test waits twice in each of its many rounds. */
  private static org.awaitility.core.ConditionFactory soon() {
    return await().pollDelay(Duration.ZERO).pollInterval(Duration.ofMillis(1)).atMost(PROMPTLY);
  }

  private static long never() {
    return System.nanoTime() + Duration.ofDays(1).toNanos();
  }

  @Test
  void aBatchWaitsForAPrefetchedSampleOnlyUntilItsDeadline() throws Exception {
    CountDownLatch admitting = new CountDownLatch(1);
    CountDownLatch release = new CountDownLatch(1);
    // The first read hangs (storage that stopped answering): its staged future does not complete.
    Prefetcher.Source stuck = (d, epoch, id, buf, len, stats) -> {
      admitting.countDown();
      try {
        release.await();
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    };
    try (BufferAllocator root = new RootAllocator(64L << 20);
        BufferAllocator window = root.newChildAllocator("prefetch", 0, 1L << 20);
        DatasetRegistry registry = new DatasetRegistry()) {
      Dataset d = dataset(registry);
      Prefetcher p = new Prefetcher(window, N, 1, stuck, (ds, id) -> false);
      try (ArrowBuf dst = root.buffer(SAMPLE)) {
        p.plan(d, "s", d.stats(), 0, IntStream.range(0, N).toArray());
        admitting.await();
        // Sample 0 is being read; its batch's deadline has passed: it must read the sample itself, now.
        CompletableFuture<Boolean> took =
            CompletableFuture.supplyAsync(() -> take(p, d, 0, 0, dst, System.nanoTime()));
        await().atMost(PROMPTLY).until(took::isDone);
        assertFalse(took.get(), "past the deadline the batch reads the sample from storage");
      } finally {
        release.countDown();
        p.cancel("s");
        await().atMost(PROMPTLY).until(() -> p.stagedBytes() == 0); // the late read's buffer was freed
        p.close();
      }
    }
  }

  private static boolean take(Prefetcher p, Dataset d, long epoch, int id, ArrowBuf dst, long deadline) {
    try {
      return p.take(d, "s", epoch, id, dst, (long) id * SAMPLE, deadline);
    } catch (java.io.IOException e) {
      throw new java.io.UncheckedIOException(e);
    }
  }

  /**
   * A batch takes staged samples while the plan's staging is dropped (a new epoch, a closed session): each
   * staged buffer has exactly one owner, so the batch never copies from a freed buffer and none is freed twice
   * or leaked. Many rounds, both threads released together.
   */
  @Test
  void takingAndDroppingStagedSamplesRaceWithoutUseAfterFree() throws Exception {
    AtomicInteger read = new AtomicInteger();
    try (BufferAllocator root = new RootAllocator(64L << 20);
        BufferAllocator window = root.newChildAllocator("prefetch", 0, 1L << 20);
        DatasetRegistry registry = new DatasetRegistry()) {
      Dataset d = dataset(registry);
      Prefetcher p =
          new Prefetcher(window, N, 4, (ds, epoch, id, buf, len, stats) -> {
            StorageReader.readFromStorage(ds, id, buf, 0, len);
            read.incrementAndGet();
          }, (ds, id) -> false);
      int[] order = IntStream.range(0, N).toArray();
      try (ArrowBuf dst = root.buffer((long) N * SAMPLE)) {
        for (int round = 0; round < 300; round++) {
          int expected = (round + 1) * N;
          p.plan(d, "s", d.stats(), round, order);
          soon().until(() -> read.get() == expected); // every sample staged
          CyclicBarrier go = new CyclicBarrier(2);
          long epoch = round;
          CompletableFuture<boolean[]> batch = CompletableFuture.supplyAsync(() -> {
            arrive(go);
            boolean[] took = new boolean[N];
            for (int id = N - 1; id >= 0; id--) {
              took[id] = take(p, d, epoch, id, dst, never());
            }
            return took;
          });
          CompletableFuture<Void> drop = CompletableFuture.runAsync(() -> {
            arrive(go);
            p.cancel("s");
          });
          boolean[] took = batch.get(); // an IllegalStateException of a freed buffer fails here
          drop.get();
          for (int id = 0; id < N; id++) {
            if (took[id]) {
              byte[] got = new byte[SAMPLE];
              dst.getBytes((long) id * SAMPLE, got);
              assertArrayEquals(samples.get(id), got, "round " + round + " sample " + id);
            }
          }
          soon().until(() -> p.stagedBytes() == 0); // every staged buffer freed (once: else close throws)
        }
      } finally {
        p.close();
      }
    }
  }

  private static void arrive(CyclicBarrier b) {
    try {
      b.await();
    } catch (Exception e) {
      throw new IllegalStateException(e);
    }
  }
}
