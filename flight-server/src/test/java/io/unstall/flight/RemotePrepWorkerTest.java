package io.unstall.flight;

import static org.awaitility.Awaitility.await;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.unstall.flight.cluster.ClusterSettings;
import io.unstall.flight.prep.PrepSchema;
import io.unstall.flight.prep.PrepWorker;
import io.unstall.flight.protocol.PrepTicket;
import java.awt.Color;
import java.awt.Graphics2D;
import java.awt.image.BufferedImage;
import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Iterator;
import java.util.List;
import java.util.Random;
import javax.imageio.ImageIO;
import org.apache.arrow.flight.Action;
import org.apache.arrow.flight.AsyncPutListener;
import org.apache.arrow.flight.CallHeaders;
import org.apache.arrow.flight.FlightCallHeaders;
import org.apache.arrow.flight.FlightClient;
import org.apache.arrow.flight.FlightDescriptor;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.flight.FlightStatusCode;
import org.apache.arrow.flight.FlightStream;
import org.apache.arrow.flight.HeaderCallOption;
import org.apache.arrow.flight.Location;
import org.apache.arrow.flight.Result;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.util.AutoCloseables;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.FixedSizeBinaryVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Remote prep workers in one JVM: two data planes of one cluster (real Hazelcast members, real peer ports). Plane 0
 * owns a prep group read by one member over Flight; plane 1 enlists as a remote prep worker mid-epoch, prepares
 * some of the group's batches from its own registration of the dataset, and leaves mid-epoch. The member reads
 * every batch of every epoch exactly once, each byte-identical to what a sidecar prepares locally.
 */
class RemotePrepWorkerTest {
  static final String CLUSTER_TOKEN = "cluster-token-0123456789abcdef";
  static final ObjectMapper JSON = new ObjectMapper();
  static final int SAMPLES = 40;
  static final int BATCH = 4; // 10 batches per epoch
  static final int EPOCHS = 3;
  static final String PIPELINE = "{\"ops\":[{\"op\":\"decode\"},{\"op\":\"random_resized_crop\",\"size\":32},"
      + "{\"op\":\"hflip\"},{\"op\":\"normalize\",\"mean\":[0.485,0.456,0.406],\"std\":[0.229,0.224,0.225]}]}";

  @TempDir Path dir;
  final BufferAllocator[] roots = new BufferAllocator[2];
  final DataPlane[] planes = new DataPlane[2];
  final FlightClient[] clients = new FlightClient[2];
  HeaderCallOption auth;
  HeaderCallOption clusterAuth;

  @BeforeEach
  void start() throws Exception {
    writeImages(dir.resolve("imgs"));
    int[] ports = {TestPorts.belowEphemeral(), TestPorts.belowEphemeral()};
    List<String> members = List.of("127.0.0.1:" + ports[0], "127.0.0.1:" + ports[1]);
    for (int k = 0; k < 2; k++) {
      ClusterSettings c = new ClusterSettings("rprep-" + ProcessHandle.current().pid(), "127.0.0.1", ports[k], members,
          0, CLUSTER_TOKEN, null, null, null, Duration.ofSeconds(5), Duration.ofSeconds(4));
      roots[k] = new RootAllocator(256L << 20);
      planes[k] = DataPlane.builder(roots[k], FlightTestClient.TOKEN).port(0).cacheCapacity(1 << 20)
          .sharedMemory(false).prep(4, 2, Duration.ofSeconds(3)).cluster(c).build().start();
      planes[k].registry().register("imgs", "imagefolder", dir.resolve("imgs").toString());
      clients[k] = FlightClient.builder(roots[k], planes[k].location()).build();
    }
    CallHeaders h = new FlightCallHeaders();
    h.insert("authorization", "Bearer " + FlightTestClient.TOKEN);
    auth = new HeaderCallOption(h);
    CallHeaders ch = new FlightCallHeaders();
    ch.insert("authorization", "Bearer " + CLUSTER_TOKEN);
    clusterAuth = new HeaderCallOption(ch);
    await().atMost(Duration.ofSeconds(60)).until(() -> Arrays.stream(planes)
        .allMatch(p -> p.cluster().members() == 2 && p.cluster().settled()));
  }

  @AfterEach
  void stop() throws Exception {
    for (int k = 0; k < 2; k++) {
      AutoCloseables.close(clients[k], planes[k], roots[k]); // the root throws if anything leaked
    }
  }

  @Test
  void aWorkerJoinsAndLeavesMidEpochAndTheMemberSeesEveryBatchOnceAsPreparedLocally() throws Exception {
    List<List<Batch>> expected = new ArrayList<>(); // the same group prepared by plane 1 alone, locally
    JsonNode ref = join(1, ",\"window\":8");
    for (int e = 0; e < EPOCHS; e++) {
      expected.add(epoch(1, ref, e, 0, ref.get("num_batches").asInt()));
    }
    action(1, "prep.leave", "{\"group\":\"" + ref.get("group").asText() + "\",\"member\":" + ref.get("member") + "}");

    JsonNode j = join(0, ",\"window\":8,\"epochs\":" + EPOCHS);
    String group = j.get("group").asText();
    int nb = j.get("num_batches").asInt();
    List<List<Batch>> seen = new ArrayList<>();
    for (int e = 0; e < EPOCHS; e++) {
      seen.add(new ArrayList<>());
    }
    seen.get(0).addAll(epoch(0, j, 0, 0, 2));
    PrepWorker w = planes[1].enlistPrepWorker("127.0.0.1:" + planes[0].peerPort(), group);
    try (w) {
      await().atMost(Duration.ofSeconds(60)).until(() -> groupStats(0, group).get("workers").size() == 1);
      int b = 2;
      // The member reads on; the worker takes part of the window (as the owner's own producers do).
      while (w.batchesUploaded() < 2 && b < nb) {
        seen.get(0).add(get(0, j, 0, b++));
      }
      seen.get(0).addAll(epoch(0, j, 0, b, nb));
      seen.get(1).addAll(epoch(0, j, 1, 0, nb / 2));
    } // leaves mid-epoch 1 (after finishing the batch in hand)
    long uploaded = w.batchesUploaded();
    assertTrue(uploaded > 0, "the remote worker prepared some batches");
    JsonNode st = groupStats(0, group);
    assertEquals(0, st.get("workers").size(), "the worker left: " + st);
    seen.get(1).addAll(epoch(0, j, 1, nb / 2, nb));
    seen.get(2).addAll(epoch(0, j, 2, 0, nb));

    for (int e = 0; e < EPOCHS; e++) {
      long[] ids = seen.get(e).stream().flatMapToLong(x -> Arrays.stream(x.ids())).sorted().toArray();
      assertArrayEquals(java.util.stream.LongStream.range(0, SAMPLES).toArray(), ids,
          "epoch " + e + ": every sample once");
      for (int b = 0; b < nb; b++) {
        assertArrayEquals(expected.get(e).get(b).ids(), seen.get(e).get(b).ids(), "epoch " + e + " batch " + b);
        assertArrayEquals(expected.get(e).get(b).tensor(), seen.get(e).get(b).tensor(),
            "epoch " + e + " batch " + b + ": the same tensors as prepared locally");
      }
    }
    st = groupStats(0, group);
    long remote = 0;
    long local = st.get("batches_prepared_by").path("local").asLong();
    for (var it = st.get("batches_prepared_by").fields(); it.hasNext(); ) {
      var f = it.next();
      if (f.getKey().startsWith("worker ")) {
        remote += f.getValue().asLong();
      }
    }
    assertEquals(uploaded, remote, "stats count the worker's batches: " + st);
    assertEquals(EPOCHS * nb, local + remote, "every batch prepared once: " + st);
    assertEquals(EPOCHS * nb, st.get("batches_served").asLong());
    JsonNode mine = JSON.readTree(planes[1].producer().prep().statsJson()).get("workers").get(0);
    assertEquals(uploaded, mine.get("batches_uploaded").asLong());
  }

  @Test
  void aClaimNotUploadedInTimeIsPreparedAgainAndTheLateUploadIsRefused() throws Exception {
    JsonNode j = join(0, ",\"window\":8");
    String group = j.get("group").asText();
    int nb = j.get("num_batches").asInt();
    Location peer = Location.forGrpcInsecure("127.0.0.1", planes[0].peerPort());
    try (FlightClient c = FlightClient.builder(roots[1], peer).build()) {
      // A worker that claims a batch and dies before uploading it (here: a raw client that never uploads in time).
      JsonNode en = peerAction(c, "peer.prep.enlist", "{\"group\":\"" + group + "\",\"name\":\"doomed\"}");
      long worker = en.get("worker").asLong();
      assertEquals(SAMPLES, en.get("num_samples").asInt());
      JsonNode claim;
      do {
        claim = peerAction(c, "peer.prep.claim", "{\"group\":\"" + group + "\",\"worker\":" + worker + "}");
      } while (!claim.get("state").asText().equals("produce"));
      long e = claim.get("epoch").asLong();
      long b = claim.get("batch").asLong();
      await().atMost(Duration.ofSeconds(30))
          .until(() -> groupStats(0, group).get("worker_claims_expired").asLong() == 1);
      // Its late upload is refused, naming the option.
      try (VectorSchemaRoot r = VectorSchemaRoot.create(
          PrepSchema.of(io.unstall.flight.prep.PrepPipeline.parse(PIPELINE)), roots[1])) {
        r.allocateNew();
        r.setRowCount(0);
        String cmd = "{\"peer.prep.put\":{\"group\":\"" + group + "\",\"worker\":" + worker + ",\"epoch\":" + e
            + ",\"batch\":" + b + "}}";
        FlightClient.ClientStreamListener l = c.startPut(FlightDescriptor.command(cmd.getBytes(StandardCharsets.UTF_8)),
            r, new AsyncPutListener(), clusterAuth);
        l.putNext();
        l.completed();
        FlightRuntimeException x = assertThrows(FlightRuntimeException.class, l::getResult);
        assertEquals(FlightStatusCode.INVALID_ARGUMENT, x.status().code());
        assertTrue(x.getMessage().contains("--prep-claim-timeout"), x.getMessage());
      }
      List<Batch> epoch0 = epoch(0, j, 0, 0, nb); // the owner prepared the expired batch itself
      assertArrayEquals(java.util.stream.LongStream.range(0, SAMPLES).toArray(),
          epoch0.stream().flatMapToLong(x -> Arrays.stream(x.ids())).sorted().toArray());
      peerAction(c, "peer.prep.leave", "{\"group\":\"" + group + "\",\"worker\":" + worker + "}");
      // The client port does not take peer actions, nor the peer port a user's token.
      assertThrows(FlightRuntimeException.class, () -> action(0, "peer.prep.enlist", "{\"group\":\"" + group + "\"}"));
      FlightRuntimeException u = assertThrows(FlightRuntimeException.class, () -> c.doAction(new Action(
          "peer.prep.enlist", ("{\"group\":\"" + group + "\"}").getBytes(StandardCharsets.UTF_8)), auth).next());
      assertEquals(FlightStatusCode.UNAUTHENTICATED, u.status().code());
    }
  }

  // -- helpers --------------------------------------------------------------------------------------------

  record Batch(long[] ids, byte[] tensor) {}

  JsonNode join(int k, String extra) throws Exception {
    return action(k, "prep.join", "{\"dataset\":\"imgs\",\"pipeline\":" + PIPELINE + ",\"batch_size\":" + BATCH
        + ",\"seed\":7" + extra + "}");
  }

  JsonNode action(int k, String type, String body) throws Exception {
    Iterator<Result> it = clients[k].doAction(new Action(type, body.getBytes(StandardCharsets.UTF_8)), auth);
    return JSON.readTree(it.next().getBody());
  }

  JsonNode peerAction(FlightClient c, String type, String body) throws Exception {
    Iterator<Result> it = c.doAction(new Action(type, body.getBytes(StandardCharsets.UTF_8)), clusterAuth);
    return JSON.readTree(it.next().getBody());
  }

  JsonNode groupStats(int k, String group) throws Exception {
    return action(k, "prep.stats", "").get("groups").get(group);
  }

  List<Batch> epoch(int k, JsonNode j, long epoch, int from, int to) throws Exception {
    List<Batch> out = new ArrayList<>();
    for (int b = from; b < to; b++) {
      out.add(get(k, j, epoch, b));
    }
    return out;
  }

  Batch get(int k, JsonNode j, long epoch, long batch) throws Exception {
    PrepTicket t = new PrepTicket(j.get("group").asText(), j.get("member").asLong(), epoch, batch);
    try (FlightStream s = clients[k].getStream(t.toTicket(), auth)) {
      assertTrue(s.next());
      VectorSchemaRoot r = s.getRoot();
      BigIntVector ids = (BigIntVector) r.getVector(PrepSchema.ID);
      FixedSizeBinaryVector tensor = (FixedSizeBinaryVector) r.getVector(PrepSchema.TENSOR);
      long[] out = new long[r.getRowCount()];
      ByteArrayOutputStream bytes = new ByteArrayOutputStream();
      for (int i = 0; i < out.length; i++) {
        out[i] = ids.get(i);
        bytes.write(tensor.get(i));
      }
      assertFalse(s.next());
      return new Batch(out, bytes.toByteArray());
    }
  }

  static void writeImages(Path root) throws Exception {
    Random rnd = new Random(5);
    for (int i = 0; i < SAMPLES; i++) {
      BufferedImage img = new BufferedImage(50 + rnd.nextInt(60), 40 + rnd.nextInt(50), BufferedImage.TYPE_INT_RGB);
      Graphics2D g = img.createGraphics();
      for (int k = 0; k < 10; k++) {
        g.setColor(new Color(rnd.nextInt(256), rnd.nextInt(256), rnd.nextInt(256)));
        g.fillRect(rnd.nextInt(img.getWidth()), rnd.nextInt(img.getHeight()), 5 + rnd.nextInt(40), 5 + rnd.nextInt(40));
      }
      g.dispose();
      Path p = root.resolve("c" + (i % 2) + "/img" + String.format("%02d", i) + ".jpg");
      Files.createDirectories(p.getParent());
      ImageIO.write(img, "jpg", p.toFile());
    }
  }
}
