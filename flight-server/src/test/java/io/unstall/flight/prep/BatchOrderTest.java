package io.unstall.flight.prep;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.dataset.DatasetRegistry;
import io.unstall.flight.protocol.ProtocolFixturesTest;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.BitSet;
import java.util.List;
import org.apache.arrow.flight.FlightRuntimeException;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** A cache-first group's order: the shim's rule (protocol/fixtures/cache-order-v1.json) and one snapshot per epoch. */
class BatchOrderTest {
  @TempDir
  Path dir;
  static final ObjectMapper JSON = new ObjectMapper();
  DatasetRegistry registry = new DatasetRegistry();

  @AfterEach
  void stop() throws Exception {
    registry.close();
  }

  Dataset dataset(int samples) throws Exception {
    Path c0 = Files.createDirectories(dir.resolve("imgs" + samples).resolve("c0"));
    for (int i = 0; i < samples; i++) {
      Files.write(c0.resolve(String.format("s%03d.jpg", i)), new byte[] {(byte) i});
    }
    return registry.register("imgs" + samples, "imagefolder", c0.getParent().toString());
  }

  static BitSet bits(JsonNode ids) {
    BitSet b = new BitSet();
    ids.forEach(i -> b.set(i.asInt()));
    return b;
  }

  static int[] ints(JsonNode a) {
    return JSON.convertValue(a, int[].class);
  }

  @Test
  void reordersAsTheGoldenFixture() throws Exception {
    JsonNode cases = JSON.readTree(ProtocolFixturesTest.FIXTURES.resolve("cache-order-v1.json")
        .toFile()).get("cases");
    assertTrue(cases.size() >= 40);
    for (JsonNode c : cases) {
      int n = c.get("samples").asInt();
      BitSet cached = bits(c.get("cached"));
      String what = "case " + c;
      assertArrayEquals(ints(c.get("reordered")),
          BatchOrder.cacheFirst(ints(c.get("order")), cached, c.get("window").asInt()), what);
      BatchOrder order = new BatchOrder("g", new PrepGroup.Key("imgs" + n, "fake", 7, 1, true, false,
          c.get("window").asInt()), dataset(n), BitSet::new);
      assertEquals(cached, order.decode(c.get("cache_snapshot").asText(), "test"), what);
      assertEquals(c.get("digest").asText(), order.digest(cached), what);
      assertEquals(cached, order.decode(order.encode(cached), "test"), what);
    }
  }

  @Test
  void oneSnapshotPerEpochAndAResumedOnePinned() throws Exception {
    Dataset d = dataset(30);
    List<BitSet> taken = new ArrayList<>();
    BitSet evens = new BitSet();
    for (int i = 0; i < 30; i += 2) {
      evens.set(i);
    }
    BatchOrder order = new BatchOrder("g", new PrepGroup.Key(d.name(), "fake", 7, 5, true, false, 4), d, () -> {
      BitSet b = (BitSet) evens.clone();
      taken.add(b);
      return b;
    });
    BatchOrder seeded = new BatchOrder("g", new PrepGroup.Key(d.name(), "fake", 7, 5, true, false), d);
    int[] e0 = order.order(0).clone();
    assertArrayEquals(BatchOrder.cacheFirst(seeded.order(0), evens, 4), e0);
    assertArrayEquals(BatchOrder.cacheFirst(seeded.order(1), evens, 4), order.order(1));
    evens.clear(); // the cache changed: an epoch's order, once fixed, does not
    assertArrayEquals(e0, order.order(0));
    assertEquals(2, taken.size(), "one snapshot per epoch");
    assertSame(taken.get(0), order.snapshot(0));

    BitSet all = new BitSet();
    all.set(0, 30);
    order.pin(2, all); // a resumed member's epoch, not started here: its snapshot is the epoch's
    assertArrayEquals(seeded.order(2), order.order(2), "every sample cached: the seeded order");
    order.pin(0, taken.get(0)); // the same snapshot: nothing to refuse
    FlightRuntimeException e = assertThrows(FlightRuntimeException.class, () -> order.pin(0, all));
    assertTrue(e.getMessage().contains("epoch 0") && e.getMessage().contains(order.digest(taken.get(0)))
        && e.getMessage().contains(order.digest(all)), e.getMessage());

    order.forgetBefore(1);
    order.order(0);
    assertEquals(3, taken.size(), "a forgotten epoch is snapshot again (no member reads it any more)");
    assertNotEquals(Arrays.toString(e0), Arrays.toString(seeded.order(0)), "evens first moved samples");
  }

  @Test
  void aBadSnapshotIsRefusedNamingIt() throws Exception {
    Dataset d = dataset(12);
    BatchOrder order = new BatchOrder("g", new PrepGroup.Key(d.name(), "fake", 7, 5, true, false, 4), d,
        BitSet::new);
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> order.decode("%%", "prep.join"));
    assertTrue(e.getMessage().startsWith("prep.join: \"cache_snapshot\" is not base64"), e.getMessage());
    BitSet other = new BitSet();
    other.set(40);
    String longer = new BatchOrder("g", new PrepGroup.Key(d.name(), "fake", 7, 5, true, false), dataset(41))
        .encode(other);
    e = assertThrows(IllegalArgumentException.class, () -> order.decode(longer, "prep.join"));
    assertTrue(e.getMessage().contains("dataset 'imgs12' (12 samples, 2 bytes)"), e.getMessage());
  }
}
