package io.unstall.flight.prep;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.unstall.flight.BatchAssembler;
import io.unstall.flight.cache.MinioCache;
import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.dataset.DatasetRegistry;
import io.unstall.flight.protocol.BatchSchema;
import io.unstall.flight.protocol.ProtocolFixturesTest;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** A raw group's batch, assembled through the tiers as a prep group assembles it: its {@code header} column. */
class RawBatchesTest {
  @TempDir Path dir;

  /** Lossless (SOF3): its structure passes the rules, libjpeg refuses its coding process. */
  static byte[] lossless(byte[] jpeg) {
    byte[] b = jpeg.clone();
    for (int i = 2; i + 1 < b.length; i++) {
      if ((b[i] & 0xFF) == 0xFF && (b[i + 1] & 0xFF) == 0xC0) {
        b[i + 1] = (byte) 0xC3;
        return b;
      }
    }
    throw new AssertionError("no SOF0 marker");
  }

  @Test
  void theHeaderColumnVouchesForTheCleanJpegsOnly() throws Exception {
    byte[] clean = ImageHeaderTest.encode("jpg", 64, 48);
    byte[] mjpeg = Files.readAllBytes(ProtocolFixturesTest.FIXTURES.resolve("mjpeg-frame-v1.jpg"));
    Map<String, byte[]> files = new HashMap<>();
    files.put("a-clean.jpg", clean);
    files.put("b-mjpeg.jpg", mjpeg);
    files.put("c-cut.jpg", Arrays.copyOf(clean, clean.length / 2));
    files.put("d-lossless.jpg", lossless(clean));
    files.put("e.png", ImageHeaderTest.encode("png", 64, 48));
    files.put("f-text.jpg", "hello".getBytes(StandardCharsets.UTF_8));
    Path c0 = Files.createDirectories(dir.resolve("imgs/c0"));
    for (Map.Entry<String, byte[]> f : files.entrySet()) {
      Files.write(c0.resolve(f.getKey()), f.getValue());
    }
    ImageHeader frame = ImageHeader.read(ImageHeaderTest.direct(mjpeg));
    assertNotEquals(0, frame.standardTables(), "a Motion-JPEG frame: its packed header names the standard tables");
    Map<String, Long> want = Map.of("c0/a-clean.jpg", 64L | 48L << 16, "c0/b-mjpeg.jpg", frame.width()
        | (long) frame.height() << 16 | (long) frame.standardTables() << 32 | (long) frame.firstScan() << 40);

    GroupLock lock = new GroupLock();
    try (BufferAllocator root = new RootAllocator(64L << 20);
        BufferAllocator prefetch = root.newChildAllocator("prefetch", 0, 0); // off
        DatasetRegistry registry = new DatasetRegistry();
        MinioCache cache = new MinioCache(root, 0)) {
      BatchAssembler assembler = new BatchAssembler(cache, null, prefetch, 0, 1);
      Staging staging = new Staging("g", "prep-group-g", root, new Staging.Size(32L << 20, 2), null, lock);
      try {
        Dataset d = registry.register("imgs", "imagefolder", dir.resolve("imgs").toString());
        BatchOrder order = new BatchOrder("g", new PrepGroup.Key("imgs", "raw", 7, files.size(), false, false), d);
        RawBatches raw = new RawBatches(order, assembler, root.getRoundingPolicy(), new PrepCounts(4));
        try (VectorSchemaRoot batch = raw.prepare(0, staging)) {
          assertEquals(RawBatches.SCHEMA, batch.getSchema());
          assertEquals(files.size(), batch.getRowCount());
          VarCharVector keys = (VarCharVector) batch.getVector(BatchSchema.KEY);
          BigIntVector header = (BigIntVector) batch.getVector(VouchedHeaders.COLUMN);
          for (int i = 0; i < batch.getRowCount(); i++) {
            String key = keys.getObject(i).toString();
            assertTrue(files.containsKey(key.substring(3)), key);
            assertEquals(want.get(key), header.getObject(i), key); // null: a cut, refused, PNG or text row
          }
        }
      } finally {
        staging.free();
        assembler.close();
      }
    }
  }
}
