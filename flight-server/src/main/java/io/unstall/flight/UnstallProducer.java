package io.unstall.flight;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.auth.PermissionDeniedException;
import io.unstall.flight.auth.Principal;
import io.unstall.flight.auth.TenantTokens;
import io.unstall.flight.cache.DiskTier;
import io.unstall.flight.cache.SampleCache;
import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.dataset.DatasetRegistry;
import io.unstall.flight.dataset.DatasetStats;
import io.unstall.flight.dataset.UnknownDatasetException;
import io.unstall.flight.format.CorruptRecordException;
import io.unstall.flight.prep.PrepService;
import io.unstall.flight.protocol.PrepTicket;
import io.unstall.flight.session.Sessions;
import io.unstall.flight.protocol.BatchSchema;
import io.unstall.flight.protocol.FetchTicket;
import io.unstall.flight.protocol.Plan;
import io.unstall.flight.protocol.MalformedTicketException;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Base64;
import java.util.BitSet;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.Predicate;
import java.util.concurrent.locks.LockSupport;
import java.util.function.Supplier;
import io.unstall.flight.cluster.HazelcastCluster;
import org.apache.arrow.flight.Action;
import org.apache.arrow.flight.ActionType;
import org.apache.arrow.flight.CallStatus;
import org.apache.arrow.flight.Criteria;
import org.apache.arrow.flight.FlightDescriptor;
import org.apache.arrow.flight.FlightInfo;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.flight.FlightStream;
import org.apache.arrow.flight.PutResult;
import org.apache.arrow.flight.NoOpFlightProducer;
import org.apache.arrow.flight.Result;
import org.apache.arrow.flight.Ticket;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The Flight producer: list and describe datasets, fetch batches of samples, report stats. Every call names
 * its caller ({@link Principal}, from the bearer token): the owner may use every dataset; a tenant only those
 * granted to it, and sees no other dataset's name, session or prep group.
 */
public final class UnstallProducer extends NoOpFlightProducer {
  private static final Logger LOG = LoggerFactory.getLogger(UnstallProducer.class);
  private static final ObjectMapper JSON = new ObjectMapper();
  public static final String ACTION_STATS = "stats";
  public static final String ACTION_PREFETCH = "prefetch";
  public static final String ACTION_CACHED = "cached";

  private final DatasetRegistry registry;
  private final SampleCache cache;
  private final DiskTier disk;
  private final BatchAssembler assembler;
  private final BufferAllocator streams;
  private final StreamBudget budget;
  private final PrepService prep; // coordinated prep: prep.* actions and PREP tickets
  private final Sessions sessions;
  private final FlightCalls calls; // admission of calls that may wait
  private final Bounds bounds;
  private final TenantTokens tenants;
  private Supplier<HazelcastCluster> cluster; // null: not in a cluster

  /**
   * {@code streams} is the allocator batches in flight come from; {@code budget} bounds it. Calls that may wait
   * are admitted by {@code calls}.
   */
  public UnstallProducer(
      DatasetRegistry registry, SampleCache cache, DiskTier disk, BatchAssembler assembler, BufferAllocator streams,
      StreamBudget budget, PrepService prep, Sessions sessions, FlightCalls calls, Bounds bounds,
      TenantTokens tenants) {
    this.calls = calls;
    this.bounds = bounds;
    this.registry = registry;
    this.cache = cache;
    this.disk = disk;
    this.assembler = assembler;
    this.streams = streams;
    this.budget = budget;
    this.prep = prep;
    this.sessions = sessions;
    this.tenants = tenants;
  }

  private Principal principal(CallContext context) {
    return tenants.principal(context.peerIdentity());
  }

  /** The dataset {@code name} if {@code p} may read it (PERMISSION_DENIED otherwise, whether it exists or not). */
  private Dataset dataset(Principal p, String name) {
    p.checkRead(name);
    return registry.get(name, p::mayRead);
  }

  @Override
  public void getStream(CallContext context, Ticket ticket, ServerStreamListener listener) {
    VectorSchemaRoot root = null;
    FlightCalls.Permit permit = null;
    try {
      Principal p = principal(context);
      if (PrepTicket.isPrep(ticket.getBytes())) {
        permit = calls.admit("a prep read (DoGet)");
        prep.getStream(ticket, listener, p);
        return;
      }
      FetchTicket t = FetchTicket.from(ticket);
      Dataset d = dataset(p, t.dataset());
      BatchAssembler.CheckedIds batch = BatchAssembler.startFetch(d, t.ids(), t.epoch());
      permit = calls.admit("a fetch of dataset '" + d.name() + "'");
      try (StreamBudget.Reservation r = budget.acquire(batch, listener::isCancelled)) {
        root = assembler.assemble(d, BatchAssembler.Requester.of(d), t.epoch(), batch.ids(), streams);
      }
      listener.start(root);
      awaitReady(listener, bounds.waitTimeout().toNanos());
      if (!listener.isCancelled()) {
        listener.putNext();
        listener.completed();
      }
    } catch (Throwable e) {
      FlightRuntimeException status = toStatus(e);
      if (e instanceof CorruptRecordException) {
        LOG.warn("fetch failed on bad data: {}", e.getMessage());
      } else if (status.status().code() == org.apache.arrow.flight.FlightStatusCode.INTERNAL) {
        if (e instanceof IOException) {
          LOG.warn("fetch failed: {}", status.getMessage());
        } else {
          LOG.warn("fetch failed: {}", status.getMessage(), e); // a bug: keep the stack
        }
      } else {
        LOG.info("fetch rejected: {}", status.getMessage());
      }
      listener.error(status);
    } finally {
      if (root != null) {
        root.close();
      }
      if (permit != null) {
        permit.close();
      }
    }
  }

  /**
   * Waits for the client to take data: Flight's callback strategy deadlocks inside getStream, so poll. A client
   * that takes nothing for {@code timeoutNanos} ({@code --wait-timeout}) gets TIMED_OUT and frees the thread.
   */
  static void awaitReady(ServerStreamListener listener, long timeoutNanos) {
    long deadline = System.nanoTime() + timeoutNanos;
    while (!listener.isReady() && !listener.isCancelled()) {
      if (System.nanoTime() - deadline > 0) {
        throw new WaitTimeoutException("the client did not take its batch within "
            + TimeUnit.NANOSECONDS.toSeconds(timeoutNanos) + " s (--wait-timeout)");
      }
      LockSupport.parkNanos(20_000);
    }
  }

  @Override
  public void listFlights(CallContext context, Criteria criteria, StreamListener<FlightInfo> listener) {
    try {
      Principal p = principal(context);
      for (Dataset d : registry.all()) {
        if (p.mayRead(d.name())) {
          listener.onNext(info(d));
        }
      }
      listener.onCompleted();
    } catch (Throwable e) {
      listener.onError(toStatus(e));
    }
  }

  @Override
  public FlightInfo getFlightInfo(CallContext context, FlightDescriptor descriptor) {
    try {
      if (descriptor.isCommand() || descriptor.getPath().size() != 1) {
        throw new IllegalArgumentException(
            "describe a dataset with FlightDescriptor.path(<dataset name>), got " + descriptor);
      }
      return info(dataset(principal(context), descriptor.getPath().get(0)));
    } catch (Throwable e) {
      throw toStatus(e);
    }
  }

  private static FlightInfo info(Dataset d) throws IOException {
    return FlightInfo.builder(BatchSchema.SCHEMA, FlightDescriptor.path(d.name()), List.of())
        .setRecords(d.size())
        .setBytes(d.totalBytes())
        .setAppMetadata(JSON.writeValueAsBytes(d.describe()))
        .build();
  }

  @Override
  public void doAction(CallContext context, Action action, StreamListener<Result> listener) {
    FlightCalls.Permit permit = null;
    try {
      Principal p = principal(context);
      if (PrepService.handles(action.getType())) {
        if (PrepService.waits(action.getType())) {
          permit = calls.admit("action " + action.getType());
        }
        listener.onNext(new Result(prep.doAction(action, context::isCancelled, p)));
        listener.onCompleted();
        return;
      }
      switch (action.getType()) {
        case ACTION_STATS -> listener.onNext(new Result(statsJson(p::mayRead).getBytes(StandardCharsets.UTF_8)));
        case ACTION_PREFETCH -> {
          Prefetcher.checkPlanSize(Plan.declaredSize(action.getBody()), bounds.maxPlanIds());
          permit = calls.admit("a prefetch plan");
          Plan plan = Plan.parse(action.getBody());
          Dataset d = dataset(p, plan.dataset());
          int[] ids = Prefetcher.checkedPlan(d, plan.ids(), bounds.maxPlanIds());
          assembler.prefetcher().plan(d, d.name(), d.stats(), plan.epoch(), ids);
          listener.onNext(new Result(("{\"v\":1,\"planned\":" + ids.length + "}").getBytes(StandardCharsets.UTF_8)));
        }
        case ACTION_CACHED -> {
          Dataset d = dataset(p, cachedRequest(action.getBody()));
          listener.onNext(new Result(cachedJson(d, assembler).getBytes(StandardCharsets.UTF_8)));
        }
        default -> throw CallStatus.UNIMPLEMENTED
            .withDescription("unknown action '" + action.getType() + "'; supported: " + ACTION_STATS + ", "
                + ACTION_PREFETCH + ", " + ACTION_CACHED)
            .toRuntimeException();
      }
      listener.onCompleted();
    } catch (Throwable e) {
      listener.onError(toStatus(e));
    } finally {
      if (permit != null) {
        permit.close();
      }
    }
  }

  @Override
  public void listActions(CallContext context, StreamListener<ActionType> listener) {
    listener.onNext(new ActionType(ACTION_STATS, "cache and per-dataset, per-epoch statistics as JSON"));
    listener.onNext(new ActionType(ACTION_PREFETCH, "the epoch's sample order (a PLAN message): read ahead"));
    listener.onNext(new ActionType(ACTION_CACHED, "which samples of a dataset are cached now, as a bitmap"));
    PrepService.listActions(listener);
    listener.onCompleted();
  }

  /** The dataset a {@code cached} action's body names: UTF-8 JSON {@code {"dataset": name}}. */
  static String cachedRequest(byte[] body) {
    JsonNode req;
    try {
      req = JSON.readTree(body);
    } catch (IOException e) {
      throw new IllegalArgumentException("the cached action's body is not UTF-8 JSON {\"dataset\": name}: "
          + e.getMessage());
    }
    String name = req == null ? "" : req.path("dataset").asText("");
    if (name.isEmpty()) {
      throw new IllegalArgumentException("the cached action needs a body {\"dataset\": name}");
    }
    return name;
  }

  /**
   * The {@code cached} document (protocol/README.md), over Flight and the local socket alike: {@code samples} in
   * the dataset, how many are {@code cached} in the memory cache or the disk tier, and {@code bitmap}, base64 of
   * {@code ceil(samples / 8)} bytes where bit {@code id % 8} (least significant first) of byte {@code id / 8} is set
   * when sample {@code id} is cached.
   */
  public static String cachedJson(Dataset d, BatchAssembler assembler) {
    BitSet cached = assembler.cached(d);
    byte[] bitmap = Arrays.copyOf(cached.toByteArray(), (d.size() + 7) / 8);
    ObjectNode o = JsonNodeFactory.instance.objectNode();
    o.put("v", 1);
    o.put("dataset", d.name());
    o.put("samples", d.size());
    o.put("cached", cached.cardinality());
    o.put("bitmap", Base64.getEncoder().encodeToString(bitmap));
    return o.toString();
  }

  /** Adds the cluster's view (members, served to peers) to the stats. */
  void reportCluster(Supplier<HazelcastCluster> cluster) {
    this.cluster = cluster;
  }

  public PrepService prep() {
    return prep;
  }

  /** DoPut: batches that group members prepared with their own transforms (coordinated prep). */
  @Override
  public Runnable acceptPut(CallContext context, FlightStream flightStream, StreamListener<PutResult> ackStream) {
    return () -> {
      // Flight runs this on its executor: the upload is admitted there (where a refusal cannot block a transport).
      try (FlightCalls.Permit p = calls.admit("an upload (DoPut)")) {
        if (!PrepService.handlesPut(flightStream.getDescriptor())) {
          throw CallStatus.UNIMPLEMENTED.withDescription("DoPut is only for prep.put uploads").toRuntimeException();
        }
        prep.acceptPut(flightStream, context::isCancelled, principal(context));
        ackStream.onCompleted();
      } catch (Throwable e) {
        ackStream.onError(toStatus(e));
      }
    };
  }

  /** The stats document (protocol/README.md) of the control plane: every dataset. */
  public String statsJson() {
    return statsJson(name -> true);
  }

  /**
   * The stats document (protocol/README.md) as the stats action answers it: the datasets, and their sessions,
   * that the caller may see; cache and disk totals are the sidecar's.
   */
  public String statsJson(Predicate<String> visible) {
    ObjectNode o = JsonNodeFactory.instance.objectNode();
    o.put("v", 1);
    ObjectNode c = o.putObject("cache");
    c.put("policy", cache.policy());
    c.put("capacity_bytes", cache.capacityBytes());
    c.put("used_bytes", cache.usedBytes());
    c.put("entries", cache.entries());
    c.put("shared_bytes", cache.sharedBytes());
    assembler.cacheBreaker().toJson(c);
    if (disk != null) {
      ObjectNode k = o.putObject("disk");
      k.put("capacity_bytes", disk.capacityBytes());
      k.put("used_bytes", disk.usedBytes());
      k.put("entries", disk.entries());
      k.put("corrupt_dropped", disk.corruptDropped());
      assembler.diskBreaker().toJson(k);
    }
    ObjectNode ds = o.putObject("datasets");
    for (Dataset d : registry.all()) {
      if (visible.test(d.name())) {
        ObjectNode j = d.stats().toJson();
        if (cluster != null) {
          j.set("served_to_peers", d.servedToPeers().toJson());
        }
        ds.set(d.name(), j);
      }
    }
    HazelcastCluster joined = cluster == null ? null : cluster.get();
    if (joined != null) {
      ObjectNode k = o.putObject("cluster");
      k.put("members", joined.members());
      k.put("settled", joined.settled());
    }
    ObjectNode all = sessions.toJson();
    ObjectNode seen = o.putObject("sessions");
    all.fields().forEachRemaining(e -> {
      if (visible.test(e.getValue().path("dataset").asText())) {
        seen.set(e.getKey(), e.getValue());
      }
    });
    return o.toString();
  }

  /** One log line per dataset and epoch, for shutdown. */
  public void logStats() {
    for (Dataset d : registry.all()) {
      d.stats().forEach((epoch, e) -> LOG.info(DatasetStats.summary(d.name(), epoch, e)));
    }
  }

  /** Maps a failure to the Flight status a client sees; messages name the dataset, file or offset. */
  public static FlightRuntimeException toStatus(Throwable e) {
    if (e instanceof FlightRuntimeException f) {
      return f;
    }
    CallStatus status;
    if (e instanceof UnknownDatasetException || e instanceof SampleNotFoundException
        || e instanceof Sessions.UnknownSessionException) {
      status = CallStatus.NOT_FOUND;
    } else if (e instanceof MalformedTicketException || e instanceof IllegalArgumentException) {
      status = CallStatus.INVALID_ARGUMENT;
    } else if (e instanceof StreamBudget.BudgetExceededException || e instanceof Sessions.TooManySessionsException
        || e instanceof org.apache.arrow.memory.OutOfMemoryException || e instanceof Prefetcher.PlanTooLargeException) {
      status = CallStatus.RESOURCE_EXHAUSTED;
    } else if (e instanceof WaitTimeoutException) {
      status = CallStatus.TIMED_OUT;
    } else if (e instanceof PermissionDeniedException) {
      status = CallStatus.UNAUTHORIZED;
    } else if (e instanceof CorruptRecordException c) {
      return c.dataError().toStatus(c.getMessage(), e);
    } else if (e instanceof InterruptedException) {
      Thread.currentThread().interrupt();
      status = CallStatus.CANCELLED;
    } else {
      status = CallStatus.INTERNAL;
    }
    String msg = e.getMessage() == null ? e.getClass().getName() : e.getMessage();
    return status.withDescription(msg).withCause(e).toRuntimeException();
  }
}
