package io.unstall.flight.dataset;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.unstall.flight.format.FormatOptions;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.FileTime;
import java.time.Duration;
import java.util.List;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class PersistedIndexesTest {
  @TempDir Path dir;

  private Dataset register(Path manifests, Path data) throws Exception {
    try (DatasetRegistry r = new DatasetRegistry()) {
      r.persistManifestsIn(manifests, null, Duration.ofHours(1));
      return r.register("t", "csv", data.toString(), null, FormatOptions.NONE);
    }
  }

  private static List<Path> indexes(Path manifests) throws Exception {
    try (Stream<Path> s = Files.list(manifests)) {
      return s.filter(p -> p.toString().endsWith(".index")).toList();
    }
  }

  @Test
  void anIndexIsLoadedWhileItsFilesAreUnchangedAndRebuiltAfter() throws Exception {
    Path data = Files.createDirectories(dir.resolve("data"));
    Path manifests = dir.resolve("manifests");
    Files.writeString(data.resolve("a.csv"), "x,y\n1,2\n3,4\n");
    assertEquals(2, register(manifests, data).size());
    List<Path> idx = indexes(manifests);
    assertEquals(1, idx.size());
    FileTime written = FileTime.fromMillis(1_000_000L);
    Files.setLastModifiedTime(idx.get(0), written);

    Dataset again = register(manifests, data); // unchanged: loaded, not rewritten
    assertEquals(2, again.size());
    assertEquals(written, Files.getLastModifiedTime(idx.get(0)));
    assertTrue(again.describe().get("layout").get("columns").toString().contains("\"y\""));

    Files.writeString(data.resolve("a.csv"), "x,y\n1,2\n3,4\n5,6\n"); // changed: indexed again
    assertEquals(3, register(manifests, data).size());
    assertTrue(Files.getLastModifiedTime(idx.get(0)).compareTo(written) > 0);
    Files.writeString(data.resolve("b.csv"), "x,y\n7,8\n"); // a file added under the root: indexed again
    assertEquals(4, register(manifests, data).size());

    Files.write(idx.get(0), new byte[] {'U', 'N', 'S', 'I', 1, 0, 0}); // torn: indexed again
    assertEquals(4, register(manifests, data).size());
  }
}
