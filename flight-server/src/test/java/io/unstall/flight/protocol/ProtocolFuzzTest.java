package io.unstall.flight.protocol;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.code_intelligence.jazzer.junit.FuzzTest;
import java.io.IOException;
import java.net.URISyntaxException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;

/**
 * Fuzz targets for the wire parsers (docs/ARCHITECTURE.md, "Fuzzing"): arbitrary bytes, as any peer could send
 * them. A parser either returns a message that encodes back to exactly those bytes (one message, one encoding:
 * a lenient decoder that maps two inputs to one value fails here), or throws its documented error:
 * {@link MalformedTicketException} for tickets and plans, an IllegalArgumentException saying "malformed local
 * request" for the same-host frames. Any other exception, or an allocation sized by a declared length rather
 * than by the bytes present, is a finding.
 *
 * <p>Plain {@code mvn test} replays each target's corpus, {@code src/test/resources/io/unstall/flight/protocol/
 * ProtocolFuzzTestInputs/<method>/}: the golden fixtures (as {@code fixture-<name>}, checked equal below), the
 * shim's encodings, and every input a fuzzing run found failing. {@code scripts/fuzz.sh} fuzzes.
 */
class ProtocolFuzzTest {

  @FuzzTest
  void fetchTicket(byte[] bytes) {
    FetchTicket t;
    try {
      t = FetchTicket.parse(bytes);
    } catch (MalformedTicketException e) {
      return;
    }
    assertArrayEquals(bytes, t.toBytes());
  }

  /** A {@code prefetch} body: its declared size is read first (to refuse a plan over the bound unparsed). */
  @FuzzTest
  void plan(byte[] bytes) {
    long declared = Plan.declaredSize(bytes);
    Plan p;
    try {
      p = Plan.parse(bytes);
    } catch (MalformedTicketException e) {
      return;
    }
    assertArrayEquals(bytes, p.toBytes());
    assertEquals(p.size(), declared);
  }

  /** A sidecar-to-sidecar ticket (the partitioned cache), taken on the peer port. */
  @FuzzTest
  void peerTicket(byte[] bytes) {
    PeerTicket t;
    try {
      t = PeerTicket.parse(bytes);
    } catch (MalformedTicketException e) {
      return;
    }
    assertArrayEquals(bytes, t.toBytes());
  }

  @FuzzTest
  void prepTicket(byte[] bytes) {
    PrepTicket t;
    try {
      t = PrepTicket.parse(bytes);
    } catch (MalformedTicketException e) {
      return;
    }
    assertTrue(PrepTicket.isPrep(bytes));
    assertArrayEquals(bytes, t.toBytes());
  }

  /** A request body of the local socket (the frame's bytes after its length), parsed as LocalConnection does. */
  @FuzzTest
  void localRequest(byte[] body) {
    ByteBuffer b = ByteBuffer.wrap(body).order(ByteOrder.LITTLE_ENDIAN);
    if (!b.hasRemaining()) {
      return; // a frame body has at least its kind byte (LocalFrames.bodyLength)
    }
    int kind = Byte.toUnsignedInt(b.get());
    try {
      switch (kind) {
        case LocalFrames.HELLO -> assertEquals(body.length - 8, LocalFrames.parseHello(b).length);
        case LocalFrames.OPEN -> assertFalse(LocalFrames.parseOpen(b).dataset().isEmpty());
        case LocalFrames.FETCH, LocalFrames.PLAN -> {
          LocalFrames.IdList r = LocalFrames.parseIds(b, kind);
          assertArrayEquals(body, LocalFrames.encodeIds(kind, r.session(), r.epoch(), r.ids()));
        }
        case LocalFrames.CLOSE, LocalFrames.CACHED -> {
          assertArrayEquals(body, LocalFrames.encodeSession(kind, LocalFrames.parseSession(b)));
        }
        case LocalFrames.PREP -> {
          LocalFrames.PrepAction r = LocalFrames.parsePrep(b);
          assertTrue(r.type().startsWith("prep."), r.type());
          assertArrayEquals(body, LocalFrames.encodePrep(r.type(), r.body()));
        }
        default -> {
          return; // LocalConnection answers an unknown kind with an error naming the known ones
        }
      }
    } catch (IllegalArgumentException e) {
      String m = e.getMessage();
      assertTrue(m.startsWith("malformed local request: ") || m.equals("OPEN needs {\"dataset\": name}"), m);
    }
  }

  /** The seeds copied from protocol/fixtures must stay byte-equal to them. */
  @Test
  void fixtureSeedsAreTheGoldenFixtures() throws IOException, URISyntaxException {
    Path inputs = Path.of(ProtocolFuzzTest.class.getResource("ProtocolFuzzTestInputs").toURI());
    List<Path> seeds;
    try (Stream<Path> s = Files.walk(inputs)) {
      seeds = s.filter(p -> p.getFileName().toString().startsWith("fixture-")).toList();
    }
    assertTrue(seeds.size() >= 8, "seeds from protocol/fixtures: " + seeds);
    for (Path seed : seeds) {
      Path golden = ProtocolFixturesTest.FIXTURES.resolve(seed.getFileName().toString().substring("fixture-".length()));
      assertArrayEquals(Files.readAllBytes(golden), Files.readAllBytes(seed), seed + " differs from " + golden);
    }
  }
}
