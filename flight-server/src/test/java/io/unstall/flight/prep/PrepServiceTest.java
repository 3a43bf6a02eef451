package io.unstall.flight.prep;

import static org.awaitility.Awaitility.await;
import io.unstall.flight.protocol.DataError;
import io.unstall.flight.protocol.PrepRates;
import io.unstall.flight.protocol.PrepTicket;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.unstall.flight.DataPlane;
import java.awt.Color;
import java.awt.Graphics2D;
import java.awt.image.BufferedImage;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.function.UnaryOperator;
import javax.imageio.ImageIO;
import org.apache.arrow.flight.Action;
import org.apache.arrow.flight.CallHeaders;
import org.apache.arrow.flight.FlightCallHeaders;
import org.apache.arrow.flight.FlightClient;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.flight.FlightStatusCode;
import org.apache.arrow.flight.FlightStream;
import org.apache.arrow.flight.HeaderCallOption;
import org.apache.arrow.flight.Result;
import org.apache.arrow.flight.Ticket;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.BitVector;
import org.apache.arrow.vector.FixedSizeBinaryVector;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** Coordinated prep end to end in one JVM: a real data plane, real JPEGs, a real Flight client. */
class PrepServiceTest {
  static final String TOKEN = "0123456789abcdef0123456789abcdef";
  static final ObjectMapper JSON = new ObjectMapper();
  static final int N = 23;
  static final String PIPELINE = "{\"ops\":[{\"op\":\"decode\"},{\"op\":\"random_resized_crop\",\"size\":32},"
      + "{\"op\":\"hflip\"},{\"op\":\"normalize\",\"mean\":[0.485,0.456,0.406],\"std\":[0.229,0.224,0.225]}]}";

  @TempDir Path dir;
  BufferAllocator root;
  DataPlane plane;
  FlightClient client;
  HeaderCallOption auth;

  @BeforeEach
  void start() throws Exception {
    Random rnd = new Random(3);
    for (int i = 0; i < N; i++) {
      BufferedImage img = new BufferedImage(60 + rnd.nextInt(60), 40 + rnd.nextInt(50), BufferedImage.TYPE_INT_RGB);
      Graphics2D g = img.createGraphics();
      for (int k = 0; k < 12; k++) {
        g.setColor(new Color(rnd.nextInt(256), rnd.nextInt(256), rnd.nextInt(256)));
        g.fillRect(rnd.nextInt(img.getWidth()), rnd.nextInt(img.getHeight()), 5 + rnd.nextInt(40), 5 + rnd.nextInt(40));
      }
      g.dispose();
      Path p = dir.resolve("imgs/c" + (i % 3) + "/img" + i + (i % 5 == 0 ? ".png" : ".jpg"));
      Files.createDirectories(p.getParent());
      ImageIO.write(img, i % 5 == 0 ? "png" : "jpg", p.toFile());
    }
    Files.createDirectories(dir.resolve("bad/c0"));
    Files.writeString(dir.resolve("bad/c0/not-an-image.jpg"), "hello");
    root = new RootAllocator(256L << 20);
    serve(b -> b);
    CallHeaders h = new FlightCallHeaders();
    h.insert("authorization", "Bearer " + TOKEN);
    auth = new HeaderCallOption(h);
  }

  /** A data plane with these settings (after closing the current one), its datasets and a client. */
  void serve(UnaryOperator<DataPlane.Builder> settings) throws Exception {
    if (client != null) {
      client.close();
    }
    if (plane != null) {
      plane.close();
    }
    plane = settings.apply(DataPlane.builder(root, TOKEN).port(0).cacheCapacity(1 << 20)).build().start();
    plane.registry().register("imgs", "imagefolder", dir.resolve("imgs").toString());
    plane.registry().register("bad", "imagefolder", dir.resolve("bad").toString());
    client = FlightClient.builder(root, plane.location()).build();
  }

  @AfterEach
  void stop() throws Exception {
    if (client != null) {
      client.close();
    }
    if (plane != null) {
      plane.close();
    }
    root.close(); // throws if anything leaked, staging included
    assertFalse(
        Files.exists(io.unstall.flight.shm.SharedMemory.ROOT.resolve("unstall-prep-" + ProcessHandle.current().pid())),
        "no shared-memory files left behind");
  }

  JsonNode action(String type, String body) throws Exception {
    Iterator<Result> it = client.doAction(new Action(type, body.getBytes(StandardCharsets.UTF_8)), auth);
    return JSON.readTree(it.next().getBody());
  }

  JsonNode join(String extra) throws Exception {
    return action("prep.join", "{\"dataset\":\"imgs\",\"pipeline\":" + PIPELINE + ",\"batch_size\":5" + extra + "}");
  }

  /** One batch: ids and the raw tensor bytes. */
  record Batch(long[] ids, byte[] tensor) {}

  Batch get(JsonNode j, long epoch, long batch) throws Exception {
    PrepTicket t = new PrepTicket(j.get("group").asText(), j.get("member").asLong(), epoch, batch);
    try (FlightStream s = client.getStream(t.toTicket(), auth)) {
      assertTrue(s.next());
      VectorSchemaRoot r = s.getRoot();
      assertEquals("[3,32,32]", r.getSchema().getCustomMetadata().get(PrepSchema.SHAPE));
      BigIntVector ids = (BigIntVector) r.getVector("id");
      FixedSizeBinaryVector tensor = (FixedSizeBinaryVector) r.getVector("tensor");
      long[] out = new long[r.getRowCount()];
      ByteBuffer bytes = ByteBuffer.allocate(r.getRowCount() * 3 * 32 * 32 * 4);
      for (int i = 0; i < out.length; i++) {
        out[i] = ids.get(i);
        bytes.put(tensor.get(i));
      }
      assertFalse(s.next());
      return new Batch(out, bytes.array());
    }
  }

  List<Batch> epoch(JsonNode j, long epoch) throws Exception {
    List<Batch> out = new ArrayList<>();
    for (int b = 0; b < j.get("num_batches").asInt(); b++) {
      out.add(get(j, epoch, b));
    }
    return out;
  }

  static long[] sortedIds(List<Batch> batches) {
    return batches.stream().flatMapToLong(b -> Arrays.stream(b.ids())).sorted().toArray();
  }

  JsonNode groupStats(JsonNode j) throws Exception {
    return action("prep.stats", "").get("groups").get(j.get("group").asText());
  }

  /**
   * A cache-first group: a resumed member carrying its epoch's snapshot joins and reads the very same order; one
   * carrying another snapshot of an epoch the group already reads is refused, naming both.
   */
  @Test
  void cacheFirstJoinContinuesItsSnapshotOrRefusesAnother() throws Exception {
    JsonNode a = join(",\"seed\":5,\"window\":1,\"autotune\":false,\"order\":{\"cache_first\":4}");
    assertEquals(4, a.get("order_window").asInt());
    List<Batch> first = List.of(get(a, 0, 0), get(a, 0, 1));
    String ask = "{\"group\":\"" + a.get("group").asText() + "\",\"member\":" + a.get("member") + ",\"epoch\":0}";
    JsonNode o = action("prep.order", ask);
    assertEquals(4, o.get("window").asInt());
    String other = java.util.Base64.getEncoder().encodeToString(compressed(new byte[] {-1, -1, 127}));
    FlightRuntimeException e = assertThrows(FlightRuntimeException.class, () -> join(",\"seed\":5,\"order\":"
        + "{\"cache_first\":4},\"start_epoch\":0,\"start_batch\":2,\"cache_snapshot\":\"" + other + "\""));
    assertTrue(e.getMessage().contains("snapshot " + o.get("digest").asText()), e.getMessage());
    JsonNode b = join(",\"seed\":5,\"order\":{\"cache_first\":4},\"start_epoch\":0,\"start_batch\":2,"
        + "\"cache_snapshot\":\"" + o.get("cache_snapshot").asText() + "\"");
    assertEquals(a.get("group"), b.get("group"));
    List<Batch> all = new ArrayList<>(first);
    for (int k = 2; k < 5; k++) {
      Batch x = get(a, 0, k);
      assertArrayEquals(x.ids(), get(b, 0, k).ids());
      all.add(x);
    }
    assertArrayEquals(java.util.stream.LongStream.range(0, N).toArray(), sortedIds(all), "every sample once");
    assertEquals("cache_first", groupStats(a).get("order").asText());
    JsonNode seeded = join(",\"seed\":5");
    assertNotEquals(a.get("group"), seeded.get("group"), "the order is part of the group's key");
  }

  static byte[] compressed(byte[] bitmap) {
    java.util.zip.Deflater z = new java.util.zip.Deflater();
    z.setInput(bitmap);
    z.finish();
    byte[] out = new byte[64];
    int n = z.deflate(out);
    z.end();
    return Arrays.copyOf(out, n);
  }

  /**
   * One batch's rows of a raw or hybrid group: ids, payloads, (hybrid) which the sidecar prepared, and the headers it
   * vouches for (-1: none).
   */
  record RawRows(long[] ids, byte[][] payloads, boolean[] prepared, long[] headers) {}

  RawRows getRaw(JsonNode j, long epoch, long batch) throws Exception {
    return getRaw(new PrepTicket(j.get("group").asText(), j.get("member").asLong(), epoch, batch));
  }

  RawRows getRaw(PrepTicket t) throws Exception {
    try (FlightStream s = client.getStream(t.toTicket(), auth)) {
      assertTrue(s.next());
      VectorSchemaRoot r = s.getRoot();
      int n = r.getRowCount();
      BigIntVector ids = (BigIntVector) r.getVector("id");
      VarBinaryVector payload = (VarBinaryVector) r.getVector("payload");
      BitVector prepared = (BitVector) r.getVector("prepared");
      BigIntVector header = (BigIntVector) r.getVector("header");
      RawRows out = new RawRows(new long[n], new byte[n][], new boolean[n], new long[n]);
      for (int i = 0; i < n; i++) {
        out.ids()[i] = ids.get(i);
        out.payloads()[i] = payload.get(i);
        out.prepared()[i] = prepared != null && prepared.get(i) == 1;
        out.headers()[i] = header.isNull(i) ? -1 : header.get(i);
      }
      assertFalse(s.next());
      return out;
    }
  }

  /**
   * A hybrid group ({@code "hybrid": {"cpu_load": 0.4}}): of each batch of 5 the sidecar prepares the first 2 with
   * the pipeline, bit for bit what the same pipeline's own group gives them, and leaves the other 3 as their stored
   * bytes; every sample once per epoch, in the seeded order; a bad hybrid join is refused naming the field.
   */
  @Test
  void aHybridGroupPreparesItsShareOfEachBatchAndLeavesTheRestEncoded() throws Exception {
    String u8 = "{\"ops\":[{\"op\":\"decode\"},{\"op\":\"random_resized_crop\",\"size\":32},{\"op\":\"hflip\"}],"
        + "\"layout\":\"NHWC\",\"dtype\":\"uint8\"}";
    String common = "{\"dataset\":\"imgs\",\"pipeline\":" + u8 + ",\"batch_size\":5,\"seed\":3";
    JsonNode cpu = action("prep.join", common + "}");
    JsonNode hybrid = action("prep.join", common + ",\"hybrid\":{\"cpu_load\":0.4}}");
    assertNotEquals(cpu.get("group"), hybrid.get("group"), "hybrid is part of the group's key");
    assertEquals("[32,32,3]", hybrid.get("hybrid").get("shape").toString());
    List<Long> seen = new ArrayList<>();
    for (int b = 0; b < hybrid.get("num_batches").asInt(); b++) {
      RawRows h = getRaw(hybrid, 0, b);
      PrepTicket t = new PrepTicket(cpu.get("group").asText(), cpu.get("member").asLong(), 0, b);
      try (FlightStream s = client.getStream(t.toTicket(), auth)) {
        assertTrue(s.next());
        BigIntVector ids = (BigIntVector) s.getRoot().getVector("id");
        FixedSizeBinaryVector tensor = (FixedSizeBinaryVector) s.getRoot().getVector("tensor");
        for (int i = 0; i < h.ids().length; i++) {
          assertEquals(ids.get(i), h.ids()[i], "the same order as the pipeline's own group");
          seen.add(h.ids()[i]);
          assertEquals(i < 2, h.prepared()[i], "batch " + b + " row " + i);
          if (i < 2) {
            assertArrayEquals(tensor.get(i), h.payloads()[i], "prepared by the sidecar: the CPU path's bytes");
          } else {
            assertNotEquals(32 * 32 * 3, h.payloads()[i].length, "left encoded");
            assertTrue((h.payloads()[i][0] & 0xFF) == 0xFF || (h.payloads()[i][0] & 0xFF) == 0x89, "JPEG or PNG bytes");
          }
        }
        assertFalse(s.next());
      }
    }
    assertArrayEquals(java.util.stream.LongStream.range(0, N).toArray(),
        seen.stream().mapToLong(Long::longValue).sorted().toArray(), "every sample once");
    JsonNode st = groupStats(hybrid);
    assertEquals("hybrid", st.get("prep").asText());
    assertEquals(2, st.get("hybrid").get("cpu_rows").asInt());
    int made = st.get("hybrid").get("samples_prepared").asInt() + st.get("hybrid").get("samples_encoded").asInt();
    assertTrue(made >= N, "the epoch read and the next one's staged ahead: " + made); // the window runs ahead
    FlightRuntimeException e = assertThrows(FlightRuntimeException.class,
        () -> action("prep.join", "{\"dataset\":\"imgs\",\"pipeline\":" + PIPELINE
            + ",\"batch_size\":5,\"hybrid\":{\"cpu_load\":0.4}}"));
    assertTrue(e.getMessage().contains("uint8, NHWC and on_error"), e.getMessage());
    e = assertThrows(FlightRuntimeException.class, () -> action("prep.join", common + ",\"hybrid\":{\"cpu_load\":2}}"));
    assertTrue(e.getMessage().contains("\"cpu_load\" must be a number in [0, 1] or \"auto\""), e.getMessage());
  }

  /**
   * A hybrid member over Flight sends its rates in its PREP tickets: the group's split is set from them, as from
   * {@code prep.next}'s; a ticket whose rates are not positive seconds is refused naming the field, and the member
   * reads on.
   */
  @Test
  void ratesInPrepTicketsSetTheHybridSplit() throws Exception {
    String u8 = "{\"ops\":[{\"op\":\"decode\"},{\"op\":\"random_resized_crop\",\"size\":32},{\"op\":\"hflip\"}],"
        + "\"layout\":\"NHWC\",\"dtype\":\"uint8\"}";
    JsonNode j = action("prep.join", "{\"dataset\":\"imgs\",\"pipeline\":" + u8 + ",\"batch_size\":5,\"seed\":3"
        + ",\"hybrid\":{\"cpu_load\":\"auto\"}}");
    String group = j.get("group").asText();
    long member = j.get("member").asLong();
    byte[] bad = new PrepTicket(group, member, 0, 0, new PrepRates(1e-3, 1.0)).toBytes();
    ByteBuffer.wrap(bad).order(ByteOrder.LITTLE_ENDIAN).putDouble(bad.length - 8, -1.0);
    FlightRuntimeException e = assertThrows(FlightRuntimeException.class,
        () -> client.getStream(new Ticket(bad), auth).next());
    assertEquals(FlightStatusCode.INVALID_ARGUMENT, e.status().code());
    assertTrue(e.getMessage().contains("rates.step_s (seconds, a positive number) is required, got -1.0"),
        e.getMessage());
    // a step of 10 s keeps the one report fresh (Autotuner: four steps) while the autotuner ticks
    PrepRates rates = new PrepRates(2.5e-3, 10.0);
    for (int b = 0; b < j.get("num_batches").asInt(); b++) {
      assertTrue(getRaw(new PrepTicket(group, member, 0, b, rates)).ids().length > 0, "batch " + b);
    }
    JsonNode h = await().atMost(Duration.ofSeconds(60)).until(() -> groupStats(j).get("hybrid"),
        x -> x.get("split_rule").asText().equals("rates"));
    assertEquals(1, h.get("members_reporting").asInt(), h.toString());
    assertEquals(2.5e-3, h.get("device_s_per_sample").asDouble(), h.toString());
    assertEquals(10.0, h.get("step_s").asDouble(), h.toString());
  }

  @Test
  void membersShareEveryBatchWhichIsPreparedOnce() throws Exception {
    JsonNode a = join(",\"group_size\":2,\"seed\":11,\"epochs\":2");
    JsonNode b = join(",\"group_size\":2,\"seed\":11,\"epochs\":2");
    assertEquals(a.get("group"), b.get("group"));
    assertEquals(5, a.get("num_batches").asInt()); // 23 samples, batch 5, no drop_last
    ExecutorService pool = Executors.newFixedThreadPool(2);
    try {
      Future<List<List<Batch>>> fa = pool.submit(() -> List.of(epoch(a, 0), epoch(a, 1)));
      Future<List<List<Batch>>> fb = pool.submit(() -> List.of(epoch(b, 0), epoch(b, 1)));
      List<List<Batch>> ea = fa.get();
      List<List<Batch>> eb = fb.get();
      long[] all = java.util.stream.LongStream.range(0, N).toArray();
      for (int e = 0; e < 2; e++) {
        assertArrayEquals(all, sortedIds(ea.get(e)), "every sample exactly once in epoch " + e);
        for (int k = 0; k < 5; k++) {
          assertArrayEquals(ea.get(e).get(k).ids(), eb.get(e).get(k).ids());
          assertArrayEquals(ea.get(e).get(k).tensor(), eb.get(e).get(k).tensor());
        }
      }
      assertFalse(Arrays.equals(ea.get(0).get(0).ids(), ea.get(1).get(0).ids()), "each epoch reshuffles");
    } finally {
      pool.shutdownNow();
    }
    JsonNode s = groupStats(a);
    assertEquals(10, s.get("batches_prepared").asInt());
    assertEquals(5, s.get("batches_prepared_per_epoch").get("0").asInt());
    assertEquals(5, s.get("batches_prepared_per_epoch").get("1").asInt());
    assertEquals(20, s.get("batches_served").asInt());
    assertTrue(s.get("staging_peak_bytes").asLong() <= s.get("staging_limit_bytes").asLong());
    assertTrue(s.get("staged_batches_peak").asInt() <= s.get("window").asInt());
    assertEquals("closed", s.get("state").asText(), "both members read their 2 epochs and left");
  }

  @Test
  void theSameSeedGivesTheSameCropsAndAnotherSeedOthers() throws Exception {
    Map<String, Map<Long, byte[]>> bySeed = new HashMap<>();
    for (String run : new String[] {"a7", "b7", "c8"}) {
      JsonNode j = join(",\"seed\":" + run.substring(1) + ",\"epochs\":1");
      Map<Long, byte[]> m = new HashMap<>();
      for (Batch bt : epoch(j, 0)) {
        int per = bt.tensor().length / bt.ids().length;
        for (int i = 0; i < bt.ids().length; i++) {
          m.put(bt.ids()[i], Arrays.copyOfRange(bt.tensor(), i * per, (i + 1) * per));
        }
      }
      bySeed.put(run, m);
      assertEquals("closed", groupStats(j).get("state").asText(), "a member that read its epochs leaves");
    }
    for (long id = 0; id < N; id++) {
      assertArrayEquals(bySeed.get("a7").get(id), bySeed.get("b7").get(id), "sample " + id);
    }
    int differ = 0;
    for (long id = 0; id < N; id++) {
      differ += Arrays.equals(bySeed.get("a7").get(id), bySeed.get("c8").get(id)) ? 0 : 1;
    }
    assertTrue(differ > N / 2, "seed 8 crops differ from seed 7 for most samples, differ=" + differ);
  }

  @Test
  void aSilentMemberIsDroppedAndTheOthersGoOn() throws Exception {
    JsonNode live = join(",\"group_size\":2,\"member_timeout_s\":0.5,\"window\":2");
    JsonNode dead = join(",\"group_size\":2,\"member_timeout_s\":0.5,\"window\":2");
    List<Batch> got = epoch(live, 0); // blocks on the window until `dead` is dropped
    assertEquals(N, sortedIds(got).length);
    JsonNode s = groupStats(live);
    assertEquals(1, s.get("dropped").size());
    assertEquals(dead.get("member").asLong(), s.get("dropped").get(0).get("member").asLong());
    assertTrue(s.get("dropped").get(0).get("reason").asText().contains("no heartbeat"));
    FlightRuntimeException e = assertThrows(FlightRuntimeException.class, () -> get(dead, 0, 0));
    assertEquals(FlightStatusCode.NOT_FOUND, e.status().code());
    assertTrue(e.getMessage().contains("dropped after no heartbeat"), e.getMessage());
  }

  @Test
  void stagingStaysWithinItsBound() throws Exception {
    long oneBatch = 5L * 3 * 32 * 32 * 4 + 5 * PrepGroup.ROW_OVERHEAD + PrepGroup.BATCH_OVERHEAD;
    JsonNode j = join(",\"staging_bytes\":" + (4 * oneBatch) + ",\"window\":64");
    assertTrue(j.get("window").asInt() < 64, "the window shrinks to what staging_bytes holds: " + j);
    epoch(j, 0);
    JsonNode s = groupStats(j);
    assertTrue(s.get("staging_peak_bytes").asLong() > 0);
    assertTrue(s.get("staging_peak_bytes").asLong() <= s.get("staging_limit_bytes").asLong(), s.toString());
    FlightRuntimeException e =
        assertThrows(FlightRuntimeException.class, () -> join(",\"staging_bytes\":1000,\"seed\":99"));
    assertEquals(FlightStatusCode.RESOURCE_EXHAUSTED, e.status().code());
    assertTrue(e.getMessage().contains("staging_bytes 1000 cannot hold one batch"), e.getMessage());
  }

  @Test
  void badInputNamesTheThing() throws Exception {
    FlightRuntimeException e = assertThrows(FlightRuntimeException.class,
        () -> action("prep.join", "{\"dataset\":\"imgs\",\"batch_size\":4,\"pipeline\":{\"ops\":[{\"op\":\"decode\"},"
            + "{\"op\":\"blur\"}]}}"));
    assertEquals(FlightStatusCode.INVALID_ARGUMENT, e.status().code());
    assertTrue(e.getMessage().contains("prep op #1 'blur': unknown op"), e.getMessage());
    e = assertThrows(FlightRuntimeException.class,
        () -> action("prep.join", "{\"dataset\":\"nope\",\"batch_size\":4}"));
    assertEquals(FlightStatusCode.NOT_FOUND, e.status().code());
    JsonNode j = action("prep.join", "{\"dataset\":\"bad\",\"batch_size\":1,\"pipeline\":" + PIPELINE + "}");
    e = assertThrows(FlightRuntimeException.class, () -> get(j, 0, 0));
    assertEquals(FlightStatusCode.INVALID_ARGUMENT, e.status().code()); // bad data, not an internal error
    assertTrue(e.getMessage().startsWith(DataError.MARKER + "{\"dataset\":\"bad\",\"sample\":0,"), e.getMessage());
    assertTrue(e.getMessage().contains("not-an-image.jpg")
        && e.getMessage().contains("not an image: no image format starts with the bytes 68 65 6c 6c 6f"),
        e.getMessage());
  }

  @Test
  void pipelinesWithTheSameMeaningShareAFingerprint() {
    PrepPipeline a = PrepPipeline.parse(PIPELINE);
    PrepPipeline b = PrepPipeline.parse("{\"dtype\":\"float32\",\"layout\":\"NCHW\",\"ops\":[{\"op\":\"decode\"},"
        + "{\"size\":[32,32],\"op\":\"random_resized_crop\",\"scale\":[0.08,1.0]},{\"op\":\"hflip\",\"p\":0.5},"
        + "{\"op\":\"normalize\",\"mean\":[0.485,0.456,0.406],\"std\":[0.229,0.224,0.225]}]}");
    assertEquals(a.fingerprint(), b.fingerprint());
    assertNotEquals(a.fingerprint(), PrepPipeline.parse(PIPELINE.replace("32", "33")).fingerprint());
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> PrepPipeline.parse("{\"ops\":[{\"op\":\"decode\"},{\"op\":\"resize\",\"size\":64}]}"));
    assertTrue(e.getMessage().contains("output size is not fixed"), e.getMessage());
    e = assertThrows(IllegalArgumentException.class, () -> PrepPipeline.parse(
        "{\"dtype\":\"uint8\",\"ops\":[{\"op\":\"decode\"},{\"op\":\"center_crop\",\"size\":8},{\"op\":\"normalize\","
            + "\"mean\":[0,0,0],\"std\":[1,1,1]}]}"));
    assertTrue(e.getMessage().contains("'normalize' needs a float \"dtype\""), e.getMessage());
  }

  @Test
  void sharedMemoryMembersMapTheSameBytesFlightMembersReceive() throws Exception {
    org.junit.jupiter.api.Assumptions.assumeTrue(io.unstall.flight.shm.SharedMemory.available(), "no /dev/shm");
    JsonNode shm = join(",\"group_size\":2,\"seed\":5,\"epochs\":1,\"shm\":true");
    JsonNode flight = join(",\"group_size\":2,\"seed\":5,\"epochs\":1,\"shm\":true");
    assertTrue(shm.get("shm").asBoolean(), shm.toString());
    ExecutorService pool = Executors.newSingleThreadExecutor();
    try {
      Future<List<Batch>> viaFlight = pool.submit(() -> epoch(flight, 0));
      List<String> paths = new ArrayList<>();
      List<Batch> viaShm = new ArrayList<>();
      for (int b = 0; b < shm.get("num_batches").asInt(); b++) {
        JsonNode r = action("prep.next", "{\"group\":\"" + shm.get("group").asText() + "\",\"member\":"
            + shm.get("member") + ",\"epoch\":0,\"batch\":" + b + "}");
        Path p = Path.of(r.get("path").asText());
        assertTrue(p.startsWith(io.unstall.flight.shm.SharedMemory.ROOT), p.toString());
        long[] ids = new long[r.get("rows").asInt()];
        for (int i = 0; i < ids.length; i++) {
          ids[i] = r.get("ids").get(i).asLong();
        }
        viaShm.add(new Batch(ids, head(p, ids.length * SAMPLE_BYTES)));
        paths.add(p.toString());
      }
      // this member does not report releases (no "released"): no file it mapped was written again
      assertEquals(paths.size(), new java.util.HashSet<>(paths).size(), paths.toString());
      List<Batch> got = viaFlight.get();
      for (int b = 0; b < got.size(); b++) {
        assertArrayEquals(got.get(b).ids(), viaShm.get(b).ids());
        assertArrayEquals(got.get(b).tensor(), viaShm.get(b).tensor());
      }
      action("prep.leave", "{\"group\":\"" + shm.get("group").asText() + "\",\"member\":" + shm.get("member") + "}");
      JsonNode s = groupStats(shm);
      assertEquals(5, s.get("batches_prepared").asInt());
      assertTrue(s.get("staging_peak_bytes").asLong() <= s.get("staging_limit_bytes").asLong());
      for (String p : paths) { // freed with the batch: the file is gone once the group closed
        await("removal of " + p).atMost(Duration.ofSeconds(5)).until(() -> !Files.exists(Path.of(p)));
      }
    } finally {
      pool.shutdownNow();
    }
  }


  /**
   * A raw group and a hybrid one staging in shared memory: {@code prep.next} names a slot holding each batch's
   * payloads at the offsets it gives, the very bytes (and keys, labels, prepared flags, vouched headers) a Flight
   * member of the same group receives; the sidecar vouches for each JPEG it left encoded, not for a PNG or prepared
   * pixels; the slots go with the group.
   */
  @Test
  void rawAndHybridGroupsInSharedMemoryNameTheirPayloadsInASlot() throws Exception {
    org.junit.jupiter.api.Assumptions.assumeTrue(io.unstall.flight.shm.SharedMemory.available(), "no /dev/shm");
    String u8 = "{\"ops\":[{\"op\":\"decode\"},{\"op\":\"random_resized_crop\",\"size\":32},{\"op\":\"hflip\"}],"
        + "\"layout\":\"NHWC\",\"dtype\":\"uint8\"}";
    for (String pipeline : new String[] {"null", u8 + ",\"hybrid\":{\"cpu_load\":0.4}"}) {
      String body = "{\"dataset\":\"imgs\",\"pipeline\":" + pipeline + ",\"batch_size\":5,\"seed\":4,"
          + "\"group_size\":2,\"epochs\":1,\"shm\":true}";
      JsonNode shm = action("prep.join", body);
      JsonNode flight = action("prep.join", body);
      assertTrue(shm.get("shm").asBoolean(), shm.toString());
      boolean hybrid = !pipeline.equals("null");
      ExecutorService pool = Executors.newSingleThreadExecutor();
      List<String> paths = new ArrayList<>();
      try {
        Future<List<RawRows>> viaFlight = pool.submit(() -> {
          List<RawRows> out = new ArrayList<>();
          for (int b = 0; b < flight.get("num_batches").asInt(); b++) {
            out.add(getRaw(flight, 0, b));
          }
          return out;
        });
        List<JsonNode> answers = new ArrayList<>();
        List<byte[]> slots = new ArrayList<>();
        for (int b = 0; b < shm.get("num_batches").asInt(); b++) {
          JsonNode r = next(shm, 0, b, null);
          answers.add(r);
          slots.add(head(Path.of(r.get("path").asText()), r.get("offsets").get(r.get("rows").asInt()).asInt()));
          paths.add(r.get("path").asText());
        }
        List<RawRows> got = viaFlight.get();
        for (int b = 0; b < got.size(); b++) {
          JsonNode r = answers.get(b);
          RawRows f = got.get(b);
          int n = r.get("rows").asInt();
          assertEquals(f.ids().length, n);
          assertEquals(n + 1, r.get("offsets").size(), r.toString());
          assertEquals(hybrid, r.has("prepared"), r.toString());
          assertFalse(r.has("shape") || r.has("dtype"), "payloads, not a tensor: " + r);
          for (int i = 0; i < n; i++) {
            assertEquals(f.ids()[i], r.get("ids").get(i).asLong());
            assertTrue(r.get("keys").get(i).asText().startsWith("c" + r.get("labels").get(i).asInt() + "/img"),
                "a key in its class's folder: " + r);
            assertEquals(f.prepared()[i], hybrid && r.get("prepared").get(i).asBoolean(), "batch " + b + " row " + i);
            assertArrayEquals(f.payloads()[i], Arrays.copyOfRange(slots.get(b), r.get("offsets").get(i).asInt(),
                r.get("offsets").get(i + 1).asInt()), "batch " + b + " row " + i);
            JsonNode h = r.get("headers").get(i);
            assertEquals(f.headers()[i], h.isNull() ? -1 : h.asLong(), "batch " + b + " row " + i);
            boolean jpeg = !f.prepared()[i] && r.get("keys").get(i).asText().endsWith(".jpg");
            assertEquals(jpeg ? VouchedHeaders.packed(ByteBuffer.wrap(f.payloads()[i])) : -1, f.headers()[i],
                "batch " + b + " row " + i);
            assertTrue(!jpeg || f.headers()[i] > 0, "a clean JPEG is vouched for: batch " + b + " row " + i);
          }
        }
        assertEquals(paths.size(), new java.util.HashSet<>(paths).size(), "no slot written again: " + paths);
      } finally {
        pool.shutdownNow();
      }
      action("prep.leave", "{\"group\":\"" + shm.get("group").asText() + "\",\"member\":" + shm.get("member") + "}");
      for (String p : paths) {
        await("removal of " + p).atMost(Duration.ofSeconds(5)).until(() -> !Files.exists(Path.of(p)));
      }
    }
  }

  /** Bytes of one sample of {@link #PIPELINE}'s output: float32 [3, 32, 32]. */
  static final int SAMPLE_BYTES = 3 * 32 * 32 * 4;

  /** The first {@code n} bytes of a file (a batch at the start of its shared-memory slot). */
  static byte[] head(Path p, int n) throws Exception {
    byte[] all = Files.readAllBytes(p);
    assertTrue(all.length >= n, p + " holds " + all.length + " bytes, the batch " + n);
    return java.util.Arrays.copyOf(all, n);
  }

  static byte[] read(java.nio.channels.FileChannel ch, int n) throws Exception {
    java.nio.ByteBuffer buf = java.nio.ByteBuffer.allocate(n);
    while (buf.hasRemaining() && ch.read(buf, buf.position()) > 0) {
      // reads from the start, through the open file
    }
    return buf.array();
  }

  JsonNode next(JsonNode j, long epoch, long batch, String released) throws Exception {
    return action("prep.next", "{\"group\":\"" + j.get("group").asText() + "\",\"member\":" + j.get("member")
        + ",\"epoch\":" + epoch + ",\"batch\":" + batch + (released == null ? "" : ",\"released\":" + released)
        + "}");
  }

  @Test
  void sharedMemorySlotsAreWrittenAgainOnlyAfterEveryMemberReleasedThem() throws Exception {
    org.junit.jupiter.api.Assumptions.assumeTrue(io.unstall.flight.shm.SharedMemory.available(), "no /dev/shm");
    String opts = ",\"group_size\":2,\"seed\":5,\"epochs\":3,\"shm\":true,\"window\":2,\"staging_bytes\":8388608";
    JsonNode a = join(opts);
    JsonNode b = join(opts);
    int nb = a.get("num_batches").asInt();
    // b reads every batch and lets go of each as it reads the next; a does too, but holds epoch 0's batch 0
    // to the end, as a trainer that keeps a tensor would
    JsonNode first = next(a, 0, 0, "[]");
    Path held = Path.of(first.get("path").asText());
    byte[] heldBytes = head(held, first.get("rows").asInt() * SAMPLE_BYTES);
    java.nio.channels.FileChannel heldMap = java.nio.channels.FileChannel.open(held); // as a mapping, outlives unlink
    java.util.Set<String> files = new java.util.HashSet<>();
    files.add(held.toString());
    ExecutorService pool = Executors.newSingleThreadExecutor();
    try {
      Future<?> other = pool.submit(() -> {
        String prev = "[]";
        for (int e = 0; e < 3; e++) {
          for (int k = 0; k < nb; k++) {
            next(b, e, k, prev);
            prev = "[[" + e + "," + k + "]]";
          }
        }
        return null;
      });
      String prev = "[]";
      for (int e = 0; e < 3; e++) {
        for (int k = (e == 0 ? 1 : 0); k < nb; k++) {
          JsonNode r = next(a, e, k, prev);
          files.add(r.get("path").asText());
          prev = "[[" + e + "," + k + "]]";
        }
      }
      other.get();
      assertArrayEquals(heldBytes, read(heldMap, heldBytes.length), "a held batch never changes");
      JsonNode slots = groupStats(a).get("shm_slots");
      assertTrue(slots.get("reused").asInt() > 0, slots.toString());
      assertTrue(files.size() < 3 * nb, "files reused: " + files.size() + " for " + 3 * nb + " batches");
      assertTrue(slots.get("held").asInt() >= 1, "epoch 0's batch 0 is still held: " + slots);
      action("prep.leave", "{\"group\":\"" + a.get("group").asText() + "\",\"member\":" + a.get("member") + "}");
      action("prep.leave", "{\"group\":\"" + b.get("group").asText() + "\",\"member\":" + b.get("member") + "}");
      JsonNode s = groupStats(a);
      assertEquals(3L * nb, s.get("batches_prepared").asLong());
      assertTrue(s.get("staging_peak_bytes").asLong() <= s.get("staging_limit_bytes").asLong());
      heldMap.close();
      // the group closed: the slot a member still held is retired (its file gone), the free ones wait in the
      // sidecar's pool, and the next group with batches of the same size takes them instead of making new files
      await("removal of " + held).atMost(Duration.ofSeconds(5)).until(() -> !Files.exists(held));
      JsonNode pooled = action("prep.stats", "").get("staging").get("shm_slot_pool");
      assertTrue(pooled.get("files").asInt() >= 1, pooled.toString());
      JsonNode c = join(",\"seed\":7,\"epochs\":1,\"shm\":true,\"window\":2,\"staging_bytes\":8388608");
      String prevC = "[]";
      java.util.Set<String> filesC = new java.util.HashSet<>();
      for (int k = 0; k < nb; k++) {
        filesC.add(next(c, 0, k, prevC).get("path").asText());
        prevC = "[[0," + k + "]]";
      }
      action("prep.leave", "{\"group\":\"" + c.get("group").asText() + "\",\"member\":" + c.get("member") + "}");
      assertTrue(groupStats(c).get("shm_slots").get("from_pool").asInt() >= 1, groupStats(c).toString());
      assertTrue(filesC.stream().anyMatch(files::contains), "a file of the first group: " + filesC + " " + files);
      // a group that cannot use the pooled files (no shared memory) frees them for itself when it is made
      await("the closed group's slots pooled").atMost(Duration.ofSeconds(5))
          .until(() -> action("prep.stats", "").get("staging").get("shm_slot_pool").get("files").asInt() > 0);
      JsonNode d = join(",\"seed\":8,\"epochs\":1");
      assertEquals(0, action("prep.stats", "").get("staging").get("shm_slot_pool").get("files").asInt());
      action("prep.leave", "{\"group\":\"" + d.get("group").asText() + "\",\"member\":" + d.get("member") + "}");
    } finally {
      pool.shutdownNow();
    }
  }

  @Test
  void aSlotAMemberStillMapsWhenItIsDroppedIsNeverWrittenAgain() throws Exception {
    org.junit.jupiter.api.Assumptions.assumeTrue(io.unstall.flight.shm.SharedMemory.available(), "no /dev/shm");
    JsonNode a = join(",\"group_size\":2,\"seed\":6,\"epochs\":2,\"shm\":true,\"window\":2,"
        + "\"member_timeout_s\":1");
    JsonNode b = join(",\"group_size\":2,\"seed\":6,\"epochs\":2,\"shm\":true,\"window\":2,"
        + "\"member_timeout_s\":1");
    JsonNode r = next(a, 0, 0, "[]"); // a maps batch 0, then goes silent (and is dropped)
    Path held = Path.of(r.get("path").asText());
    byte[] heldBytes = head(held, r.get("rows").asInt() * SAMPLE_BYTES);
    java.nio.channels.FileChannel heldMap = java.nio.channels.FileChannel.open(held); // as a mapping, outlives unlink
    String prev = "[]";
    for (int e = 0; e < 2; e++) {
      for (int k = 0; k < a.get("num_batches").asInt(); k++) {
        JsonNode got = next(b, e, k, prev);
        prev = "[[" + e + "," + k + "]]";
        assertArrayEquals(heldBytes, read(heldMap, heldBytes.length), "a dropped member's batch never changes");
        assertTrue(!got.get("path").asText().equals(held.toString()) || (e == 0 && k == 0),
            "the dropped member's slot is not given to another batch: " + got);
      }
    }
    heldMap.close();
    assertTrue(groupStats(b).get("shm_slots").get("retired").asInt() >= 1);
    action("prep.leave", "{\"group\":\"" + b.get("group").asText() + "\",\"member\":" + b.get("member") + "}");
  }

  JsonNode claim(JsonNode j, long epoch, long batch) throws Exception {
    return action("prep.claim", "{\"group\":\"" + j.get("group").asText() + "\",\"member\":" + j.get("member")
        + ",\"epoch\":" + epoch + ",\"batch\":" + batch + "}");
  }

  /** Uploads a member-made batch: the claimed ids and one float per sample (id * 10). */
  void upload(JsonNode j, long epoch, long batch, long[] ids) throws Exception {
    org.apache.arrow.vector.types.pojo.Schema schema = new org.apache.arrow.vector.types.pojo.Schema(List.of(
        org.apache.arrow.vector.types.pojo.Field.notNullable(
            "id", new org.apache.arrow.vector.types.pojo.ArrowType.Int(64, true)),
        org.apache.arrow.vector.types.pojo.Field.notNullable(
            "x", new org.apache.arrow.vector.types.pojo.ArrowType.FloatingPoint(
                org.apache.arrow.vector.types.FloatingPointPrecision.SINGLE))));
    try (VectorSchemaRoot r = VectorSchemaRoot.create(schema, root)) {
      BigIntVector id = (BigIntVector) r.getVector("id");
      org.apache.arrow.vector.Float4Vector x = (org.apache.arrow.vector.Float4Vector) r.getVector("x");
      id.allocateNew(ids.length);
      x.allocateNew(ids.length);
      for (int i = 0; i < ids.length; i++) {
        id.set(i, ids[i]);
        x.set(i, ids[i] * 10f);
      }
      r.setRowCount(ids.length);
      String cmd = "{\"prep.put\":{\"group\":\"" + j.get("group").asText() + "\",\"member\":" + j.get("member")
          + ",\"epoch\":" + epoch + ",\"batch\":" + batch + "}}";
      FlightClient.ClientStreamListener put = client.startPut(
          org.apache.arrow.flight.FlightDescriptor.command(cmd.getBytes(StandardCharsets.UTF_8)), r,
          new org.apache.arrow.flight.AsyncPutListener(), auth);
      put.putNext();
      put.completed();
      put.getResult();
    }
  }

  static long[] ids(JsonNode claim) {
    long[] out = new long[claim.get("ids").size()];
    for (int i = 0; i < out.length; i++) {
      out[i] = claim.get("ids").get(i).asLong();
    }
    return out;
  }

  @Test
  void membersShareBatchesTheyPrepareThemselvesAndADeadClaimerIsReplaced() throws Exception {
    String body = "{\"dataset\":\"imgs\",\"pipeline\":{\"python\":\"torchvision-v1\"},\"batch_size\":5,"
        + "\"group_size\":2,\"member_timeout_s\":0.5}";
    JsonNode a = action("prep.join", body);
    JsonNode b = action("prep.join", body);
    assertEquals(a.get("group"), b.get("group"));
    JsonNode ca = claim(a, 0, 0);
    assertEquals("produce", ca.get("state").asText());
    ExecutorService pool = Executors.newSingleThreadExecutor();
    try {
      Future<JsonNode> cb = pool.submit(() -> claim(b, 0, 0)); // waits: a prepares it
      FlightRuntimeException wrong = assertThrows(FlightRuntimeException.class, () -> upload(b, 0, 0, ids(ca)));
      assertTrue(wrong.getMessage().contains("did not claim"), wrong.getMessage());
      upload(a, 0, 0, ids(ca));
      assertEquals("ready", cb.get().get("state").asText());
      for (JsonNode m : List.of(a, b)) {
        PrepTicket t = new PrepTicket(m.get("group").asText(), m.get("member").asLong(), 0, 0);
        try (FlightStream st = client.getStream(t.toTicket(), auth)) {
          assertTrue(st.next());
          BigIntVector id = (BigIntVector) st.getRoot().getVector("id");
          org.apache.arrow.vector.Float4Vector x = (org.apache.arrow.vector.Float4Vector) st.getRoot().getVector("x");
          assertEquals(ids(ca).length, st.getRoot().getRowCount());
          for (int i = 0; i < st.getRoot().getRowCount(); i++) {
            assertEquals(ids(ca)[i], id.get(i));
            assertEquals(ids(ca)[i] * 10f, x.get(i));
          }
        }
      }
      // a claims batch 1 and dies (no more calls): after the timeout b gets to prepare it.
      assertEquals("produce", claim(a, 0, 1).get("state").asText());
      JsonNode cb1 = claim(b, 0, 1);
      assertEquals("produce", cb1.get("state").asText());
      JsonNode s = groupStats(b);
      assertEquals(a.get("member").asLong(), s.get("dropped").get(0).get("member").asLong());
      assertEquals("members", s.get("prep").asText());
      assertEquals(1, s.get("batches_prepared").asInt());
      assertEquals(1, s.get("batches_uploaded_by_member").get(a.get("member").asText()).asInt());
    } finally {
      pool.shutdownNow();
    }
  }


  @Test
  void anExpiredClaimGoesToAnotherMemberAndItsLateUploadIsRefusedNamingTheOption() throws Exception {
    serve(b -> b.prep(16, 2, Duration.ofMillis(300)));
    String body = "{\"dataset\":\"imgs\",\"pipeline\":{\"python\":\"torchvision-v1\"},\"batch_size\":5,"
        + "\"group_size\":2}";
    JsonNode a = action("prep.join", body);
    JsonNode b = action("prep.join", body);
    JsonNode ca = claim(a, 0, 0);
    assertEquals("produce", ca.get("state").asText());
    // a's transform raised: it lives on (heartbeats) but never uploads. b waits, then gets the batch to make.
    action("prep.heartbeat", "{\"group\":\"" + a.get("group").asText() + "\",\"member\":" + a.get("member") + "}");
    JsonNode cb = claim(b, 0, 0);
    assertEquals("produce", cb.get("state").asText());
    assertArrayEquals(ids(ca), ids(cb));
    FlightRuntimeException late = assertThrows(FlightRuntimeException.class, () -> upload(a, 0, 0, ids(ca)));
    assertEquals(FlightStatusCode.INVALID_ARGUMENT, late.status().code());
    assertTrue(late.getMessage().contains("claim on epoch 0 batch 0 expired")
        && late.getMessage().contains("--prep-claim-timeout"), late.getMessage());
    upload(b, 0, 0, ids(cb));
    assertEquals("ready", claim(a, 0, 0).get("state").asText());
    assertArrayEquals(ids(cb), get2(a, 0, 0));
    JsonNode s = groupStats(a);
    assertEquals(1, s.get("claims_expired").asInt());
    assertEquals(2, s.get("members").size(), "the member whose claim expired is still a member");
  }

  /** The ids of a member-made batch (its own schema, not a sidecar-prepared one). */
  long[] get2(JsonNode j, long epoch, long batch) throws Exception {
    PrepTicket t = new PrepTicket(j.get("group").asText(), j.get("member").asLong(), epoch, batch);
    try (FlightStream st = client.getStream(t.toTicket(), auth)) {
      assertTrue(st.next());
      BigIntVector id = (BigIntVector) st.getRoot().getVector("id");
      long[] out = new long[st.getRoot().getRowCount()];
      for (int i = 0; i < out.length; i++) {
        out[i] = id.get(i);
      }
      return out;
    }
  }

  @Test
  void aCallThatWaitsPastTheWaitTimeoutIsToldWhatItWaitedFor() throws Exception {
    serve(b -> b.waitTimeout(Duration.ofMillis(300)));
    // group_size 2 with one member: nothing starts within the join timeout, so its calls wait.
    JsonNode a = join(",\"group_size\":2,\"join_timeout_s\":600");
    FlightRuntimeException e = assertThrows(FlightRuntimeException.class, () -> get(a, 0, 0));
    assertEquals(FlightStatusCode.TIMED_OUT, e.status().code(), e.toString());
    assertTrue(e.getMessage().contains("epoch 0 batch 0 to be prepared") && e.getMessage().contains("--wait-timeout"),
        e.getMessage());
    JsonNode x = action("prep.join", "{\"dataset\":\"imgs\",\"pipeline\":{\"python\":\"f\"},\"batch_size\":5,"
        + "\"group_size\":2,\"join_timeout_s\":600}");
    FlightRuntimeException c = assertThrows(FlightRuntimeException.class, () -> claim(x, 0, 0));
    assertEquals(FlightStatusCode.TIMED_OUT, c.status().code(), c.toString());
    assertTrue(c.getMessage().contains("the group has not started") && c.getMessage().contains("--wait-timeout"),
        c.getMessage());
  }

  @Test
  void prepGroupsAreBoundedByTheOption() throws Exception {
    serve(b -> b.prep(2, 1, Duration.ofSeconds(60)));
    JsonNode first = join(",\"seed\":1");
    join(",\"seed\":2");
    FlightRuntimeException e = assertThrows(FlightRuntimeException.class, () -> join(",\"seed\":3"));
    assertEquals(FlightStatusCode.RESOURCE_EXHAUSTED, e.status().code(), e.toString());
    assertTrue(e.getMessage().contains("--prep-groups 2"), e.getMessage());
    assertEquals(first.get("group"), join(",\"seed\":1").get("group"), "joining a running group is no new group");
    action("prep.leave", "{\"group\":\"" + first.get("group").asText() + "\",\"member\":" + first.get("member") + "}");
    JsonNode stats = action("prep.stats", "");
    assertEquals(1, stats.get("threads").asInt());
    assertEquals(2, stats.get("max_groups").asInt());
  }

  @Test
  void aLateJoinerStartsAtTheNextWholeEpoch() throws Exception {
    JsonNode early = join(",\"seed\":31,\"window\":2");
    assertEquals(0, early.get("start_epoch").asInt());
    JsonNode alsoEarly = join(",\"seed\":31,\"window\":2"); // nothing read yet: epoch 0 is still whole
    assertEquals(0, alsoEarly.get("start_epoch").asInt());
    action("prep.leave", "{\"group\":\"" + alsoEarly.get("group").asText() + "\",\"member\":"
        + alsoEarly.get("member") + "}");
    List<Batch> e0 = new ArrayList<>(List.of(get(early, 0, 0), get(early, 0, 1)));
    JsonNode late = join(",\"seed\":31,\"window\":2");
    assertEquals(early.get("group"), late.get("group"));
    assertEquals(1, late.get("start_epoch").asInt(), "batch 0 of epoch 0 is gone: the late joiner starts at epoch 1");
    FlightRuntimeException e = assertThrows(FlightRuntimeException.class, () -> get(late, 0, 2));
    assertTrue(e.getMessage().contains("joined at epoch 1"), e.getMessage());
    ExecutorService pool = Executors.newSingleThreadExecutor();
    try {
      Future<List<Batch>> lateE1 = pool.submit(() -> epoch(late, 1)); // waits while `early` finishes epoch 0
      for (int b = 2; b < 5; b++) {
        e0.add(get(early, 0, b));
      }
      assertEquals(N, sortedIds(e0).length);
      List<Batch> earlyE1 = epoch(early, 1);
      List<Batch> got = lateE1.get();
      for (int b = 0; b < 5; b++) {
        assertArrayEquals(earlyE1.get(b).ids(), got.get(b).ids());
        assertArrayEquals(earlyE1.get(b).tensor(), got.get(b).tensor());
      }
      assertEquals(5, groupStats(early).get("batches_prepared_per_epoch").get("1").asInt(), "epoch 1 prepared once");
    } finally {
      pool.shutdownNow();
    }
  }

  @Test
  void aResumedMemberStartsAtItsBatchAndNothingBeforeItIsPrepared() throws Exception {
    JsonNode whole = join(",\"seed\":41,\"epochs\":3");
    List<List<Batch>> expected = List.of(epoch(whole, 0), epoch(whole, 1), epoch(whole, 2));
    // A job restored from a checkpoint taken after batch 2 of epoch 1, declared 3 epochs from epoch 0: 2 left.
    JsonNode resumed = join(",\"seed\":41,\"epochs\":2,\"start_epoch\":1,\"start_batch\":3");
    assertNotEquals(whole.get("group"), resumed.get("group"), "the first group closed after its 3 epochs");
    assertEquals(1, resumed.get("start_epoch").asInt());
    assertEquals(3, resumed.get("start_batch").asInt());
    FlightRuntimeException e = assertThrows(FlightRuntimeException.class, () -> get(resumed, 1, 2));
    assertTrue(e.getMessage().contains("joined at epoch 1 batch 3; epoch 1 batch 2 is before it"), e.getMessage());
    for (int b = 3; b < 5; b++) {
      Batch got = get(resumed, 1, b);
      assertArrayEquals(expected.get(1).get(b).ids(), got.ids(), "epoch 1 batch " + b);
      assertArrayEquals(expected.get(1).get(b).tensor(), got.tensor(), "epoch 1 batch " + b);
    }
    List<Batch> e2 = epoch(resumed, 2);
    for (int b = 0; b < 5; b++) {
      assertArrayEquals(expected.get(2).get(b).ids(), e2.get(b).ids());
      assertArrayEquals(expected.get(2).get(b).tensor(), e2.get(b).tensor());
    }
    JsonNode s = groupStats(resumed);
    assertEquals("{\"1\":2,\"2\":5}", s.get("batches_prepared_per_epoch").toString(), "no skipped batch was prepared");
    assertEquals("closed", s.get("state").asText(), "it left after epoch 2, the last of its declared epochs");
    e = assertThrows(FlightRuntimeException.class, () -> join(",\"seed\":42,\"start_epoch\":0,\"start_batch\":5"));
    assertEquals(FlightStatusCode.INVALID_ARGUMENT, e.status().code());
    assertTrue(e.getMessage().contains("\"start_batch\" 5 is out of range; an epoch of prep group"), e.getMessage());
  }

  @Test
  void aMemberThatSkipsAheadMakesTheGroupSkipToo() throws Exception {
    JsonNode j = join(",\"seed\":43,\"window\":2");
    List<Batch> e3 = epoch(j, 3); // set_epoch(3) after joining at epoch 0: epochs 1 and 2 are never prepared
    assertEquals(N, sortedIds(e3).length);
    JsonNode per = groupStats(j).get("batches_prepared_per_epoch");
    assertFalse(per.has("1") || per.has("2"), per.toString());
    assertEquals(5, per.get("3").asInt());
  }

  @Test
  void aResumedMemberBehindARunningGroupIsToldWhy() throws Exception {
    JsonNode early = join(",\"seed\":44,\"window\":2");
    get(early, 0, 0);
    get(early, 0, 1);
    FlightRuntimeException e = assertThrows(FlightRuntimeException.class,
        () -> join(",\"seed\":44,\"start_epoch\":0,\"start_batch\":1"));
    assertEquals(FlightStatusCode.INVALID_ARGUMENT, e.status().code());
    assertTrue(e.getMessage().contains("cannot start a member at epoch 0 batch 1: its members have read up to epoch 0"
        + " batch 2"), e.getMessage());
    JsonNode resumed = join(",\"seed\":44,\"start_epoch\":0,\"start_batch\":2"); // still held or to come
    assertEquals(early.get("group"), resumed.get("group"));
    ExecutorService pool = Executors.newSingleThreadExecutor();
    try {
      Future<Batch> r = pool.submit(() -> get(resumed, 0, 2));
      assertArrayEquals(get(early, 0, 2).ids(), r.get().ids());
    } finally {
      pool.shutdownNow();
    }
  }

  // -- hardened decoding ----------------------------------------------------------------------------------

  /** Files of the "mixed" dataset, in sample order: 6 good JPEGs, then the bad ones. */
  static final List<String> MIXED = List.of("a0.jpg", "a1.jpg", "a2.jpg", "a3.jpg", "a4.jpg", "a5.jpg",
      "bomb.jpg", "bomb30k.jpg", "garbage.jpg", "tiff.jpg", "truncated.jpg");
  static final int GOOD = 6;

  /** Registers "mixed": real JPEGs, a decompression bomb (65535x65535 and the 30000x30000 in a tiny
   * JPEG), garbage, a TIFF renamed .jpg and a JPEG cut short. */
  void registerMixed() throws Exception {
    Path c0 = dir.resolve("mixed/c0");
    Files.createDirectories(c0);
    for (int i = 0; i < GOOD; i++) {
      Files.write(c0.resolve("a" + i + ".jpg"), ImageHeaderTest.encode("jpg", 50 + 7 * i, 40 + 3 * i));
    }
    byte[] small = ImageHeaderTest.encode("jpg", 40, 30);
    Files.write(c0.resolve("bomb.jpg"), ImageHeaderTest.bomb(small, 65535, 65535));
    Files.write(c0.resolve("bomb30k.jpg"), ImageHeaderTest.bomb(small, 30000, 30000));
    Files.writeString(c0.resolve("garbage.jpg"), "this is not an image at all");
    Files.write(c0.resolve("tiff.jpg"), ImageHeaderTest.encode("tiff", 30, 30));
    byte[] jpeg = ImageHeaderTest.encode("jpg", 64, 48);
    Files.write(c0.resolve("truncated.jpg"), Arrays.copyOf(jpeg, jpeg.length - 40));
    plane.registry().register("mixed", "imagefolder", dir.resolve("mixed").toString());
  }

  static final Map<String, String> REASONS = Map.of(
      "bomb.jpg",
      "declares 65535x65535 pixels (4294836225), above the cap of 89478485 (--max-decode-pixels / decode max_pixels)",
      "bomb30k.jpg", "declares 30000x30000 pixels (900000000), above the cap of 89478485",
      "garbage.jpg", "not an image: no image format starts with the bytes 74 68 69 73",
      "tiff.jpg", "a TIFF file (first bytes",
      "truncated.jpg", "truncated JPEG: no end-of-image marker (FF D9)");

  @Test
  void eachBadImageFailsItsBatchNamingItAndTheSidecarKeepsServing() throws Exception {
    registerMixed();
    JsonNode j = action("prep.join", "{\"dataset\":\"mixed\",\"pipeline\":" + PIPELINE
        + ",\"batch_size\":1,\"shuffle\":false,\"epochs\":1}");
    assertEquals("raise", j.get("on_error").asText());
    for (int b = 0; b < MIXED.size(); b++) { // without shuffle, batch b is sample b
      String file = MIXED.get(b);
      if (b < GOOD) {
        assertArrayEquals(new long[] {b}, get(j, 0, b).ids(), file);
        continue;
      }
      int id = b;
      FlightRuntimeException e = assertThrows(FlightRuntimeException.class, () -> get(j, 0, id), file);
      assertEquals(FlightStatusCode.INVALID_ARGUMENT, e.status().code()); // bad data, not an internal error
      JsonNode fields = JSON.readTree(e.getMessage().substring(DataError.MARKER.length()).lines().findFirst().get());
      assertEquals("c0/" + file, fields.get("key").asText(), e.getMessage());
      assertEquals(b, fields.get("sample").asLong(), e.getMessage());
      assertTrue(fields.get("reason").asText().contains(REASONS.get(file)), e.getMessage());
      assertTrue(e.getMessage().contains("dataset 'mixed' sample " + b + " ('c0/" + file + "'): "), e.getMessage());
      assertTrue(e.getMessage().contains(REASONS.get(file)), e.getMessage());
      assertTrue(e.getMessage().endsWith("prep with on_error=\"skip\" leaves such samples out"), e.getMessage());
    }
    // The same sidecar still serves: a plain fetch of the good samples, and another group.
    try (FlightStream s = client.getStream(
        new io.unstall.flight.protocol.FetchTicket("mixed", 0, new long[] {0, 5}).toTicket(), auth)) {
      assertTrue(s.next());
      assertEquals(2, s.getRoot().getRowCount());
    }
    assertEquals(N, sortedIds(epoch(join(",\"seed\":61,\"epochs\":1"), 0)).length);
    JsonNode decode = action("prep.stats", "").get("decode");
    assertEquals(0, decode.get("memory_reserved_bytes").asLong(), decode.toString());
    assertTrue(decode.get("memory_peak_bytes").asLong() <= decode.get("memory_limit_bytes").asLong(),
        decode.toString());
    assertTrue(decode.get("largest_request_bytes").asLong() < 1 << 20, "no bomb got as far as reserving memory");
  }

  /** A prepared batch as a member sees it: ids, and the samples left out with their reasons. */
  record Prepared(long[] ids, JsonNode skipped) {}

  Prepared prepared(JsonNode j, long epoch, long batch) throws Exception {
    PrepTicket t = new PrepTicket(j.get("group").asText(), j.get("member").asLong(), epoch, batch);
    try (FlightStream s = client.getStream(t.toTicket(), auth)) {
      assertTrue(s.next());
      VectorSchemaRoot r = s.getRoot();
      BigIntVector ids = (BigIntVector) r.getVector("id");
      long[] out = new long[r.getRowCount()];
      for (int i = 0; i < out.length; i++) {
        out[i] = ids.get(i);
      }
      String sk = r.getSchema().getCustomMetadata().get(PrepSchema.SKIPPED);
      return new Prepared(out, sk == null ? JSON.createArrayNode() : JSON.readTree(sk));
    }
  }

  @Test
  void onErrorSkipLeavesBadImagesOutSaysWhichAndCountsThem() throws Exception {
    org.junit.jupiter.api.Assumptions.assumeTrue(io.unstall.flight.shm.SharedMemory.available(), "no /dev/shm");
    registerMixed();
    String skip = PIPELINE.replace("{\"op\":\"decode\"}", "{\"op\":\"decode\",\"on_error\":\"skip\"}");
    String body = "{\"dataset\":\"mixed\",\"pipeline\":" + skip + ",\"batch_size\":4,\"seed\":3,\"epochs\":2,"
        + "\"group_size\":2,\"shm\":true}";
    JsonNode viaFlight = action("prep.join", body);
    JsonNode viaShm = action("prep.join", body);
    assertEquals(viaFlight.get("group"), viaShm.get("group"));
    assertEquals("skip", viaFlight.get("on_error").asText());
    ExecutorService pool = Executors.newSingleThreadExecutor();
    try {
      Future<List<Prepared>> flightSide = pool.submit(() -> {
        List<Prepared> got = new ArrayList<>();
        for (int e = 0; e < 2; e++) {
          for (int b = 0; b < 3; b++) {
            got.add(prepared(viaFlight, e, b));
          }
        }
        return got;
      });
      List<JsonNode> shmSide = new ArrayList<>();
      for (int e = 0; e < 2; e++) {
        for (int b = 0; b < 3; b++) {
          shmSide.add(action("prep.next", "{\"group\":\"" + viaShm.get("group").asText() + "\",\"member\":"
              + viaShm.get("member") + ",\"epoch\":" + e + ",\"batch\":" + b + "}"));
        }
      }
      action("prep.leave",
          "{\"group\":\"" + viaShm.get("group").asText() + "\",\"member\":" + viaShm.get("member") + "}");
      List<Prepared> got = flightSide.get();
      for (int e = 0; e < 2; e++) {
        List<Long> ids = new ArrayList<>();
        Map<Long, String> skipped = new HashMap<>();
        for (int b = 0; b < 3; b++) {
          Prepared p = got.get(e * 3 + b);
          JsonNode shm = shmSide.get(e * 3 + b);
          assertEquals(p.ids().length, shm.get("rows").asInt(), "both transports: the same rows");
          assertEquals(p.skipped(), shm.has("skipped") ? shm.get("skipped") : JSON.createArrayNode());
          assertEquals(p.ids().length + p.skipped().size(), b < 2 ? 4 : 3, "every position is a row or a skip");
          Arrays.stream(p.ids()).forEach(ids::add);
          for (JsonNode sk : p.skipped()) {
            skipped.put(sk.get("id").asLong(), sk.get("key").asText() + " " + sk.get("reason").asText());
          }
        }
        assertEquals(List.of(0L, 1L, 2L, 3L, 4L, 5L), ids.stream().sorted().toList(),
            "epoch " + e + ": every good sample once, never a bad one in its place");
        assertEquals(MIXED.size() - GOOD, skipped.size());
        for (int id = GOOD; id < MIXED.size(); id++) {
          String file = MIXED.get(id);
          assertTrue(skipped.get((long) id).startsWith("c0/" + file + " "), skipped.toString());
          assertTrue(skipped.get((long) id).contains(REASONS.get(file)), skipped.get((long) id));
        }
      }
    } finally {
      pool.shutdownNow();
    }
    JsonNode s = groupStats(viaFlight);
    assertEquals(2 * (MIXED.size() - GOOD), s.get("samples_skipped").asInt(), s.toString());
    assertEquals(2 * GOOD, s.get("samples_prepared").asInt());
    assertEquals(2 * (MIXED.size() - GOOD), s.get("skipped").size());
    assertEquals("skip", s.get("on_error").asText());
    JsonNode last = s.get("skipped").get(s.get("skipped").size() - 1);
    assertEquals(1, last.get("epoch").asInt());
    assertTrue(last.has("batch") && last.has("key") && last.has("reason"), last.toString());
  }

  @Test
  void theJoinAnswerCarriesTheSidecarsDecodeCaps() throws Exception {
    JsonNode limits = join("").get("decode_limits");
    assertEquals(89_478_485L, limits.get("max_pixels").asLong(), limits.toString());
    assertEquals(100.0, limits.get("max_aspect_ratio").asDouble(), limits.toString());
    serve(b -> b.decode(20_000, 3.5, 0)); // above every image of the dataset: nothing fails
    // a raw group too: its members decode on their device (decode(device="mixed")) by the sidecar's caps
    JsonNode raw = action("prep.join", "{\"dataset\":\"imgs\",\"pipeline\":null,\"batch_size\":5}");
    for (JsonNode j : List.of(join(""), raw)) {
      assertEquals(20_000, j.get("decode_limits").get("max_pixels").asLong(), j.toString());
      assertEquals(3.5, j.get("decode_limits").get("max_aspect_ratio").asDouble(), j.toString());
    }
    JsonNode stats = action("prep.stats", "").get("decode");
    assertEquals(20_000, stats.get("max_pixels").asLong(), "the names prep.stats uses");
    assertEquals(3.5, stats.get("max_aspect_ratio").asDouble());
  }

  @Test
  void decodeFieldsAreValidatedAndPartOfTheFingerprint() {
    PrepPipeline plain = PrepPipeline.parse(PIPELINE);
    PrepPipeline spelled = PrepPipeline.parse(PIPELINE.replace("{\"op\":\"decode\"}", "{\"op\":\"decode\","
        + "\"formats\":[\"png\",\"jpg\"],\"max_pixels\":89478485,\"max_aspect_ratio\":100,\"on_error\":\"raise\"}"));
    assertEquals(plain.fingerprint(), spelled.fingerprint(), "defaults spelled out: the same group");
    assertNotEquals(plain.fingerprint(), PrepPipeline.parse(PIPELINE.replace("{\"op\":\"decode\"}",
        "{\"op\":\"decode\",\"on_error\":\"skip\"}")).fingerprint());
    assertNotEquals(plain.fingerprint(), PrepPipeline.parse(PIPELINE, new PrepPipeline.DecodeLimits(1000, 100))
        .fingerprint(), "the sidecar's default caps are part of it");
    for (String[] bad : new String[][] {
        {"\"on_error\":\"ignore\"", "\"on_error\" must be one of [raise, skip], got 'ignore'"},
        {"\"max_pixels\":0", "\"max_pixels\" must be an integer in 1..1073741824"},
        {"\"max_aspect_ratio\":0.5", "\"max_aspect_ratio\" (longer side / shorter side) must be a number >= 1"},
        {"\"formats\":[]", "\"formats\" must be a non-empty list"}}) {
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> PrepPipeline.parse(
          PIPELINE.replace("{\"op\":\"decode\"}", "{\"op\":\"decode\"," + bad[0] + "}")));
      assertTrue(e.getMessage().startsWith("prep op #0 'decode': ") && e.getMessage().contains(bad[1]), e.getMessage());
    }
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> PrepPipeline.parse(
        "{\"ops\":[{\"op\":\"decode\"},{\"op\":\"center_crop\",\"size\":16384}]}"));
    assertTrue(e.getMessage().contains("is 3221225472 bytes per sample, above the 2147483647 bytes"), e.getMessage());
    assertEquals(3L * 16384 * 16000 * 4, PrepPipeline.parse(
        "{\"ops\":[{\"op\":\"decode\"},{\"op\":\"center_crop\",\"size\":[16384,16000]}],\"dtype\":\"uint8\"}")
        .sampleBytes() * 4, "long arithmetic for sizes");
  }

  // -- autotuning --------------------------------------------------------------------------------------------

  /**
   * Reads batch {@code batch} only once it is staged (one member, positions prepared in order): a member slower than
   * production, that never waits.
   */
  Batch getWhenStaged(JsonNode j, long epoch, long batch) throws Exception {
    long pos = epoch * j.get("num_batches").asLong() + batch;
    await().atMost(Duration.ofSeconds(60)).pollInterval(Duration.ofMillis(10))
        .until(() -> groupStats(j).get("batches_prepared").asLong() > pos);
    return get(j, epoch, batch);
  }

  @Test
  void autotuningStaysWithinTheCpuAndMemoryBudgetAndASlowMemberNeverGrowsTheWindow() throws Exception {
    JsonNode j = action("prep.join", "{\"dataset\":\"imgs\",\"pipeline\":" + PIPELINE + ",\"batch_size\":2}");
    int startWindow = j.get("window").asInt();
    long e = 0;
    JsonNode s = groupStats(j);
    while (s.get("autotune").get("periods").asLong() <= Autotuner.QUIET_PERIODS) {
      for (int b = 0; b < j.get("num_batches").asInt(); b++) {
        getWhenStaged(j, e, b);
      }
      e++;
      s = groupStats(j);
    }
    JsonNode all = action("prep.stats", "");
    JsonNode a = s.get("autotune");
    assertEquals(0, a.get("stalls").asLong(), "the member never asked for a batch not staged yet: " + a);
    assertTrue(a.get("window").asInt() <= startWindow, "a member that never waits shrinks or holds the window: " + a);
    assertTrue(a.get("threads").asInt() >= 1 && a.get("threads").asInt() <= all.get("threads").asInt(), a.toString());
    assertTrue(a.get("window").asInt() <= a.get("max_window").asInt(), a.toString());
    assertTrue(s.get("staged_batches_peak").asInt() <= s.get("window").asInt(), s.toString());
    assertTrue(s.get("staging_peak_bytes").asLong() <= s.get("staging_limit_bytes").asLong(), s.toString());
    assertTrue(s.get("staging_limit_bytes").asLong() <= all.get("staging").get("limit_bytes").asLong(), all.toString());
  }

  @Test
  void aMemberStalledOnBatchesWithRoomGrowsTheWindowWithinStaging() throws Exception {
    JsonNode j = action("prep.join", "{\"dataset\":\"imgs\",\"pipeline\":" + PIPELINE + ",\"batch_size\":1}");
    int startWindow = j.get("window").asInt();
    long[] epoch = {0};
    // Batch 0 of each next epoch lies beyond the window: every read waits for its batch.
    await().atMost(Duration.ofSeconds(120)).until(() -> {
      get(j, epoch[0]++, 0);
      return groupStats(j).get("autotune").get("window").asInt() > startWindow;
    });
    JsonNode s = groupStats(j);
    JsonNode a = s.get("autotune");
    assertTrue(a.get("stalls").asLong() > 0, a.toString());
    assertTrue(a.get("window").asInt() <= a.get("max_window").asInt(), a.toString());
    assertTrue(a.get("decisions").toString().contains("\"what\":\"window\""), a.toString());
    assertTrue(s.get("staging_peak_bytes").asLong() <= s.get("staging_limit_bytes").asLong(), s.toString());
  }

  @Test
  void aPinnedWindowOrAutotuneOffIsKept() throws Exception {
    JsonNode pinned = join(",\"window\":3");
    JsonNode off = join(",\"seed\":5,\"autotune\":false");
    for (long e = 0; e < 3; e++) {
      get(pinned, e, 0);
      get(off, e, 0);
    }
    JsonNode a = groupStats(pinned).get("autotune");
    assertFalse(a.get("window_tuned").asBoolean(), a.toString());
    assertTrue(a.get("threads_tuned").asBoolean(), a.toString());
    assertEquals(3, a.get("window").asInt());
    JsonNode b = groupStats(off).get("autotune");
    assertFalse(b.get("window_tuned").asBoolean() || b.get("threads_tuned").asBoolean(), b.toString());
    assertEquals(0, b.get("decisions_total").asLong(), b.toString());
    FlightRuntimeException e = assertThrows(FlightRuntimeException.class, () -> join(",\"autotune\":\"yes\""));
    assertTrue(e.getMessage().contains("\"autotune\" must be true or false"), e.getMessage());
  }
}
