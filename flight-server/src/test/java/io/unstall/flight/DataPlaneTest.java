package io.unstall.flight;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.unstall.flight.format.TfRecords;
import io.unstall.flight.protocol.DataError;
import io.unstall.flight.protocol.FetchTicket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import org.apache.arrow.flight.CallHeaders;
import org.apache.arrow.flight.FlightCallHeaders;
import org.apache.arrow.flight.FlightClient;
import org.apache.arrow.flight.FlightDescriptor;
import org.apache.arrow.flight.FlightInfo;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.flight.FlightStatusCode;
import org.apache.arrow.flight.FlightStream;
import org.apache.arrow.flight.HeaderCallOption;
import org.apache.arrow.flight.Ticket;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VarCharVector;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The data plane end to end in one JVM: a real Flight server on a free port and a real Flight client. */
class DataPlaneTest {
  static final String TOKEN = FlightTestClient.TOKEN;
  static final ObjectMapper JSON = FlightTestClient.JSON;
  static final int SAMPLE = 1000;

  @TempDir Path dir;
  BufferAllocator root;
  DataPlane plane;
  FlightTestClient flight;
  FlightClient client;
  HeaderCallOption auth;
  List<byte[]> images = new ArrayList<>();

  @BeforeEach
  void start() throws Exception {
    images.addAll(io.unstall.flight.format.ImageFolders.write(dir.resolve("imgs"), 2, 5, i -> SAMPLE, 7));
    root = new RootAllocator(64L << 20);
    plane = DataPlane.builder(root, TOKEN).port(0).cacheCapacity(3 * SAMPLE).build().start();
    plane.registry().register("imgs", "imagefolder", dir.resolve("imgs").toString());
    flight = new FlightTestClient(root, plane);
    client = flight.client;
    auth = flight.auth;
  }

  @AfterEach
  void stop() throws Exception {
    flight.close();
    plane.close();
    root.close(); // throws if anything leaked
  }

  private List<byte[]> fetch(String dataset, long epoch, long... ids) throws Exception {
    return flight.fetch(dataset, epoch, ids);
  }

  private JsonNode stats() throws Exception {
    return flight.stats();
  }

  private FlightRuntimeException fetchFails(Ticket t) {
    return assertThrows(FlightRuntimeException.class, () -> {
      try (FlightStream s = client.getStream(t, auth)) {
        while (s.next()) {
          // drain
        }
      }
    });
  }

  @Test
  void servesExactBytesLabelsAndKeys() throws Exception {
    try (FlightStream s = client.getStream(new FetchTicket("imgs", 0, new long[] {9, 0, 5, 0}).toTicket(), auth)) {
      assertTrue(s.next());
      var r = s.getRoot();
      assertEquals(4, r.getRowCount());
      BigIntVector label = (BigIntVector) r.getVector("label");
      VarCharVector key = (VarCharVector) r.getVector("key");
      VarBinaryVector payload = (VarBinaryVector) r.getVector("payload");
      assertEquals(1, label.get(0));
      assertEquals(0, label.get(1));
      assertEquals("class1/img4.jpg", new String(key.get(0), StandardCharsets.UTF_8));
      assertArrayEquals(images.get(9), payload.get(0));
      assertArrayEquals(images.get(0), payload.get(1));
      assertArrayEquals(images.get(5), payload.get(2));
      assertArrayEquals(images.get(0), payload.get(3)); // repeated ids come back repeated
    }
  }

  @Test
  void secondEpochHitsExactlyTheCapacity() throws Exception {
    long[] all = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    fetch("imgs", 0, all);
    long[] reversed = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0};
    List<byte[]> second = fetch("imgs", 1, reversed);
    for (int i = 0; i < 10; i++) {
      assertArrayEquals(images.get((int) reversed[i]), second.get(i));
    }
    JsonNode s = stats();
    JsonNode e0 = s.at("/datasets/imgs/epochs/0");
    JsonNode e1 = s.at("/datasets/imgs/epochs/1");
    assertEquals(0, e0.get("hits").asLong());
    assertEquals(10L * SAMPLE, e0.get("storage_bytes").asLong());
    assertEquals(3, e1.get("hits").asLong(), "MinIO: exactly capacity/sample hits, whatever the order");
    assertEquals(7, e1.get("misses").asLong());
    assertEquals(7L * SAMPLE, e1.get("storage_bytes").asLong());
    assertEquals(3L * SAMPLE, e1.get("cache_bytes").asLong());
    assertEquals(3L * SAMPLE, s.at("/cache/used_bytes").asLong());
  }

  @Test
  void describesDatasets() throws Exception {
    FlightInfo info = client.getInfo(FlightDescriptor.path("imgs"), auth);
    assertEquals(10, info.getRecords());
    assertEquals(10L * SAMPLE, info.getBytes());
    JsonNode meta = JSON.readTree(info.getAppMetadata());
    assertEquals("imagefolder", meta.get("format").asText());
    assertEquals("[\"class0\",\"class1\"]", meta.get("classes").toString());
    FlightRuntimeException e =
        assertThrows(FlightRuntimeException.class, () -> client.getInfo(FlightDescriptor.path("nope"), auth));
    assertEquals(FlightStatusCode.NOT_FOUND, e.status().code());
  }

  @Test
  void badRequestsAreRejectedAndTheServerKeepsServing() throws Exception {
    FlightRuntimeException malformed = fetchFails(new Ticket("garbage!garbage!".getBytes()));
    assertEquals(FlightStatusCode.INVALID_ARGUMENT, malformed.status().code());
    assertTrue(malformed.getMessage().contains("malformed ticket: bad magic"), malformed.getMessage());

    FlightRuntimeException unknown = fetchFails(new FetchTicket("nope", 0, new long[] {0}).toTicket());
    assertEquals(FlightStatusCode.NOT_FOUND, unknown.status().code());
    assertTrue(unknown.getMessage().contains("unknown dataset 'nope'; registered datasets: imgs"),
        unknown.getMessage());

    FlightRuntimeException range = fetchFails(new FetchTicket("imgs", 0, new long[] {3, 10}).toTicket());
    assertEquals(FlightStatusCode.INVALID_ARGUMENT, range.status().code());
    assertTrue(range.getMessage().contains("sample id 10 out of range for dataset 'imgs' (size 10"),
        range.getMessage());

    Path victim = dir.resolve("imgs/class0/img2.jpg");
    Files.delete(victim);
    FlightRuntimeException gone = fetchFails(new FetchTicket("imgs", 0, new long[] {1, 2}).toTicket());
    assertEquals(FlightStatusCode.NOT_FOUND, gone.status().code());
    assertTrue(gone.getMessage().contains("sample 2: file '" + victim + "' no longer exists"), gone.getMessage());

    assertArrayEquals(images.get(4), fetch("imgs", 0, 4).get(0), "still serving after every error");
  }

  @Test
  void corruptTfRecordNamesFileAndOffset() throws Exception {
    Path shard = dir.resolve("tf/s-0.tfrecord");
    Files.createDirectories(shard.getParent());
    long[] offsets = TfRecords.write(shard, List.of("aaaa".getBytes(), "bbbb".getBytes()));
    byte[] raw = Files.readAllBytes(shard);
    raw[(int) offsets[1] + 13] ^= 1;
    Files.write(shard, raw);
    plane.registry().register("tf", "tfrecord", shard.getParent().toUri().toString());
    assertArrayEquals("aaaa".getBytes(), fetch("tf", 0, 0).get(0));
    FlightRuntimeException e = fetchFails(new FetchTicket("tf", 0, new long[] {1}).toTicket());
    assertEquals(FlightStatusCode.INVALID_ARGUMENT, e.status().code()); // bad data, not an internal error
    assertTrue(e.getMessage().contains("'" + shard + "' at byte offset " + offsets[1]), e.getMessage());
    assertTrue(e.getMessage().startsWith(DataError.MARKER + "{\"dataset\":\"tf\",\"sample\":1,\"key\":\"s-0.tfrecord@"
        + offsets[1] + "\",\"file\":\"" + shard + "\",\"offset\":" + offsets[1] + ",\"reason\":"), e.getMessage());
  }

  @Test
  void neighbouringTfRecordsAreReadInOneRequest() throws Exception {
    Path shard = dir.resolve("tfc/s-0.tfrecord");
    Files.createDirectories(shard.getParent());
    List<byte[]> records = new ArrayList<>();
    Random rnd = new Random(3);
    for (int i = 0; i < 12; i++) {
      byte[] r = new byte[500 + 50 * i];
      rnd.nextBytes(r);
      records.add(r);
    }
    TfRecords.write(shard, records);
    io.unstall.flight.storage.Throttle counter = new io.unstall.flight.storage.Throttle(1L << 40);
    plane.registry().throttleStorage(counter);
    plane.registry().register("tfc", "tfrecord", shard.getParent().toUri().toString());
    long before = counter.requests();
    List<byte[]> got = fetch("tfc", 0, 7, 2, 3, 4, 5, 3); // out of order, one repeated: still one range
    assertEquals(1, counter.requests() - before, "six records of one shard, data and CRCs: one ranged read");
    long[] want = {7, 2, 3, 4, 5, 3};
    for (int i = 0; i < want.length; i++) {
      assertArrayEquals(records.get((int) want[i]), got.get(i), "row " + i);
    }
    before = counter.requests();
    assertArrayEquals(records.get(11), fetch("tfc", 0, 11).get(0));
    assertEquals(1, counter.requests() - before, "a lone record and its CRC: one request, not two");
  }

  @Test
  void callsWithoutTheTokenAreUnauthenticated() {
    FlightRuntimeException e = assertThrows(FlightRuntimeException.class, () -> {
      try (FlightStream s = client.getStream(new FetchTicket("imgs", 0, new long[] {0}).toTicket())) {
        s.next();
      }
    });
    assertEquals(FlightStatusCode.UNAUTHENTICATED, e.status().code());
    CallHeaders wrong = new FlightCallHeaders();
    wrong.insert("authorization", "Bearer wrong-token-wrong-token");
    FlightRuntimeException w = assertThrows(FlightRuntimeException.class,
        () -> client.getInfo(FlightDescriptor.path("imgs"), new HeaderCallOption(wrong)));
    assertEquals(FlightStatusCode.UNAUTHENTICATED, w.status().code());
  }

  @Test
  void aBatchLargerThanTheStreamBudgetIsRefusedNotAllocated() throws Exception {
    try (BufferAllocator small = new RootAllocator(2L << 20);
        DataPlane p = DataPlane.builder(small, TOKEN).port(0).cacheCapacity(0).build().start();
        FlightClient c = FlightClient.builder(small, p.location()).build()) {
      byte[] big = new byte[3 << 20];
      Path f = dir.resolve("big/c/x.jpg");
      Files.createDirectories(f.getParent());
      Files.write(f, big);
      p.registry().register("big", "imagefolder", dir.resolve("big").toString());
      FlightRuntimeException e = assertThrows(FlightRuntimeException.class, () -> {
        try (FlightStream s = c.getStream(new FetchTicket("big", 0, new long[] {0}).toTicket(), auth)) {
          s.next();
        }
      });
      assertEquals(FlightStatusCode.RESOURCE_EXHAUSTED, e.status().code());
      assertTrue(e.getMessage().contains("stream budget"), e.getMessage());
    }
  }
}
