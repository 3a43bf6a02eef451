package io.unstall.flight.prep;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.unstall.flight.protocol.PrepRates;
import io.unstall.flight.protocol.ProtocolFixturesTest;
import java.nio.charset.StandardCharsets;
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
}
