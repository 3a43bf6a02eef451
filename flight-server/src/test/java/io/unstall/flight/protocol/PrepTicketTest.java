package io.unstall.flight.protocol;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import org.junit.jupiter.api.Test;

/** The PREP ticket against its golden fixtures, without and with rates (the Python shim checks the same bytes). */
class PrepTicketTest {
  static final Path FIXTURES = Path.of(System.getProperty("user.dir")).resolve("../protocol/fixtures").normalize();

  @Test
  void goldenFixtureRoundTrips() throws Exception {
    byte[] bytes = Files.readAllBytes(FIXTURES.resolve("prep-ticket-v1.bin"));
    JsonNode f = new ObjectMapper().readTree(FIXTURES.resolve("prep-ticket-v1.json").toFile());
    PrepTicket t = PrepTicket.parse(bytes);
    assertEquals(f.get("group").asText(), t.group());
    assertEquals(f.get("member").asLong(), t.member());
    assertEquals(f.get("epoch").asLong(), t.epoch());
    assertEquals(f.get("batch").asLong(), t.batch());
    assertArrayEquals(bytes, t.toBytes());
    assertEquals(24 + t.group().length(), bytes.length);
  }

  @Test
  void kindsAreTold() throws Exception {
    byte[] prep = Files.readAllBytes(FIXTURES.resolve("prep-ticket-v1.bin"));
    assertTrue(PrepTicket.isPrep(prep));
    assertFalse(PrepTicket.isPrep(new FetchTicket("imgs", 0, new long[] {1}).toBytes()));
    MalformedTicketException e = assertThrows(MalformedTicketException.class,
        () -> PrepTicket.parse(Arrays.copyOf(prep, prep.length - 1)));
    assertTrue(e.getMessage().startsWith("malformed ticket: truncated"), e.getMessage());
    e = assertThrows(MalformedTicketException.class, () -> PrepTicket.parse(Arrays.copyOf(prep, prep.length + 2)));
    assertEquals("malformed ticket: truncated at byte " + (prep.length + 2) + ": the rates after the batch index are"
        + " 16 bytes (two f64), 2 present", e.getMessage());
  }

  @Test
  void goldenFixtureWithRatesRoundTrips() throws Exception {
    byte[] bytes = Files.readAllBytes(FIXTURES.resolve("prep-ticket-rates-v1.bin"));
    JsonNode f = new ObjectMapper().readTree(FIXTURES.resolve("prep-ticket-rates-v1.json").toFile());
    PrepTicket t = PrepTicket.parse(bytes);
    assertEquals(new PrepTicket(f.get("group").asText(), f.get("member").asLong(), f.get("epoch").asLong(),
        f.get("batch").asLong(), new PrepRates(f.at("/rates/decode_s_per_sample").asDouble(),
            f.at("/rates/step_s").asDouble())), t);
    assertArrayEquals(bytes, t.toBytes());
    assertEquals(24 + t.group().length() + 16, bytes.length);
    PrepTicket without = new PrepTicket(t.group(), t.member(), t.epoch(), t.batch());
    assertNull(PrepTicket.parse(without.toBytes()).rates(), "the tail is optional");
    assertArrayEquals(Arrays.copyOf(bytes, bytes.length - 16), without.toBytes());
  }

  @Test
  void aRatesTailOfAnyOtherLengthIsMalformedAtItsOffset() throws Exception {
    byte[] rated = Files.readAllBytes(FIXTURES.resolve("prep-ticket-rates-v1.bin"));
    int batchEnd = rated.length - 16;
    MalformedTicketException e = assertThrows(MalformedTicketException.class,
        () -> PrepTicket.parse(Arrays.copyOf(rated, rated.length - 1)));
    assertEquals("malformed ticket: truncated at byte " + (rated.length - 1) + ": the rates after the batch index are"
        + " 16 bytes (two f64), 15 present", e.getMessage());
    e = assertThrows(MalformedTicketException.class, () -> PrepTicket.parse(Arrays.copyOf(rated, batchEnd + 8)));
    assertTrue(e.getMessage().endsWith("8 present"), e.getMessage());
    e = assertThrows(MalformedTicketException.class, () -> PrepTicket.parse(Arrays.copyOf(rated, rated.length + 3)));
    assertEquals("malformed ticket: 3 trailing bytes after the rates, at byte " + rated.length, e.getMessage());
  }

  @Test
  void ratesThatAreNotPositiveFiniteSecondsAreRefusedNamingTheField() throws Exception {
    byte[] rated = Files.readAllBytes(FIXTURES.resolve("prep-ticket-rates-v1.bin"));
    int at = rated.length - 16;
    for (double bad : new double[] {Double.NaN, -0.5, 0.0, -0.0, Double.POSITIVE_INFINITY}) {
      MalformedTicketException e = assertThrows(MalformedTicketException.class,
          () -> PrepTicket.parse(withDouble(rated, at, bad)));
      assertEquals("malformed ticket: at byte " + at + ": rates.decode_s_per_sample (seconds, a positive number) is"
          + " required, got " + bad, e.getMessage());
      e = assertThrows(MalformedTicketException.class, () -> PrepTicket.parse(withDouble(rated, at + 8, bad)));
      assertEquals("malformed ticket: at byte " + (at + 8) + ": rates.step_s (seconds, a positive number) is"
          + " required, got " + bad, e.getMessage());
    }
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> new PrepRates(1e-3, Double.NaN));
    assertEquals("rates.step_s (seconds, a positive number) is required, got NaN", e.getMessage());
  }

  private static byte[] withDouble(byte[] bytes, int at, double v) {
    byte[] b = bytes.clone();
    ByteBuffer.wrap(b).order(ByteOrder.LITTLE_ENDIAN).putDouble(at, v);
    return b;
  }
}
