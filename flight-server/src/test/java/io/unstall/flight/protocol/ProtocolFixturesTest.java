package io.unstall.flight.protocol;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.ByteArrayOutputStream;
import java.nio.channels.Channels;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowStreamReader;
import org.apache.arrow.vector.ipc.ArrowStreamWriter;
import org.junit.jupiter.api.Test;

/** The golden wire fixtures in protocol/fixtures, shared with python-shim/tests/test_protocol.py. */
public class ProtocolFixturesTest {
  static final ObjectMapper JSON = new ObjectMapper();
  /** protocol/fixtures, for the tests of other packages that read a golden fixture. */
  public static final Path FIXTURES = Path.of(System.getProperty("unstall.root", "..")).resolve("protocol/fixtures");

  @Test
  void fetchTicketEncodesToTheGoldenBytes() throws Exception {
    JsonNode expected = JSON.readTree(FIXTURES.resolve("ticket-fetch-v1.json").toFile());
    long[] ids = new long[expected.get("ids").size()];
    for (int i = 0; i < ids.length; i++) {
      ids[i] = expected.get("ids").get(i).asLong();
    }
    FetchTicket t = new FetchTicket(expected.get("dataset").asText(), expected.get("epoch").asLong(), ids);
    assertArrayEquals(Files.readAllBytes(FIXTURES.resolve("ticket-fetch-v1.bin")), t.toBytes());
  }

  @Test
  void goldenBytesDecodeToTheFixture() throws Exception {
    JsonNode expected = JSON.readTree(FIXTURES.resolve("ticket-fetch-v1.json").toFile());
    FetchTicket t = FetchTicket.parse(Files.readAllBytes(FIXTURES.resolve("ticket-fetch-v1.bin")));
    assertEquals(expected.get("dataset").asText(), t.dataset());
    assertEquals(expected.get("epoch").asLong(), t.epoch());
    assertEquals(expected.get("ids").size(), t.size());
    for (int i = 0; i < t.size(); i++) {
      assertEquals(expected.get("ids").get(i).asLong(), t.id(i));
    }
  }

  @Test
  void planMessageMatchesItsGoldenBytes() throws Exception {
    JsonNode expected = JSON.readTree(FIXTURES.resolve("plan-v1.json").toFile());
    byte[] golden = Files.readAllBytes(FIXTURES.resolve("plan-v1.bin"));
    Plan plan = Plan.parse(golden);
    assertEquals(expected.get("dataset").asText(), plan.dataset());
    assertEquals(expected.get("epoch").asLong(), plan.epoch());
    long[] ids = new long[expected.get("ids").size()];
    for (int i = 0; i < ids.length; i++) {
      ids[i] = expected.get("ids").get(i).asLong();
    }
    assertArrayEquals(ids, plan.ids());
    assertArrayEquals(golden, new Plan(plan.dataset(), plan.epoch(), ids).toBytes());
  }

  @Test
  void aDataErrorIsDescribedAsTheGoldenFixture() throws Exception {
    JsonNode golden = JSON.readTree(FIXTURES.resolve("data-error-v1.json").toFile());
    JsonNode f = golden.get("fields");
    DataError e = new DataError(f.get("dataset").asText(), f.get("sample").asLong(), f.get("key").asText(),
        f.get("file").asText(), f.get("offset").asLong(), f.get("reason").asText());
    String expected = Files.readString(FIXTURES.resolve("data-error-v1.txt"), StandardCharsets.UTF_8);
    assertEquals(expected, e.describe(golden.get("message").asText()));
  }

  @Test
  void fetchTicketsAndPlansAreNotTakenForEachOther() throws Exception {
    byte[] fetch = Files.readAllBytes(FIXTURES.resolve("ticket-fetch-v1.bin"));
    byte[] plan = Files.readAllBytes(FIXTURES.resolve("plan-v1.bin"));
    MalformedTicketException e = assertThrows(MalformedTicketException.class, () -> Plan.parse(fetch));
    assertTrue(e.getMessage().startsWith("malformed ticket: kind 1 is not valid here (expected 2"), e.getMessage());
    e = assertThrows(MalformedTicketException.class, () -> FetchTicket.parse(plan));
    assertTrue(e.getMessage().startsWith("malformed ticket: kind 2 is not valid here (expected 1"), e.getMessage());
  }

  @Test
  void peerTicketMatchesItsGoldenBytesAndIsNoFetchTicket() throws Exception {
    JsonNode expected = JSON.readTree(FIXTURES.resolve("peer-ticket-v1.json").toFile());
    byte[] golden = Files.readAllBytes(FIXTURES.resolve("peer-ticket-v1.bin"));
    long[] ids = new long[expected.get("ids").size()];
    for (int i = 0; i < ids.length; i++) {
      ids[i] = expected.get("ids").get(i).asLong();
    }
    PeerTicket t = PeerTicket.parse(golden);
    assertEquals(expected.get("dataset").asText(), t.dataset());
    assertEquals(expected.get("epoch").asLong(), t.epoch());
    assertArrayEquals(ids, t.ids());
    assertArrayEquals(golden, new PeerTicket(t.dataset(), t.epoch(), ids).toBytes());
    // A client's FETCH is never served on the peer port, nor a PEER ticket on the client port.
    MalformedTicketException e = assertThrows(MalformedTicketException.class, () -> FetchTicket.parse(golden));
    assertTrue(e.getMessage().startsWith("malformed ticket: kind 4 is not valid here (expected 1"), e.getMessage());
    byte[] fetch = Files.readAllBytes(FIXTURES.resolve("ticket-fetch-v1.bin"));
    e = assertThrows(MalformedTicketException.class, () -> PeerTicket.parse(fetch));
    assertTrue(e.getMessage().startsWith("malformed ticket: kind 1 is not valid here (expected 4"), e.getMessage());
  }

  @Test
  void malformedTicketsAreRejectedWithTheirMessages() throws Exception {
    JsonNode cases = JSON.readTree(FIXTURES.resolve("malformed-tickets.json").toFile());
    assertTrue(cases.size() >= 4);
    for (JsonNode c : cases) {
      byte[] bytes = Files.readAllBytes(FIXTURES.resolve(c.get("file").asText()));
      MalformedTicketException e = assertThrows(MalformedTicketException.class, () -> FetchTicket.parse(bytes));
      assertTrue(
          e.getMessage().startsWith(c.get("error_prefix").asText()),
          c.get("file").asText() + ": " + e.getMessage());
    }
  }

  /** Names are decoded as strictly as Python's bytes.decode("utf-8"): never replaced by U+FFFD, never two to one. */
  @Test
  void namesMustBeUtf8AsInPython() throws Exception {
    byte[] bad = Files.readAllBytes(FIXTURES.resolve("bad-utf8-name.bin")); // "im\xffs"
    MalformedTicketException e = assertThrows(MalformedTicketException.class, () -> FetchTicket.parse(bad));
    assertEquals("malformed ticket: dataset name is not UTF-8 (invalid sequence of 1 byte at byte 2)", e.getMessage());
    byte[] plan = bad.clone();
    plan[5] = Wire.KIND_PLAN;
    e = assertThrows(MalformedTicketException.class, () -> Plan.parse(plan));
    assertTrue(e.getMessage().startsWith("malformed ticket: dataset name is not UTF-8"), e.getMessage());
    // An encoded surrogate (ED A0 80) and an overlong '/' (C0 AF) are not UTF-8 either.
    for (byte[] name : new byte[][] {{(byte) 0xed, (byte) 0xa0, (byte) 0x80}, {(byte) 0xc0, (byte) 0xaf}}) {
      byte[] t = new FetchTicket("x".repeat(name.length), 0, new long[] {1}).toBytes();
      System.arraycopy(name, 0, t, 8, name.length);
      assertThrows(MalformedTicketException.class, () -> FetchTicket.parse(t));
    }
    byte[] prep = new PrepTicket("g\u00fcte", 7, 2, 17).toBytes(); // "gxC3xBCte": cut the two-byte sequence short
    prep[10] = 't';
    e = assertThrows(MalformedTicketException.class, () -> PrepTicket.parse(prep));
    assertTrue(e.getMessage().startsWith("malformed ticket: group id is not UTF-8"), e.getMessage());
    // A string with an unpaired surrogate has no UTF-8 form: refused, not sent as '?'.
    IllegalArgumentException a = assertThrows(IllegalArgumentException.class,
        () -> new FetchTicket("imgs\ud800", 0, new long[] {1}));
    assertEquals("dataset name is not valid Unicode (it has an unpaired surrogate)", a.getMessage());
    assertThrows(IllegalArgumentException.class, () -> new PrepTicket("\udc00", 1, 0, 0));
  }

  @Test
  void openBodiesAreUtf8JsonObjects() {
    java.nio.ByteBuffer open = java.nio.ByteBuffer.wrap("{\"dataset\":\"imgs\"}".getBytes(StandardCharsets.UTF_8));
    assertEquals(new LocalFrames.Open("imgs", "pid ?"), LocalFrames.parseOpen(open));
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> LocalFrames.parseOpen(java.nio.ByteBuffer.wrap(new byte[] {'"', (byte) 0xff, '"'})));
    assertTrue(e.getMessage().startsWith("malformed local request: OPEN body is not UTF-8 JSON"), e.getMessage());
  }

  /**
   * The golden batch: its schema must be exactly {@link BatchSchema#SCHEMA} and its rows the known values.
   * Run with -Dunstall.regenFixtures=true to rewrite it after a deliberate schema change (and bump the version).
   */
  @Test
  void goldenBatchHasTheWireSchema() throws Exception {
    Path file = FIXTURES.resolve("batch-v1.arrows");
    try (BufferAllocator alloc = new RootAllocator()) {
      if (Boolean.getBoolean("unstall.regenFixtures")) {
        Files.write(file, goldenBatch(alloc));
      }
      try (ArrowStreamReader r = new ArrowStreamReader(Files.newInputStream(file), alloc)) {
        VectorSchemaRoot root = r.getVectorSchemaRoot();
        assertEquals(BatchSchema.SCHEMA, root.getSchema());
        assertTrue(r.loadNextBatch());
        assertEquals(2, root.getRowCount());
        assertEquals(7L, ((BigIntVector) root.getVector("id")).get(0));
        assertEquals(3L, ((BigIntVector) root.getVector("label")).get(0));
        assertTrue(root.getVector("label").isNull(1));
        assertEquals("cat/7.jpg", new String(((VarCharVector) root.getVector("key")).get(0), StandardCharsets.UTF_8));
        assertEquals("shard-0.tfrecord@0",
            new String(((VarCharVector) root.getVector("key")).get(1), StandardCharsets.UTF_8));
        assertArrayEquals(new byte[] {(byte) 0xff, (byte) 0xd8, 0, 1},
            ((VarBinaryVector) root.getVector("payload")).get(0));
        assertArrayEquals(new byte[0], ((VarBinaryVector) root.getVector("payload")).get(1));
      }
    }
  }

  private static byte[] goldenBatch(BufferAllocator alloc) throws Exception {
    try (VectorSchemaRoot root = VectorSchemaRoot.create(BatchSchema.SCHEMA, alloc)) {
      BigIntVector id = (BigIntVector) root.getVector("id");
      BigIntVector label = (BigIntVector) root.getVector("label");
      VarCharVector key = (VarCharVector) root.getVector("key");
      VarBinaryVector payload = (VarBinaryVector) root.getVector("payload");
      id.allocateNew(2);
      label.allocateNew(2);
      key.allocateNew(2);
      payload.allocateNew(2);
      id.set(0, 7);
      id.set(1, 8);
      label.set(0, 3);
      label.setNull(1);
      key.setSafe(0, "cat/7.jpg".getBytes(StandardCharsets.UTF_8));
      key.setSafe(1, "shard-0.tfrecord@0".getBytes(StandardCharsets.UTF_8));
      payload.setSafe(0, new byte[] {(byte) 0xff, (byte) 0xd8, 0, 1});
      payload.setSafe(1, new byte[0]);
      root.setRowCount(2);
      ByteArrayOutputStream out = new ByteArrayOutputStream();
      try (ArrowStreamWriter w = new ArrowStreamWriter(root, null, Channels.newChannel(out))) {
        w.start();
        w.writeBatch();
        w.end();
      }
      return out.toByteArray();
    }
  }

  private static long[] longs(JsonNode a) {
    long[] out = new long[a.size()];
    for (int i = 0; i < out.length; i++) {
      out[i] = a.get(i).asLong();
    }
    return out;
  }

  @Test
  void localFetchRequestMatchesItsGoldenBytes() throws Exception {
    JsonNode expected = JSON.readTree(FIXTURES.resolve("local-fetch-v1.json").toFile());
    byte[] golden = Files.readAllBytes(FIXTURES.resolve("local-fetch-v1.bin"));
    long[] ids = longs(expected.get("ids"));
    long session = expected.get("session").asLong();
    long epoch = expected.get("epoch").asLong();
    assertArrayEquals(golden, LocalFrames.encodeIds(LocalFrames.FETCH, session, epoch, ids));
    java.nio.ByteBuffer b = java.nio.ByteBuffer.wrap(golden).order(java.nio.ByteOrder.LITTLE_ENDIAN);
    assertEquals(LocalFrames.FETCH, b.get());
    LocalFrames.IdList parsed = LocalFrames.parseIds(b, LocalFrames.FETCH);
    assertEquals(session, parsed.session());
    assertEquals(epoch, parsed.epoch());
    assertArrayEquals(ids, parsed.ids());
  }

  @Test
  void localCachedRequestMatchesItsGoldenBytes() throws Exception {
    JsonNode expected = JSON.readTree(FIXTURES.resolve("local-cached-v1.json").toFile());
    byte[] golden = Files.readAllBytes(FIXTURES.resolve("local-cached-v1.bin"));
    long session = expected.get("session").asLong();
    assertArrayEquals(golden, LocalFrames.encodeSession(LocalFrames.CACHED, session));
    java.nio.ByteBuffer b = java.nio.ByteBuffer.wrap(golden).order(java.nio.ByteOrder.LITTLE_ENDIAN);
    assertEquals(LocalFrames.CACHED, b.get());
    assertEquals(session, LocalFrames.parseSession(b));
  }

  @Test
  void localPrepRequestMatchesItsGoldenBytes() throws Exception {
    JsonNode expected = JSON.readTree(FIXTURES.resolve("local-prep-next-v1.json").toFile());
    byte[] golden = Files.readAllBytes(FIXTURES.resolve("local-prep-next-v1.bin"));
    byte[] body = expected.get("body").asText().getBytes(java.nio.charset.StandardCharsets.UTF_8);
    assertArrayEquals(golden, LocalFrames.encodePrep(expected.get("action").asText(), body));
    java.nio.ByteBuffer b = java.nio.ByteBuffer.wrap(golden).order(java.nio.ByteOrder.LITTLE_ENDIAN);
    assertEquals(LocalFrames.PREP, b.get());
    LocalFrames.PrepAction parsed = LocalFrames.parsePrep(b);
    assertEquals("prep.next", parsed.type());
    assertArrayEquals(body, parsed.body());
    assertEquals(2, JSON.readTree(parsed.body()).get("released").size());
  }

  @Test
  void prepNextPayloadsAnswerMatchesItsGoldenDocument() throws Exception {
    JsonNode e = JSON.readTree(FIXTURES.resolve("prep-next-payloads-v1.json").toFile());
    long[] ids = JSON.treeToValue(e.get("ids"), long[].class);
    long[] labels = JSON.treeToValue(e.get("labels"), long[].class);
    String[] keys = JSON.treeToValue(e.get("keys"), String[].class);
    boolean[] prepared = JSON.treeToValue(e.get("prepared"), boolean[].class);
    int[] offsets = JSON.treeToValue(e.get("offsets"), int[].class);
    int n = ids.length;
    long[] headers = new long[n];
    for (int i = 0; i < n; i++) {
      JsonNode h = e.get("headers").get(i);
      headers[i] = h.isNull() ? -1 : h.asLong();
    }
    assertEquals(320 | 240L << 16 | 0x33L << 32 | 423L << 40, headers[2], "a Motion-JPEG frame's, packed");
    // as sent: the JSON text, read back
    assertEquals(e, JSON.readTree(JSON.writeValueAsString(
        PrepNextReply.payloads(e.get("path").asText(), ids, labels, keys, offsets, headers, prepared))));
    assertThrows(IllegalArgumentException.class,
        () -> PrepNextReply.payloads("p", ids, labels, keys, java.util.Arrays.copyOf(offsets, n), headers, null));
    assertThrows(IllegalArgumentException.class,
        () -> PrepNextReply.payloads("p", ids, labels, keys, offsets, java.util.Arrays.copyOf(headers, n - 1), null));
  }

  @Test
  void localBatchReplyMatchesItsGoldenBytes() throws Exception {
    JsonNode e = JSON.readTree(FIXTURES.resolve("local-batch-v1.json").toFile());
    int n = e.get("ids").size();
    long[] labels = new long[n];
    boolean[] valid = new boolean[n];
    int[] lengths = new int[n];
    int[] segs = new int[n];
    byte[][] keys = new byte[n][];
    for (int i = 0; i < n; i++) {
      valid[i] = !e.get("labels").get(i).isNull();
      labels[i] = valid[i] ? e.get("labels").get(i).asLong() : 0;
      lengths[i] = e.get("lengths").get(i).asInt();
      segs[i] = e.get("segs").get(i).asInt();
      keys[i] = e.get("keys").get(i).asText().getBytes(java.nio.charset.StandardCharsets.UTF_8);
    }
    java.util.List<String> segments = new java.util.ArrayList<>();
    e.get("segments").forEach(s -> segments.add(s.asText()));
    java.nio.ByteBuffer encoded = LocalFrames.batch(
        longs(e.get("ids")), labels, valid, longs(e.get("offsets")), lengths, segs, keys, segments);
    byte[] bytes = new byte[encoded.remaining()];
    encoded.get(bytes);
    assertArrayEquals(Files.readAllBytes(FIXTURES.resolve("local-batch-v1.bin")), bytes);
  }
}
