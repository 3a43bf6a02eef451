package io.unstall.flight;

import static org.awaitility.Awaitility.await;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import io.unstall.flight.cluster.ClusterSettings;
import io.unstall.flight.format.ImageFolders;
import io.unstall.flight.protocol.FetchTicket;
import io.unstall.flight.protocol.PeerTicket;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Random;
import org.apache.arrow.flight.CallHeaders;
import org.apache.arrow.flight.FlightCallHeaders;
import org.apache.arrow.flight.FlightClient;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.flight.FlightStatusCode;
import org.apache.arrow.flight.FlightStream;
import org.apache.arrow.flight.HeaderCallOption;
import org.apache.arrow.flight.Location;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.util.AutoCloseables;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The partitioned cache in one JVM: three data planes, each with its own root allocator, a real embedded
 * Hazelcast member on loopback and a real peer port, and a real Flight client per "rank". Each epoch, rank r
 * fetches its shard (a permutation's r-th third) from its own sidecar, as DistributedSampler would hand it out.
 */
class ClusterTest {
  static final String CLUSTER_TOKEN = "cluster-token-0123456789abcdef";
  static final int N = 3;
  static final int SAMPLES = 90;
  static final int BATCH = 8;

  @TempDir Path dir;
  final List<byte[]> images = new ArrayList<>();
  final BufferAllocator[] roots = new BufferAllocator[N];
  final DataPlane[] planes = new DataPlane[N];
  final FlightTestClient[] clients = new FlightTestClient[N];
  long datasetBytes;
  long capacity;
  int maxSample;

  @BeforeEach
  void start() throws Exception {
    images.addAll(ImageFolders.write(dir.resolve("imgs"), SAMPLES / 10, 10, i -> 1000 + (i * 137) % 1500, 11));
    for (byte[] b : images) {
      datasetBytes += b.length;
      maxSample = Math.max(maxSample, b.length);
    }
    capacity = datasetBytes / 6; // a node owns about a third: its cache fills
    int[] ports = new int[N]; // below the ephemeral range: the planes' port-0 servers cannot take them first
    for (int i = 0; i < N; i++) {
      ports[i] = TestPorts.belowEphemeral();
    }
    List<String> members = new ArrayList<>();
    for (int p : ports) {
      members.add("127.0.0.1:" + p);
    }
    for (int k = 0; k < N; k++) {
      ClusterSettings c = new ClusterSettings("test-" + ProcessHandle.current().pid(), "127.0.0.1", ports[k], members,
          0, CLUSTER_TOKEN, null, null, null, Duration.ofSeconds(5), Duration.ofSeconds(4));
      roots[k] = new RootAllocator(64L << 20);
      planes[k] = DataPlane.builder(roots[k], FlightTestClient.TOKEN).port(0).cacheCapacity(capacity)
          .sharedMemory(false).cluster(c).build().start();
      planes[k].registry().register("imgs", "imagefolder", dir.resolve("imgs").toString());
      clients[k] = new FlightTestClient(roots[k], planes[k]);
    }
    await().atMost(Duration.ofSeconds(60)).until(() -> Arrays.stream(planes)
        .allMatch(p -> p.cluster().members() == N && p.cluster().settled()));
  }

  @AfterEach
  void stop() throws Exception {
    for (int k = 0; k < N; k++) {
      AutoCloseables.close(clients[k], planes[k], roots[k]); // the root throws if anything leaked
    }
  }

  @Test
  void eachEpochIsExactlyOnceAndStorageReadsOnlyWhatNoNodeCaches() throws Exception {
    for (long epoch = 0; epoch < 3; epoch++) {
      long cachedBefore = usedBytes();
      List<Integer> order = permutation(epoch);
      for (int r = 0; r < N; r++) {
        fetchShard(r, epoch, shard(order, r, N), 0, Integer.MAX_VALUE);
      }
      long storage = storageBytes(epoch);
      if (epoch == 0) {
        assertEquals(datasetBytes, storage, "the first epoch reads every sample from storage exactly once");
      } else {
        assertEquals(datasetBytes - cachedBefore, storage, "epoch " + epoch + ": storage reads what no node caches");
        assertTrue(peerHits(epoch) > 0, "epoch " + epoch + " had peer hits");
      }
    }
    for (int k = 0; k < N; k++) {
      long used = stats(k).get("cache").get("used_bytes").asLong();
      assertTrue(capacity - used < maxSample && used <= capacity,
          "node " + k + " caches " + used + " of its capacity " + capacity + " (within one sample)");
    }
    long storage = storageBytes(2);
    assertTrue(Math.abs(storage - (datasetBytes - N * capacity)) <= N * (long) maxSample,
        "epoch 2 read " + storage + " bytes from storage; dataset - 3 x capacity = " + (datasetBytes - N * capacity));
  }

  @Test
  void aNodeThatDiesMidEpochCostsStorageReadsNeverABatch() throws Exception {
    for (long epoch = 0; epoch < 2; epoch++) { // warm: every node's cache holds its part
      List<Integer> order = permutation(epoch);
      for (int r = 0; r < N; r++) {
        fetchShard(r, epoch, shard(order, r, N), 0, Integer.MAX_VALUE);
      }
    }
    long epoch = 2;
    List<Integer> order = permutation(epoch);
    int half = shard(order, 0, N).size() / 2;
    for (int r = 0; r < N; r++) {
      fetchShard(r, epoch, shard(order, r, N), 0, half);
    }
    // Node 2 dies without a goodbye: until the others notice (failure timeout), its part is asked of it and fails.
    planes[2].cluster().terminate();
    AutoCloseables.close(clients[2], planes[2], roots[2]);
    clients[2] = null;
    planes[2] = null;
    roots[2] = null;
    // Its rank's trainer died with it; a survivor takes over the rest of its shard (as an elastic job would).
    fetchShard(0, epoch, shard(order, 0, N), half, Integer.MAX_VALUE);
    fetchShard(1, epoch, shard(order, 1, N), half, Integer.MAX_VALUE);
    fetchShard(0, epoch, shard(order, 2, N), half, Integer.MAX_VALUE);
    long fallbacks = 0;
    for (int k = 0; k < 2; k++) {
      fallbacks += epochStats(k, epoch).get("peer_fallbacks").asLong();
    }
    assertTrue(fallbacks > 0, "the dead node's samples were read from storage");
    await().atMost(Duration.ofSeconds(60)).until(() -> planes[0].cluster().members() == 2
        && planes[1].cluster().members() == 2 && planes[0].cluster().settled());
    // Its partitions belong to the survivors now: a whole epoch on two nodes, exactly once, no peer failing.
    for (epoch = 3; epoch < 5; epoch++) {
      order = permutation(epoch);
      for (int r = 0; r < 2; r++) {
        fetchShard(r, epoch, shard(order, r, 2), 0, Integer.MAX_VALUE);
      }
      assertEquals(0, epochStats(0, epoch).get("peer_fallbacks").asLong()
          + epochStats(1, epoch).get("peer_fallbacks").asLong());
    }
    assertTrue(peerHits(4) > 0, "the survivors serve each other");
  }

  @Test
  void thePeerPortTakesOnlyTheClusterTokenAndPeerTickets() throws Exception {
    try (FlightClient peer = FlightClient.builder(roots[0], Location.forGrpcInsecure("127.0.0.1", planes[0].peerPort()))
        .build()) {
      PeerTicket t = new PeerTicket("imgs", 0, new long[] {1, 2});
      FlightRuntimeException e = assertThrows(FlightRuntimeException.class,
          () -> drain(peer, t.toBytes(), auth(FlightTestClient.TOKEN)));
      assertEquals(FlightStatusCode.UNAUTHENTICATED, e.status().code(), "a user's token opens no peer call");
      e = assertThrows(FlightRuntimeException.class,
          () -> drain(peer, new FetchTicket("imgs", 0, new long[] {1}).toBytes(), auth(CLUSTER_TOKEN)));
      assertEquals(FlightStatusCode.INVALID_ARGUMENT, e.status().code(),
          "a FETCH ticket is not served on the peer port");
      assertEquals(2, drain(peer, t.toBytes(), auth(CLUSTER_TOKEN)));
    }
    FlightRuntimeException e = assertThrows(FlightRuntimeException.class,
        () -> drain(clients[0].client, new PeerTicket("imgs", 0, new long[] {1}).toBytes(),
            auth(FlightTestClient.TOKEN)));
    assertEquals(FlightStatusCode.INVALID_ARGUMENT, e.status().code(),
        "a PEER ticket is not served on the client port");
  }

  private static HeaderCallOption auth(String token) {
    CallHeaders h = new FlightCallHeaders();
    h.insert("authorization", "Bearer " + token);
    return new HeaderCallOption(h);
  }

  private static int drain(FlightClient c, byte[] ticket, HeaderCallOption auth) throws Exception {
    int rows = 0;
    try (FlightStream s = c.getStream(new org.apache.arrow.flight.Ticket(ticket), auth)) {
      while (s.next()) {
        rows += s.getRoot().getRowCount();
      }
    }
    return rows;
  }

  /** Fetches shard[from, to) through node {@code r} in batches, checking every payload against its file. */
  private void fetchShard(int r, long epoch, List<Integer> shard, int from, int to) throws Exception {
    int end = Math.min(to, shard.size());
    for (int i = from; i < end; i += BATCH) {
      long[] ids = shard.subList(i, Math.min(end, i + BATCH)).stream().mapToLong(Integer::longValue).toArray();
      List<byte[]> got = clients[r].fetch("imgs", epoch, ids);
      assertEquals(ids.length, got.size());
      for (int k = 0; k < ids.length; k++) {
        assertArrayEquals(images.get((int) ids[k]), got.get(k),
            "epoch " + epoch + " sample " + ids[k] + " via node " + r);
      }
    }
  }

  private static List<Integer> permutation(long epoch) {
    List<Integer> order = new ArrayList<>();
    for (int i = 0; i < SAMPLES; i++) {
      order.add(i);
    }
    Collections.shuffle(order, new Random(epoch));
    return order;
  }

  private static List<Integer> shard(List<Integer> order, int rank, int ranks) {
    List<Integer> s = new ArrayList<>();
    for (int i = rank; i < order.size(); i += ranks) {
      s.add(order.get(i));
    }
    return s;
  }

  private JsonNode stats(int k) throws Exception {
    return clients[k].stats();
  }

  private JsonNode epochStats(int k, long epoch) throws Exception {
    return stats(k).get("datasets").get("imgs").get("epochs").path(Long.toString(epoch));
  }

  private long usedBytes() throws Exception {
    long used = 0;
    for (int k = 0; k < N; k++) {
      used += stats(k).get("cache").get("used_bytes").asLong();
    }
    return used;
  }

  /** Bytes the cluster read from storage for epoch e: for its own clients and, as owner, for peers. */
  private long storageBytes(long epoch) throws Exception {
    long bytes = 0;
    for (int k = 0; k < N; k++) {
      JsonNode d = stats(k).get("datasets").get("imgs");
      bytes += d.get("epochs").path(Long.toString(epoch)).path("storage_bytes").asLong();
      bytes += d.get("served_to_peers").get("epochs").path(Long.toString(epoch)).path("storage_bytes").asLong();
    }
    return bytes;
  }

  private long peerHits(long epoch) throws Exception {
    long hits = 0;
    for (int k = 0; k < N; k++) {
      if (planes[k] != null) {
        hits += epochStats(k, epoch).path("peer_hits").asLong();
      }
    }
    return hits;
  }
}
