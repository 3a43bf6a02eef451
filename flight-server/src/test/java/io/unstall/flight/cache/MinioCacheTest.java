package io.unstall.flight.cache;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.junit.jupiter.api.Test;

class MinioCacheTest {

  static Digest key(int i) {
    return new Digest(i, 0, 0, 0);
  }

  private static ArrowBuf bytes(BufferAllocator a, byte[] data) {
    ArrowBuf b = a.buffer(Math.max(1, data.length));
    b.setBytes(0, data);
    return b;
  }

  private static byte[] read(MinioCache c, BufferAllocator a, Digest k, int len) {
    try (ArrowBuf out = a.buffer(Math.max(1, len))) {
      assertTrue(c.copyTo(k, out, 0, "d"), "expected a hit for " + k);
      byte[] r = new byte[len];
      out.getBytes(0, r);
      return r;
    }
  }

  @Test
  void admitsUntilFullAndNeverEvicts() {
    try (BufferAllocator root = new RootAllocator();
        BufferAllocator memory = root.newChildAllocator("cache", 0, Long.MAX_VALUE); // as the data plane gives it
        MinioCache cache = new MinioCache(memory, 3000)) {
      Random rnd = new Random(1);
      List<byte[]> samples = new ArrayList<>();
      for (int i = 0; i < 10; i++) {
        byte[] s = new byte[1000];
        rnd.nextBytes(s);
        samples.add(s);
        try (ArrowBuf b = bytes(root, s)) {
          assertEquals(i < 3, cache.admit(key(i), b, 0, s.length, "d") == SampleCache.Admission.ADMITTED,
              "sample " + i);
        }
      }
      // Later samples never displace earlier ones, however often they are offered.
      for (int round = 0; round < 3; round++) {
        for (int i = 3; i < 10; i++) {
          try (ArrowBuf b = bytes(root, samples.get(i))) {
            assertFalse(cache.admit(key(i), b, 0, 1000, "d") == SampleCache.Admission.ADMITTED);
          }
        }
      }
      for (int i = 0; i < 3; i++) {
        assertArrayEquals(samples.get(i), read(cache, root, key(i), 1000));
      }
      try (ArrowBuf out = root.buffer(1000)) {
        assertFalse(cache.copyTo(key(5), out, 0, "d"));
      }
      assertEquals(3000, cache.usedBytes());
      assertEquals(3, cache.entries());
    }
  }

  @Test
  void aSmallerSampleStillFitsAfterALargerOneDidNot() {
    try (BufferAllocator root = new RootAllocator();
        BufferAllocator memory = root.newChildAllocator("cache", 0, Long.MAX_VALUE); // as the data plane gives it
        MinioCache cache = new MinioCache(memory, 1500)) {
      try (ArrowBuf b = bytes(root, new byte[1000])) {
        assertTrue(cache.admit(key(0), b, 0, 1000, "d") == SampleCache.Admission.ADMITTED);
        assertFalse(cache.admit(key(1), b, 0, 1000, "d") == SampleCache.Admission.ADMITTED);
        assertTrue(cache.admit(key(2), b, 0, 500, "d") == SampleCache.Admission.ADMITTED);
      }
      assertEquals(1500, cache.usedBytes());
    }
  }

  @Test
  void entriesSpanningPagesRoundTrip() {
    int big = MinioCache.PAGE + 12345;
    try (BufferAllocator root = new RootAllocator();
        BufferAllocator memory = root.newChildAllocator("cache", 0, Long.MAX_VALUE); // as the data plane gives it
        MinioCache cache = new MinioCache(memory, 3L * MinioCache.PAGE)) {
      Random rnd = new Random(2);
      byte[] a = new byte[700_000];
      byte[] b = new byte[big];
      rnd.nextBytes(a);
      rnd.nextBytes(b);
      try (ArrowBuf x = bytes(root, a); ArrowBuf y = bytes(root, b)) {
        assertTrue(cache.admit(key(0), x, 0, a.length, "d") == SampleCache.Admission.ADMITTED);
        assertTrue(cache.admit(key(1), y, 0, b.length, "d") == SampleCache.Admission.ADMITTED);
      }
      assertArrayEquals(a, read(cache, root, key(0), a.length));
      assertArrayEquals(b, read(cache, root, key(1), b.length));
      assertEquals(2L * MinioCache.PAGE, cache.allocatedBytes(), "pages are allocated lazily");
    }
  }

  @Test
  void concurrentAdmissionNeverExceedsCapacity() throws Exception {
    long capacity = 5L * MinioCache.PAGE + 777;
    try (BufferAllocator root = new RootAllocator();
        BufferAllocator memory = root.newChildAllocator("cache", 0, Long.MAX_VALUE); // as the data plane gives it
        MinioCache cache = new MinioCache(memory, capacity)) {
      ExecutorService pool = Executors.newFixedThreadPool(4);
      AtomicLong admittedBytes = new AtomicLong();
      List<Future<?>> fs = new ArrayList<>();
      for (int t = 0; t < 4; t++) {
        int thread = t;
        fs.add(pool.submit(() -> {
          Random rnd = new Random(thread);
          for (int i = 0; i < 400; i++) {
            int len = 1 + rnd.nextInt(64 * 1024);
            int id = rnd.nextInt(300); // overlapping keys across threads
            try (ArrowBuf b = root.buffer(len)) {
              b.setZero(0, len);
              if (cache.admit(key(id), b, 0, len, "d") == SampleCache.Admission.ADMITTED) {
                admittedBytes.addAndGet(len);
              }
            }
            assertTrue(cache.usedBytes() <= capacity);
            assertTrue(cache.allocatedBytes() <= (capacity + MinioCache.PAGE - 1) / MinioCache.PAGE * MinioCache.PAGE);
          }
        }));
      }
      for (Future<?> f : fs) {
        f.get();
      }
      pool.shutdown();
      assertEquals(admittedBytes.get(), cache.usedBytes(), "stats are exact");
      assertTrue(cache.usedBytes() <= capacity);
      assertTrue(cache.entries() <= 300);
    }
  }

  @Test
  void zeroCapacityCachesNothing() {
    try (BufferAllocator root = new RootAllocator();
        BufferAllocator memory = root.newChildAllocator("cache", 0, Long.MAX_VALUE); // as the data plane gives it
        MinioCache cache = new MinioCache(memory, 0)) {
      try (ArrowBuf b = bytes(root, new byte[10])) {
        assertFalse(cache.admit(key(0), b, 0, 10, "d") == SampleCache.Admission.ADMITTED);
      }
      assertEquals(0, cache.allocatedBytes());
    }
  }
}
