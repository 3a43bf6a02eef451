package io.unstall.flight.local;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.unstall.flight.DataPlane;
import io.unstall.flight.fs.FileOwners;
import io.unstall.flight.auth.TenantTokens;
import io.unstall.flight.protocol.LocalFrames;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.List;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The same-host plane end to end in one JVM: a real local socket and the files it hands out, mapped. */
class LocalPlaneTest {
  static final String TOKEN = "local-test-token";
  static final ObjectMapper JSON = new ObjectMapper();
  static final int SAMPLE = 1000;

  @TempDir Path dir;
  BufferAllocator root;
  DataPlane plane;
  final List<byte[]> images = new ArrayList<>();

  DataPlane start(String policy, long capacity) throws Exception {
    Assumptions.assumeTrue(Files.isWritable(Path.of("/dev/shm")), "needs /dev/shm");
    // sizes differ: offsets must be right, not just strides
    images.addAll(io.unstall.flight.format.ImageFolders.write(dir.resolve("imgs"), 2, 5, i -> SAMPLE + 37 * i, 11));
    root = new RootAllocator(64L << 20);
    plane = DataPlane.builder(root, TOKEN).port(0).cacheCapacity(capacity).cachePolicy(policy)
        .prefetch(8L << 20, 1024, 2).build().start();
    plane.registry().register("imgs", "imagefolder", dir.resolve("imgs").toString());
    return plane;
  }

  @AfterEach
  void stop() throws Exception {
    if (plane != null) {
      Path shm = plane.localEndpoint().getParent();
      plane.close();
      assertFalse(Files.exists(shm), "the shared-memory directory is removed at shutdown");
    }
    if (root != null) {
      root.close(); // throws if anything leaked (staging files are counted by the streams allocator)
    }
  }

  @Test
  void minioHitsAreReferencedInPlaceAndMissesStaged() throws Exception {
    start("minio", 4 * SAMPLE);
    Path socket = plane.localEndpoint();
    assertEquals("rw-------", PosixFilePermissions.toString(Files.getPosixFilePermissions(socket)));
    assertEquals("rwx------", PosixFilePermissions.toString(Files.getPosixFilePermissions(socket.getParent())));
    try (LocalTestClient c = new LocalTestClient(socket, TOKEN)) {
      long session = c.open("imgs");
      long[] ids = {0, 3, 7, 9, 3};
      for (int epoch = 0; epoch < 3; epoch++) {
        LocalTestClient.Rows rows =
            LocalTestClient.batch(c.call(LocalFrames.encodeIds(LocalFrames.FETCH, session, epoch, ids)), c.shm);
        assertArrayEquals(ids, rows.ids());
        for (int i = 0; i < ids.length; i++) {
          assertArrayEquals(images.get((int) ids[i]), rows.payloads().get(i), "epoch " + epoch + " row " + i);
          assertEquals(ids[i] / 5, rows.labels()[i]);
        }
        if (epoch > 0) { // the cache holds the first samples it saw (about 4 of them); those are referenced
          assertTrue(rows.files().stream().anyMatch(f -> f.startsWith("cache-")), rows.files().toString());
          assertTrue(rows.files().stream().anyMatch(f -> f.startsWith("stage-")), rows.files().toString());
        }
        String staged = rows.files().stream().filter(f -> f.startsWith("stage-")).findFirst().orElse(null);
        c.ok(LocalFrames.encodeIds(LocalFrames.PLAN, session, epoch + 1, ids)); // any next request ...
        if (staged != null) {
          assertFalse(Files.exists(Path.of(c.shm, staged)), "... frees the last batch's staging file");
        }
      }
      JsonNode stats = JSON.readTree(plane.producer().statsJson());
      JsonNode s = stats.get("sessions").get(Long.toUnsignedString(session));
      assertNotNull(s, stats.toString());
      assertEquals("shm", s.get("transport").asText());
      assertEquals(15, s.get("total").get("samples").asLong());
      assertEquals(15, stats.get("datasets").get("imgs").get("total").get("samples").asLong(),
          "a session's counts also go to its dataset");
    }
  }

  @Test
  void lruIsCopiedNeverReferenced() throws Exception {
    start("lru", 64 * 1024);
    try (LocalTestClient c = new LocalTestClient(plane.localEndpoint(), TOKEN)) {
      long session = c.open("imgs");
      long[] ids = {1, 2, 1};
      for (int epoch = 0; epoch < 2; epoch++) {
        LocalTestClient.Rows rows =
            LocalTestClient.batch(c.call(LocalFrames.encodeIds(LocalFrames.FETCH, session, epoch, ids)), c.shm);
        for (int i = 0; i < ids.length; i++) {
          assertArrayEquals(images.get((int) ids[i]), rows.payloads().get(i));
          assertTrue(rows.files().get(i).startsWith("stage-"), "an evicting cache never hands out its pages");
        }
      }
      JsonNode e1 = JSON.readTree(plane.producer().statsJson()).get("datasets").get("imgs").get("epochs").get("1");
      assertEquals(3, e1.get("hits").asLong());
    }
  }

  @Test
  void errorsNameTheThingAndTheConnectionGoesOn() throws Exception {
    start("minio", 4 * SAMPLE);
    try (LocalTestClient bad = new LocalTestClient(plane.localEndpoint(), TOKEN)) {
      ByteBuffer r = bad.call(LocalTestClient.hello("wrong"));
      assertEquals(LocalFrames.REPLY_ERROR, r.get());
      assertEquals(LocalFrames.UNAUTHENTICATED, r.get());
    }
    try (LocalTestClient c = new LocalTestClient(plane.localEndpoint(), TOKEN)) {
      long session = c.open("imgs");
      ByteBuffer r = c.call(LocalFrames.encodeIds(LocalFrames.FETCH, session, 0, new long[] {0, 10}));
      assertEquals(LocalFrames.REPLY_ERROR, r.get());
      assertEquals(LocalFrames.INVALID_ARGUMENT, r.get());
      String msg = StandardCharsets.UTF_8.decode(r).toString();
      assertTrue(msg.contains("sample id 10") && msg.contains("'imgs'"), msg);
      r = c.call(LocalFrames.encodeIds(LocalFrames.FETCH, session + 1, 0, new long[] {0}));
      assertEquals(LocalFrames.REPLY_ERROR, r.get());
      assertEquals(LocalFrames.NOT_FOUND, r.get());
      assertTrue(StandardCharsets.UTF_8.decode(r).toString().contains("unknown session"));
      LocalTestClient.Rows rows = LocalTestClient.batch(
          c.call(LocalFrames.encodeIds(LocalFrames.FETCH, session, 0, new long[] {4})), c.shm);
      assertArrayEquals(images.get(4), rows.payloads().get(0), "still serving after errors");
    }
  }

  @Test
  void theSocketIsTheOwnersAloneAndATenantTokenIsRefused() throws Exception {
    Assumptions.assumeTrue(Files.isWritable(Path.of("/dev/shm")), "needs /dev/shm");
    images.addAll(io.unstall.flight.format.ImageFolders.write(dir.resolve("imgs"), 1, 2, i -> SAMPLE, 3));
    Files.createDirectories(dir.resolve("home"));
    TenantTokens tenants = TenantTokens.open(dir.resolve("home").resolve(TenantTokens.FILE_NAME));
    root = new RootAllocator(64L << 20);
    plane = DataPlane.builder(root, TOKEN).port(0).cacheCapacity(4 * SAMPLE).tenants(tenants).build().start();
    plane.registry().register("imgs", "imagefolder", dir.resolve("imgs").toString());
    String tenantToken = tenants.issue(List.of("imgs"), "").token();
    Path socket = plane.localEndpoint();
    assertEquals("rwx------", PosixFilePermissions.toString(Files.getPosixFilePermissions(socket.getParent())));
    assertEquals("rw-------", PosixFilePermissions.toString(Files.getPosixFilePermissions(socket)));
    assertEquals(FileOwners.processUid(), FileOwners.uidOf(socket.getParent()),
        "the sidecar's user owns the directory");
    try (LocalTestClient c = new LocalTestClient(socket, tenantToken)) {
      ByteBuffer r = c.call(LocalTestClient.hello(tenantToken));
      assertEquals(LocalFrames.REPLY_ERROR, r.get());
      assertEquals(LocalFrames.UNAUTHENTICATED, r.get(), "tenants use Flight: the socket takes the owner's token only");
    }
    try (LocalTestClient c = new LocalTestClient(socket, TOKEN)) {
      assertTrue(c.open("imgs") != 0, "the owner (same uid, its token) is served");
    }
  }

  @Test
  void prepActionsRunOnTheSocketAsOverFlightAndAJoinNamesIt() throws Exception {
    start("minio", 4 * SAMPLE);
    try (LocalTestClient c = new LocalTestClient(plane.localEndpoint(), TOKEN)) {
      LocalTestClient.ok(c.call(LocalTestClient.hello(TOKEN)));
      byte[] join = ("{\"v\":1,\"dataset\":\"imgs\",\"pipeline\":{\"ops\":[{\"op\":\"decode\"},"
          + "{\"op\":\"resize\",\"size\":[8,8]}]},\"batch_size\":4,\"seed\":1,\"group_size\":1,"
          + "\"shm\":true,\"name\":\"local test\"}").getBytes(StandardCharsets.UTF_8);
      JsonNode joined = c.ok(LocalFrames.encodePrep("prep.join", join));
      String group = joined.get("group").asText();
      long member = joined.get("member").asLong();
      assertTrue(joined.get("shm").asBoolean(), joined.toString());
      assertEquals(plane.localEndpoint().toString(), joined.get("local").asText(), "where to send prep.next");
      JsonNode stats = c.ok(LocalFrames.encodePrep("prep.stats", new byte[0]));
      assertTrue(stats.get("groups").has(group), stats.toString());
      // An unknown group: the error Flight's DoAction gives, and the connection goes on.
      ByteBuffer r = c.call(LocalFrames.encodePrep("prep.next",
          "{\"group\":\"nope\",\"member\":1,\"epoch\":0,\"batch\":0}".getBytes(StandardCharsets.UTF_8)));
      assertEquals(LocalFrames.REPLY_ERROR, r.get());
      assertEquals(LocalFrames.NOT_FOUND, r.get());
      String msg = StandardCharsets.UTF_8.decode(r).toString();
      assertTrue(msg.contains("nope"), msg);
      // Only prep.* actions: the socket is no back door to the rest of DoAction.
      r = c.call(LocalFrames.encodePrep("prep.x", new byte[0]));
      assertEquals(LocalFrames.REPLY_ERROR, r.get());
      assertEquals(LocalFrames.INVALID_ARGUMENT, r.get());
      msg = StandardCharsets.UTF_8.decode(r).toString();
      assertTrue(msg.contains("unknown action 'prep.x'"), msg);
      byte[] stats2 = LocalFrames.encodePrep("prep.stats", new byte[0]);
      System.arraycopy("stats".getBytes(StandardCharsets.UTF_8), 0, stats2, 3, 5); // "statsstats"
      r = c.call(stats2);
      assertEquals(LocalFrames.REPLY_ERROR, r.get());
      assertEquals(LocalFrames.INVALID_ARGUMENT, r.get());
      msg = StandardCharsets.UTF_8.decode(r).toString();
      assertTrue(msg.startsWith("malformed local request: PREP carries prep.* actions only, not 'statsstats'"), msg);
      JsonNode left = c.ok(LocalFrames.encodePrep("prep.leave",
          ("{\"group\":\"" + group + "\",\"member\":" + member + "}").getBytes(StandardCharsets.UTF_8)));
      assertTrue(left.get("left").asBoolean());
    }
  }

  @Test
  void malformedRequestsAreInvalidArgumentsAndBigFramesWaitForHello() throws Exception {
    start("minio", 4 * SAMPLE);
    try (LocalTestClient c = new LocalTestClient(plane.localEndpoint(), TOKEN)) {
      // Longer than any HELLO, before HELLO: refused before a buffer of that size is allocated.
      c.ch.write(ByteBuffer.allocate(4).order(ByteOrder.LITTLE_ENDIAN).putInt(1 << 20).flip());
      ByteBuffer r = c.reply();
      assertEquals(LocalFrames.REPLY_ERROR, r.get());
      assertEquals(LocalFrames.INVALID_ARGUMENT, r.get());
      String msg = StandardCharsets.UTF_8.decode(r).toString();
      assertTrue(msg.startsWith("malformed local request: a 1048576-byte frame before HELLO"), msg);
    }
    try (LocalTestClient c = new LocalTestClient(plane.localEndpoint(), TOKEN)) {
      c.open("imgs");
      byte[][] bodies = {
        "{\"dataset\":".getBytes(StandardCharsets.UTF_8), // not JSON (was INTERNAL)
        {'{', '"', 'd', 'a', 't', 'a', 's', 'e', 't', '"', ':', '"', 'i', (byte) 0xff, '"', '}'}, // not UTF-8
        "[\"imgs\"]".getBytes(StandardCharsets.UTF_8),
      };
      for (byte[] json : bodies) {
        byte[] body = new byte[1 + json.length];
        body[0] = LocalFrames.OPEN;
        System.arraycopy(json, 0, body, 1, json.length);
        ByteBuffer r = c.call(body);
        assertEquals(LocalFrames.REPLY_ERROR, r.get());
        assertEquals(LocalFrames.INVALID_ARGUMENT, r.get());
        String msg = StandardCharsets.UTF_8.decode(r).toString();
        assertTrue(msg.startsWith("malformed local request: OPEN body"), msg);
      }
      c.open("imgs"); // the connection goes on
    }
  }

  @Test
  void twoSessionsOnOneDatasetKeepTheirOwnPlans() throws Exception {
    start("minio", 0); // nothing cached: every sample comes from storage or from a session's prefetch
    try (LocalTestClient a = new LocalTestClient(plane.localEndpoint(), TOKEN);
        LocalTestClient b = new LocalTestClient(plane.localEndpoint(), TOKEN)) {
      long sa = a.open("imgs");
      long sb = b.open("imgs");
      long[] orderA = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
      long[] orderB = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0};
      a.ok(LocalFrames.encodeIds(LocalFrames.PLAN, sa, 0, orderA));
      b.ok(LocalFrames.encodeIds(LocalFrames.PLAN, sb, 0, orderB));
      org.awaitility.Awaitility.await().atMost(java.time.Duration.ofSeconds(30))
          .until(() -> plane.prefetcher().stagedBytes() >= 2L * images.stream().mapToLong(x -> x.length).sum());
      for (int i = 0; i < 10; i += 5) {
        LocalTestClient.batch(
            a.call(LocalFrames.encodeIds(LocalFrames.FETCH, sa, 0, java.util.Arrays.copyOfRange(orderA, i, i + 5))),
            a.shm);
        LocalTestClient.batch(
            b.call(LocalFrames.encodeIds(LocalFrames.FETCH, sb, 0, java.util.Arrays.copyOfRange(orderB, i, i + 5))),
            b.shm);
      }
      JsonNode sessions = JSON.readTree(plane.producer().statsJson()).get("sessions");
      assertEquals(10, sessions.get(Long.toUnsignedString(sa)).get("total").get("prefetch_hits").asLong());
      assertEquals(10, sessions.get(Long.toUnsignedString(sb)).get("total").get("prefetch_hits").asLong());
    }
    org.awaitility.Awaitility.await().atMost(java.time.Duration.ofSeconds(10))
        .until(() -> plane.prefetcher().stagedBytes() == 0); // closed connections close their sessions
  }
}
