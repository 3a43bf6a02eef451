package io.unstall.flight;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import io.unstall.flight.format.ImageFolders;
import io.unstall.flight.local.LocalTestClient;
import io.unstall.flight.protocol.LocalFrames;
import io.unstall.flight.protocol.ProtocolFixturesTest;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Base64;
import java.util.BitSet;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.flight.FlightStatusCode;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The {@code cached} snapshot: which samples of a dataset the tiers hold, the same over Flight and the socket. */
class CachedSnapshotTest {
  static final int SAMPLE = 1000;
  static final int N = 10;

  @TempDir Path dir;

  private static BitSet bits(JsonNode doc) {
    return BitSet.valueOf(Base64.getDecoder().decode(doc.get("bitmap").asText()));
  }

  private static byte[] cachedFrame(long session) {
    return LocalFrames.encodeSession(LocalFrames.CACHED, session);
  }

  @Test
  void theBitmapNamesWhatTheCacheHoldsOnBothTransports() throws Exception {
    Assumptions.assumeTrue(Files.isWritable(Path.of("/dev/shm")), "needs /dev/shm");
    ImageFolders.write(dir.resolve("imgs"), 2, N / 2, i -> SAMPLE + 37 * i, 11);
    try (BufferAllocator root = new RootAllocator(64L << 20);
        DataPlane plane = DataPlane.builder(root, FlightTestClient.TOKEN).port(0).cacheCapacity(4 * SAMPLE)
            .cachePolicy("minio").build().start();
        FlightTestClient c = new FlightTestClient(root, plane)) {
      plane.registry().register("imgs", "imagefolder", dir.resolve("imgs").toString());
      byte[] body = "{\"dataset\":\"imgs\"}".getBytes(StandardCharsets.UTF_8);
      JsonNode before = c.action(UnstallProducer.ACTION_CACHED, body);
      assertEquals(N, before.get("samples").asInt());
      assertEquals(0, before.get("cached").asInt());
      assertEquals((N + 7) / 8, Base64.getDecoder().decode(before.get("bitmap").asText()).length,
          "one bit per sample, padded to whole bytes");

      c.fetch("imgs", 0, 1, 3, 8); // 3 samples fit the cache of about 4
      JsonNode flight = c.action(UnstallProducer.ACTION_CACHED, body);
      BitSet expected = new BitSet();
      expected.set(1);
      expected.set(3);
      expected.set(8);
      assertEquals(expected, bits(flight));
      assertEquals(FlightTestClient.JSON.readTree(
          ProtocolFixturesTest.FIXTURES.resolve("cached-v1.json").toFile()), flight, "the golden document");

      try (LocalTestClient l = new LocalTestClient(plane.localEndpoint(), FlightTestClient.TOKEN)) {
        long session = l.open("imgs");
        JsonNode local = l.ok(cachedFrame(session));
        assertEquals(flight, local, "the socket answers the same document");
        ByteBuffer r = l.call(cachedFrame(session + 1));
        assertEquals(LocalFrames.REPLY_ERROR, r.get());
        assertEquals(LocalFrames.NOT_FOUND, r.get());
        assertTrue(StandardCharsets.UTF_8.decode(r).toString().contains("unknown session"));
      }

      FlightRuntimeException unknown = assertThrows(FlightRuntimeException.class,
          () -> c.action(UnstallProducer.ACTION_CACHED, "{\"dataset\":\"nope\"}".getBytes(StandardCharsets.UTF_8)));
      assertEquals(FlightStatusCode.NOT_FOUND, unknown.status().code());
      assertTrue(unknown.getMessage().contains("nope"), unknown.getMessage());
      FlightRuntimeException malformed = assertThrows(FlightRuntimeException.class,
          () -> c.action(UnstallProducer.ACTION_CACHED, "{}".getBytes(StandardCharsets.UTF_8)));
      assertEquals(FlightStatusCode.INVALID_ARGUMENT, malformed.status().code());
      assertTrue(malformed.getMessage().contains("{\"dataset\": name}"), malformed.getMessage());
    }
  }
}
