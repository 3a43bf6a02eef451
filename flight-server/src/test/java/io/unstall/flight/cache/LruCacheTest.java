package io.unstall.flight.cache;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Random;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.junit.jupiter.api.Test;

class LruCacheTest {
  @Test
  void evictsTheLeastRecentlyUsedAndStaysWithinCapacity() {
    int size = 3 * LruCache.BLOCK; // three blocks a sample
    try (BufferAllocator root = new RootAllocator();
        BufferAllocator memory = root.newChildAllocator("cache", 0, Long.MAX_VALUE); // as the data plane gives it
        LruCache cache = new LruCache(memory, 9L * LruCache.BLOCK)) {
      byte[][] data = new byte[5][size];
      for (int i = 0; i < 5; i++) {
        new Random(i).nextBytes(data[i]);
      }
      try (ArrowBuf buf = root.buffer(size)) {
        for (int i = 0; i < 3; i++) {
          buf.setBytes(0, data[i]);
          assertEquals(SampleCache.Admission.ADMITTED, cache.admit(MinioCacheTest.key(i), buf, 0, size, "d"));
        }
        assertTrue(cache.copyTo(MinioCacheTest.key(0), buf, 0, "d")); // 0 is now the most recent
        buf.setBytes(0, data[3]);
        assertEquals(SampleCache.Admission.ADMITTED, cache.admit(MinioCacheTest.key(3), buf, 0, size, "d"));
        assertFalse(cache.contains(MinioCacheTest.key(1)), "1 was least recently used");
        assertTrue(cache.contains(MinioCacheTest.key(0)));
        assertTrue(cache.usedBytes() <= cache.capacityBytes());
        assertTrue(cache.allocatedBytes() <= 1 << 20);
        assertTrue(cache.copyTo(MinioCacheTest.key(3), buf, 0, "d"));
        byte[] out = new byte[size];
        buf.getBytes(0, out);
        assertArrayEquals(data[3], out, "reused blocks hold the new sample's bytes");
        assertTrue(cache.copyTo(MinioCacheTest.key(0), buf, 0, "d"));
        buf.getBytes(0, out);
        assertArrayEquals(data[0], out);
      }
    }
  }
}
