package io.unstall.flight;

import static io.unstall.flight.FlightTestClient.TOKEN;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.unstall.flight.cache.Digest;
import io.unstall.flight.format.ImageFolders;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.FileTime;
import java.util.List;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** A local file rewritten after registration is a clear error naming it, never served or cached. */
class PinnedSourceTest {
  @TempDir Path dir;

  @Test
  void anImageRewrittenWithTheSameSizeAndMtimeIsAClearErrorAndNeverCached() throws Exception {
    List<byte[]> samples = ImageFolders.write(dir.resolve("data"), 1, 4, i -> 6000, 9);
    try (BufferAllocator root = new RootAllocator(64L << 20);
        DataPlane plane = DataPlane.builder(root, TOKEN).port(0).cacheCapacity(1 << 20).build().start();
        FlightTestClient c = new FlightTestClient(root, plane)) {
      plane.registry().register("d", "imagefolder", dir.resolve("data").toString());
      Path img = dir.resolve("data/class0/img2.jpg");
      FileTime mtime = Files.getLastModifiedTime(img);
      byte[] other = samples.get(2).clone();
      other[0] ^= 1; // another version, same size
      Files.write(img, other);
      Files.setLastModifiedTime(img, mtime); // and the same mtime, as a copy with preserved times leaves it

      FlightRuntimeException e = assertThrows(FlightRuntimeException.class, () -> c.fetch("d", 0, 1, 2, 3));
      assertTrue(e.getMessage().contains("file '" + img + "' changed after registration"), e.getMessage());
      assertTrue(e.getMessage().contains("re-register the dataset"), e.getMessage());
      assertThrows(FlightRuntimeException.class, () -> c.fetch("d", 1, 2), "and on every later read");
      assertFalse(plane.cache().contains(Digest.of(ByteBuffer.wrap(other))), "the new version is not cached");
      assertFalse(plane.cache().contains(Digest.of(ByteBuffer.wrap(samples.get(2)))), "nor is the old");
      assertArrayEquals(samples.get(0), c.fetch("d", 1, 0).get(0), "the other files are served");
    }
  }
}
