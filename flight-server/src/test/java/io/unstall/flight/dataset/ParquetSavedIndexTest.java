package io.unstall.flight.dataset;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.stream.Stream;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * A Parquet dataset's index (built by decoding every row group) is saved next to its manifest and loaded when the
 * same unchanged dataset is registered again; a corrupt index file or a new file make the registry index again.
 * Either way the samples read the same.
 */
class PersistedIndexTest {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final String OPTIONS = "{\"label\": \"y\"}";
  @TempDir Path dir;

  /** A registration in a fresh registry (a restarted sidecar): was the index loaded, and each sample read. */
  private record Registration(boolean loaded, List<String> samples) {}

  private Registration register(BufferAllocator root, Path data) throws Exception {
    try (DatasetRegistry r = new DatasetRegistry()) {
      r.persistManifestsIn(dir.resolve("manifests"), null, Duration.ofHours(1));
      r.decodeFormatsIn(root);
      Dataset d = r.register("pq", "parquet", data.toString(), null, JSON.readTree(OPTIONS));
      List<String> samples = new ArrayList<>();
      for (int id = 0; id < d.size(); id++) {
        ByteBuffer b = ByteBuffer.allocate(d.length(id));
        d.read(id, b);
        samples.add(d.key(id) + " label " + d.label(id) + " " + Arrays.toString(b.array()));
      }
      return new Registration(d.indexLoaded(), samples);
    }
  }

  private Path savedIndex() throws Exception {
    try (Stream<Path> s = Files.list(dir.resolve("manifests"))) {
      return s.filter(p -> p.toString().endsWith(".index")).findFirst().orElseThrow();
    }
  }

  @Test
  void anUnchangedDatasetLoadsItsSavedIndexAndAChangedOneIsIndexedAgain() throws Exception {
    Path data = dir.resolve("data");
    Files.createDirectories(data);
    Files.copy(Path.of(getClass().getResource("/formats/rows.parquet").toURI()), data.resolve("a.parquet"));
    try (BufferAllocator root = new RootAllocator(64 << 20)) {
      Registration built = register(root, data);
      assertFalse(built.loaded());
      assertEquals(10, built.samples().size());
      Registration loaded = register(root, data);
      assertTrue(loaded.loaded());
      assertEquals(built.samples(), loaded.samples());

      Path saved = savedIndex();
      byte[] bytes = Files.readAllBytes(saved);
      bytes[bytes.length / 2] ^= 1;
      Files.write(saved, bytes);
      Registration afterCorruption = register(root, data);
      assertFalse(afterCorruption.loaded());
      assertEquals(built.samples(), afterCorruption.samples());
      assertTrue(register(root, data).loaded()); // saved again

      Files.copy(data.resolve("a.parquet"), data.resolve("b.parquet"));
      Registration grown = register(root, data);
      assertFalse(grown.loaded());
      assertEquals(20, grown.samples().size());
      assertTrue(register(root, data).loaded());
    }
  }
}
