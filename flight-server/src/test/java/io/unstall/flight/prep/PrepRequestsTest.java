package io.unstall.flight.prep;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.unstall.flight.protocol.PrepRates;
import io.unstall.flight.protocol.ProtocolFixturesTest;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import org.apache.arrow.vector.compression.CompressionUtil;
import org.junit.jupiter.api.Test;

/** The prep.* bodies are checked before anything is looked up; every refusal names the action and the field. */
class PrepRequestsTest {
  private static byte[] json(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  @Test
  void integersOutOfRangeAreRefusedNotWrapped() {
    // 2^64 + 5: a BigInteger whose asLong() is 5
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> PrepRequests.join(
        PrepRequests.body("prep.join", json("{\"dataset\":\"imgs\",\"batch_size\":18446744073709551621}")),
        PrepPipeline.DecodeLimits.DEFAULT));
    assertTrue(e.getMessage().startsWith("prep.join: \"batch_size\" must be an integer in 1..65536"), e.getMessage());
    e = assertThrows(IllegalArgumentException.class, () -> PrepRequests.at("prep.claim",
        PrepRequests.body("prep.claim", json("{\"group\":\"g\",\"member\":1,\"epoch\":4294967296,\"batch\":0}"))));
    assertTrue(e.getMessage().startsWith("prep.claim: \"epoch\" and \"batch\"") && e.getMessage().endsWith(
        "\"epoch\" is 4294967296"), e.getMessage());
    e = assertThrows(IllegalArgumentException.class, () -> PrepRequests.member(
        PrepRequests.body("prep.leave", json("{\"group\":\"g\",\"member\":1.5}"))));
    assertTrue(e.getMessage().startsWith("\"member\""), e.getMessage());
  }

  @Test
  void putCommandsAndBodies() {
    assertEquals(new PrepRequests.At("g", 7, 2, 17),
        PrepRequests.put(json("{\"prep.put\":{\"group\":\"g\",\"member\":7,\"epoch\":2,\"batch\":17}}")));
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> PrepRequests.put(json("{\"prep.put\":{\"group\":\"g\",\"member\":7,\"batch\":17}}")));
    assertTrue(e.getMessage().startsWith("prep.put: \"epoch\" and \"batch\""), e.getMessage());
    e = assertThrows(IllegalArgumentException.class, () -> PrepRequests.body("prep.leave", json("[1]")));
    assertEquals("prep.leave: the body must be a JSON object", e.getMessage());
    e = assertThrows(IllegalArgumentException.class, () -> PrepRequests.body("prep.next", json("{")));
    assertTrue(e.getMessage().startsWith("prep.next: the body is not valid JSON"), e.getMessage());
  }

  @Test
  void prepNextRatesAreReadFromTheGoldenBodiesAndOptional() throws Exception {
    JsonNode f = new ObjectMapper().readTree(ProtocolFixturesTest.FIXTURES.resolve("prep-next-rates-v1.json").toFile());
    JsonNode with = PrepRequests.body("prep.next", json(f.get("with_rates").toString()));
    assertEquals(new PrepRates(0.00125, 0.0625), PrepRequests.rates("prep.next", with));
    assertEquals(new PrepRequests.At("8f3a2c1d9e4b7a60", 3, 1, 5), PrepRequests.at("prep.next", with));
    JsonNode without = PrepRequests.body("prep.next", json(f.get("without_rates").toString()));
    assertNull(PrepRequests.rates("prep.next", without), "an older member's body: no rates, still valid");
    assertEquals(0, PrepRequests.released("prep.next", without).length);
  }

  @Test
  void badRatesAreRefusedNamingTheField() {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> PrepRequests.rates("prep.next",
        PrepRequests.body("prep.next", json("{\"rates\":{\"decode_s_per_sample\":0.001,\"step_s\":-1}}"))));
    assertEquals("prep.next: \"rates\".step_s (seconds, a positive number) is required, got -1", e.getMessage());
    e = assertThrows(IllegalArgumentException.class, () -> PrepRequests.rates("prep.next",
        PrepRequests.body("prep.next", json("{\"rates\":{\"step_s\":0.1}}"))));
    assertTrue(e.getMessage().contains("decode_s_per_sample"), e.getMessage());
    e = assertThrows(IllegalArgumentException.class, () -> PrepRequests.rates("prep.next",
        PrepRequests.body("prep.next", json("{\"rates\":[1,2]}"))));
    assertTrue(e.getMessage().startsWith("prep.next: \"rates\" must be"), e.getMessage());
  }

  @Test
  void prepJoinGoldenBodiesAreReadFieldByField() throws Exception {
    JsonNode f = new ObjectMapper().readTree(ProtocolFixturesTest.FIXTURES.resolve("prep-join-v1.json").toFile());
    JsonNode full = f.get("full");
    List<String> names = new ArrayList<>();
    full.fieldNames().forEachRemaining(names::add);
    assertEquals(PrepRequests.JOIN_FIELDS, names,
        "the fullest body holds every field, in the order the shim writes them");
    PrepRequests.Join j = PrepRequests.join(full, PrepPipeline.DecodeLimits.DEFAULT);
    assertEquals("imgs", j.dataset());
    assertEquals(3, j.pipeline().ops().size());
    assertEquals(64, j.batchSize());
    assertEquals(7, j.seed());
    assertEquals(false, j.shuffle());
    assertEquals(true, j.dropLast());
    assertEquals(new PrepGroup.Settings(6, 67108864, 12_500_000_000L, 4, 90_000_000_000L, true, false, true),
        j.settings());
    assertEquals("trial 3", j.name());
    assertEquals(CompressionUtil.CodecType.LZ4_FRAME, PrepRequests.compression(full));
    assertEquals(2, j.share().world());
    assertEquals(1, j.share().rank());
    assertArrayEquals(new long[][] {{0, 4}}, j.share().consumed());
    assertEquals(1, j.share().skip());
    assertEquals(0.25, j.cpuLoad());
    assertEquals(256, j.cacheWindow());
    assertEquals("c25hcHNob3Q", j.cacheSnapshot());
    assertEquals(3, j.epochs());
    assertEquals(2, j.startEpoch());
    assertEquals(5, j.startBatch());

    PrepRequests.Join least = PrepRequests.join(f.get("least"), PrepPipeline.DecodeLimits.DEFAULT);
    assertNull(least.pipeline());
    assertEquals(new PrepGroup.Settings(4, 0, 30_000_000_000L, 1, 60_000_000_000L, false, true, false),
        least.settings());
    assertEquals(-1, least.startEpoch());
    assertNull(least.share());
    assertNull(least.cpuLoad());
  }

  @Test
  void prepJoinRefusesAFieldItDoesNotKnow() {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> PrepRequests.join(
        PrepRequests.body("prep.join", json("{\"dataset\":\"imgs\",\"batch_size\":4,\"window_size\":8}")),
        PrepPipeline.DecodeLimits.DEFAULT));
    assertTrue(e.getMessage().startsWith("prep.join: unknown field \"window_size\" (the fields are v, dataset,"),
        e.getMessage());
  }
}
