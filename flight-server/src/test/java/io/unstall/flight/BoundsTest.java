package io.unstall.flight;

import static org.awaitility.Awaitility.await;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import io.grpc.ManagedChannel;
import io.grpc.netty.NettyChannelBuilder;
import io.netty.channel.nio.NioEventLoopGroup;
import io.netty.channel.socket.nio.NioSocketChannel;
import io.unstall.flight.local.LocalTestClient;
import io.unstall.flight.protocol.FetchTicket;
import io.unstall.flight.protocol.LocalFrames;
import io.unstall.flight.protocol.Plan;
import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.function.UnaryOperator;
import org.apache.arrow.flight.Action;
import org.apache.arrow.flight.CallHeaders;
import org.apache.arrow.flight.FlightCallHeaders;
import org.apache.arrow.flight.FlightClient;
import org.apache.arrow.flight.FlightGrpcUtils;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.flight.FlightStatusCode;
import org.apache.arrow.flight.FlightStream;
import org.apache.arrow.flight.HeaderCallOption;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The data plane's bounds with real Flight and local-socket clients in one JVM: many clients holding many
 * blocked requests never grow the server's threads beyond its bounds; each request waits or gets
 * RESOURCE_EXHAUSTED naming the option to raise; once they go away the server serves as before.
 */
class BoundsTest {
  static final String TOKEN = FlightTestClient.TOKEN;
  static final int SAMPLE = 256 << 10;
  static final int CLIENTS = 64;
  static final int REQUESTS = 16;
  static final int FLIGHT_THREADS = 16;
  static final int LOCAL_CONNECTIONS = 16;
  static final long[] BLOCKED = {0, 1, 2, 3}; // a 1 MiB batch: more than the budget has left

  @TempDir Path dir;
  BufferAllocator root;
  BufferAllocator clientMemory;
  DataPlane plane;
  List<byte[]> images;
  final List<AutoCloseable> open = new ArrayList<>();

  DataPlane start(long budget, UnaryOperator<DataPlane.Builder> settings) throws Exception {
    images = io.unstall.flight.format.ImageFolders.write(dir.resolve("imgs"), 2, 8, i -> SAMPLE, 5);
    root = new RootAllocator(budget);
    clientMemory = new RootAllocator(Long.MAX_VALUE);
    plane = settings.apply(DataPlane.builder(root, TOKEN).port(0)).build().start();
    plane.registry().register("imgs", "imagefolder", dir.resolve("imgs").toString());
    return plane;
  }

  @AfterEach
  void stop() throws Exception {
    for (int i = open.size() - 1; i >= 0; i--) {
      open.get(i).close();
    }
    if (plane != null) {
      plane.close();
    }
    if (clientMemory != null) {
      clientMemory.close();
    }
    if (root != null) {
      root.close(); // throws if anything leaked
    }
  }

  /** Flight clients on channels whose threads the test owns (one event loop, two callback threads). */
  final class Clients {
    final NioEventLoopGroup loop = new NioEventLoopGroup(1);
    final ExecutorService callbacks = Executors.newFixedThreadPool(2);
    final HeaderCallOption auth;

    Clients() {
      CallHeaders h = new FlightCallHeaders();
      h.insert("authorization", "Bearer " + TOKEN);
      auth = new HeaderCallOption(h);
      open.add(() -> {
        callbacks.shutdownNow();
        loop.shutdownGracefully(0, 0, java.util.concurrent.TimeUnit.SECONDS).sync();
      });
    }

    FlightClient connect() {
      ManagedChannel ch = NettyChannelBuilder.forAddress("127.0.0.1", plane.port()).usePlaintext()
          .eventLoopGroup(loop).channelType(NioSocketChannel.class).executor(callbacks)
          .maxInboundMessageSize(Integer.MAX_VALUE).build();
      FlightClient c = FlightGrpcUtils.createFlightClient(clientMemory, ch);
      open.add(() -> {
        c.close();
        ch.shutdownNow();
      });
      return c;
    }
  }

  void checkPayloads(long[] ids, List<byte[]> payloads) {
    assertEquals(ids.length, payloads.size());
    for (int i = 0; i < ids.length; i++) {
      assertArrayEquals(images.get((int) ids[i]), payloads.get(i), "sample " + ids[i]);
    }
  }

  @Test
  void manyClientsHoldingBlockedRequestsStayWithinTheThreadBoundsAndTheServerRecovers() throws Exception {
    Assumptions.assumeTrue(Files.isWritable(Path.of("/dev/shm")), "needs /dev/shm");
    // The streams budget is 5 MiB; a local client holding a 4 MiB batch's staging leaves too little for the
    // 1 MiB batch of any other request: every one waits in StreamBudget (--batch-timeout far away) until it goes.
    start(5L << 20, b -> b.cacheCapacity(0).flightThreads(FLIGHT_THREADS, 4096).localConnections(LOCAL_CONNECTIONS)
        .budgetTimeoutSeconds(600));
    Clients clients = new Clients();
    FlightClient first = clients.connect();
    try (FlightStream s = first.getStream(new FetchTicket("imgs", 0, BLOCKED).toTicket(), clients.auth)) {
      checkPayloads(BLOCKED, FlightTestClient.drain(s, BLOCKED)); // warms up the client's threads and the server's
    }
    LocalTestClient holder = new LocalTestClient(plane.localEndpoint(), TOKEN);
    long session = holder.open("imgs");
    long[] big = FlightTestClient.range(16);
    checkPayloads(big, LocalTestClient.batch(holder.call(LocalFrames.encodeIds(LocalFrames.FETCH, session, 0, big)),
        holder.shm).payloads());

    ThreadMXBean mx = ManagementFactory.getThreadMXBean();
    int baseline = mx.getThreadCount();
    mx.resetPeakThreadCount();

    // 64 Flight clients, 16 fetches each, none of which can proceed.
    List<FlightStream> streams = new ArrayList<>();
    for (int c = 0; c < CLIENTS; c++) {
      FlightClient client = c == 0 ? first : clients.connect();
      for (int r = 0; r < REQUESTS; r++) {
        FlightStream s = client.getStream(new FetchTicket("imgs", 1, BLOCKED).toTicket(), clients.auth);
        open.add(s);
        streams.add(s);
      }
    }
    // 64 local clients, 16 connections each (a connection has one request in flight), fetching likewise.
    List<LocalTestClient> admitted = new ArrayList<>();
    List<String> localRefusals = new ArrayList<>();
    for (int i = 0; i < CLIENTS * REQUESTS; i++) {
      LocalTestClient c = new LocalTestClient(plane.localEndpoint(), TOKEN);
      open.add(c);
      try {
        c.send(LocalTestClient.hello(TOKEN));
      } catch (IOException refusedBeforeHello) {
        // the sidecar answered and closed first; its answer is still there to read
      }
      ByteBuffer r = c.reply();
      if (r.get(0) == LocalFrames.REPLY_ERROR) {
        assertEquals(LocalFrames.RESOURCE_EXHAUSTED, r.get(1));
        localRefusals.add(StandardCharsets.UTF_8.decode(r.position(2)).toString());
        c.close();
        continue;
      }
      long s = c.open(r, "imgs");
      c.send(LocalFrames.encodeIds(LocalFrames.FETCH, s, 1, BLOCKED));
      admitted.add(c);
    }
    FlightCalls calls = plane.flightCalls();
    await().atMost(Duration.ofMinutes(2)).pollInSameThread()
        .until(() -> calls.waiting() + calls.refused() == (long) CLIENTS * REQUESTS);

    int grown = mx.getPeakThreadCount() - baseline;
    int bound = FLIGHT_THREADS + LOCAL_CONNECTIONS + 2 * Runtime.getRuntime().availableProcessors() + 8;
    assertTrue(grown <= bound, "threads grew by " + grown + " over " + baseline + "; the bound is " + bound);
    assertEquals(FLIGHT_THREADS - FLIGHT_THREADS / 4, calls.permits());
    assertEquals(calls.permits(), calls.waiting(), "every permit is held by a waiting fetch");
    assertEquals(LOCAL_CONNECTIONS - 1, admitted.size(), "every local connection but the holder's waits");
    assertEquals(CLIENTS * REQUESTS - admitted.size(), localRefusals.size());
    assertTrue(localRefusals.get(0).contains("--local-connections"), localRefusals.get(0));
    assertEquals(LOCAL_CONNECTIONS, plane.localServer().connections());

    // The holder goes: every waiting request gets its batch; every refused one says which option to raise.
    holder.close();
    ExecutorService readers = Executors.newFixedThreadPool(32);
    open.add(readers::shutdownNow);
    List<Future<String>> flightOutcomes = new ArrayList<>();
    for (FlightStream s : streams) {
      flightOutcomes.add(readers.submit(() -> {
        try {
          checkPayloads(BLOCKED, FlightTestClient.drain(s, BLOCKED));
          return "ok";
        } catch (FlightRuntimeException e) {
          assertEquals(FlightStatusCode.RESOURCE_EXHAUSTED, e.status().code(), e.toString());
          assertTrue(e.getMessage().contains("--flight-threads"), e.getMessage());
          return "refused";
        }
      }));
    }
    List<Future<?>> localOutcomes = new ArrayList<>();
    for (LocalTestClient c : admitted) {
      localOutcomes.add(readers.submit(() -> {
        checkPayloads(BLOCKED, LocalTestClient.batch(c.reply(), c.shm).payloads());
        c.close(); // frees its staging for the next one
        return null;
      }));
    }
    int served = 0;
    for (Future<String> f : flightOutcomes) {
      served += f.get().equals("ok") ? 1 : 0;
    }
    for (Future<?> f : localOutcomes) {
      f.get();
    }
    assertEquals(calls.permits(), served, "the fetches that waited were served");
    assertEquals(CLIENTS * REQUESTS - calls.permits(), calls.refused());

    // The clients go away; the server serves a new client normally, on both planes.
    for (FlightStream s : streams) {
      s.close();
    }
    await().atMost(Duration.ofMinutes(1)).pollInSameThread()
        .until(() -> calls.waiting() == 0 && plane.localServer().connections() == 0);
    try (FlightStream s = clients.connect().getStream(new FetchTicket("imgs", 2, big).toTicket(), clients.auth)) {
      checkPayloads(big, FlightTestClient.drain(s, big));
    }
    try (LocalTestClient c = new LocalTestClient(plane.localEndpoint(), TOKEN)) {
      long s = c.open("imgs");
      checkPayloads(big, LocalTestClient.batch(c.call(LocalFrames.encodeIds(LocalFrames.FETCH, s, 2, big)), c.shm)
          .payloads());
    }
  }

  @Test
  void aPlanIsAtMostMaxPlanIdsAndAtMostTheDatasetsSize() throws Exception {
    start(64L << 20, b -> b.cacheCapacity(0).prefetch(8L << 20, 64, 1).maxPlanIds(20));
    Clients clients = new Clients();
    FlightClient client = clients.connect();
    FlightRuntimeException over = assertThrows(FlightRuntimeException.class, () -> client.doAction(
        new Action("prefetch", new Plan("imgs", 0, FlightTestClient.range(21)).toBytes()), clients.auth).next());
    assertEquals(FlightStatusCode.RESOURCE_EXHAUSTED, over.status().code(), over.toString());
    assertTrue(over.getMessage().contains("21 ids exceeds the sidecar's --max-plan-ids 20"), over.getMessage());
    FlightRuntimeException longer = assertThrows(FlightRuntimeException.class, () -> client.doAction(
        new Action("prefetch", new Plan("imgs", 0, FlightTestClient.range(17)).toBytes()), clients.auth).next());
    assertEquals(FlightStatusCode.INVALID_ARGUMENT, longer.status().code(), longer.toString());
    assertTrue(longer.getMessage().contains("dataset 'imgs', which has 16 samples"), longer.getMessage());
    byte[] ok = client.doAction(new Action("prefetch", new Plan("imgs", 0, FlightTestClient.range(16)).toBytes()),
        clients.auth).next().getBody();
    assertEquals(16, FlightTestClient.JSON.readTree(ok).get("planned").asInt());

    Assumptions.assumeTrue(plane.localEndpoint() != null, "needs /dev/shm");
    try (LocalTestClient c = new LocalTestClient(plane.localEndpoint(), TOKEN)) {
      long session = c.open("imgs");
      ByteBuffer r = c.call(LocalFrames.encodeIds(LocalFrames.PLAN, session, 0, FlightTestClient.range(21)));
      assertEquals(LocalFrames.REPLY_ERROR, r.get());
      assertEquals(LocalFrames.RESOURCE_EXHAUSTED, r.get());
      String msg = StandardCharsets.UTF_8.decode(r).toString();
      assertTrue(msg.contains("--max-plan-ids 20"), msg);
      assertEquals(16, c.ok(LocalFrames.encodeIds(LocalFrames.PLAN, session, 0, FlightTestClient.range(16)))
          .get("planned").asInt(), "the connection serves on");
    }
  }

  @Test
  void statsKeepTheLatestEpochsOnly() throws Exception {
    start(64L << 20, b -> b.cacheCapacity(0).statsEpochs(3));
    Clients clients = new Clients();
    FlightClient client = clients.connect();
    for (long epoch : new long[] {0, 1, 4_000_000_000L, 2, 3}) { // any epoch a client names is counted...
      try (FlightStream s = client.getStream(new FetchTicket("imgs", epoch, new long[] {epoch % 16}).toTicket(),
          clients.auth)) {
        FlightTestClient.drain(s, new long[] {epoch % 16});
      }
    }
    JsonNode stats = FlightTestClient.JSON.readTree(client.doAction(new Action("stats", new byte[0]), clients.auth)
        .next().getBody());
    List<String> kept = new ArrayList<>();
    stats.at("/datasets/imgs/epochs").fieldNames().forEachRemaining(kept::add);
    assertEquals(List.of("2", "3", "4000000000"), kept, "...but only the latest 3 begun are kept");
    assertEquals(3, stats.at("/datasets/imgs/total/samples").asInt());
  }
}
