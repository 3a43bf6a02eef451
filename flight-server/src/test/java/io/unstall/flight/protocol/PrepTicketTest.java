package io.unstall.flight.protocol;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import org.junit.jupiter.api.Test;

/** The PREP ticket against its golden fixture (the Python shim checks the same bytes). */
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
    assertEquals("malformed ticket: 2 trailing bytes after the batch index", e.getMessage());
  }
}
