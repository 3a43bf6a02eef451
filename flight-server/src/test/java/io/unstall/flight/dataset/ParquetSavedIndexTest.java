package io.unstall.flight.dataset;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;

import com.fasterxml.jackson.databind.ObjectMapper;
import io.unstall.flight.format.FormatOptions;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.FileTime;
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
 * A Parquet dataset registered again (a restarted sidecar) loads the index saved next to its manifest, not
 * rewriting it, and its format then reads the footers, not the row groups, before serving: the samples read the
 * same as when the index was built.
 */
class ParquetSavedIndexTest {
  private static final ObjectMapper JSON = new ObjectMapper();
  @TempDir Path dir;

  private List<String> register(BufferAllocator root, Path data) throws Exception {
    try (DatasetRegistry r = new DatasetRegistry()) {
      r.persistManifestsIn(dir.resolve("manifests"), null, Duration.ofHours(1));
      r.decodeFormatsIn(root);
      Dataset d = r.register("pq", "parquet", data.toString(), null,
          FormatOptions.of("parquet", JSON.readTree("{\"label\": \"y\"}")));
      List<String> samples = new ArrayList<>();
      for (int id = 0; id < d.size(); id++) {
        ByteBuffer b = ByteBuffer.allocate(d.length(id));
        d.read(id, b);
        samples.add(d.key(id) + " label " + d.label(id) + " " + Arrays.toString(b.array()));
      }
      return samples;
    }
  }

  private Path savedIndex() throws Exception {
    try (Stream<Path> s = Files.list(dir.resolve("manifests"))) {
      return s.filter(p -> p.toString().endsWith(".index")).findFirst().orElseThrow();
    }
  }

  @Test
  void aRestartedSidecarLoadsTheSavedIndexAndReadsTheSameRows() throws Exception {
    Path data = dir.resolve("data");
    Files.createDirectories(data);
    Files.copy(Path.of(getClass().getResource("/formats/rows.parquet").toURI()), data.resolve("a.parquet"));
    try (BufferAllocator root = new RootAllocator(64 << 20)) {
      List<String> built = register(root, data);
      assertEquals(10, built.size());
      Path saved = savedIndex();
      FileTime written = FileTime.fromMillis(0);
      Files.setLastModifiedTime(saved, written); // a rewrite would move it
      assertEquals(built, register(root, data));
      assertEquals(written, Files.getLastModifiedTime(saved));

      Files.copy(data.resolve("a.parquet"), data.resolve("b.parquet")); // a new file: indexed again, saved again
      assertEquals(20, register(root, data).size());
      assertNotEquals(written, Files.getLastModifiedTime(savedIndex()));
    }
  }
}
