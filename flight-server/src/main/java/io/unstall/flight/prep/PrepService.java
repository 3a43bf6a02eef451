package io.unstall.flight.prep;

import io.unstall.flight.protocol.PrepTicket;
import io.unstall.flight.shm.SharedMemory;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.BatchAssembler;
import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.dataset.DatasetRegistry;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.BooleanSupplier;
import org.apache.arrow.flight.Action;
import org.apache.arrow.flight.ActionType;
import org.apache.arrow.flight.CallStatus;
import org.apache.arrow.flight.FlightDescriptor;
import org.apache.arrow.flight.FlightProducer.ServerStreamListener;
import org.apache.arrow.flight.FlightProducer.StreamListener;
import org.apache.arrow.flight.FlightStream;
import org.apache.arrow.flight.Ticket;
import org.apache.arrow.memory.BufferAllocator;

/**
 * Coordinated prep (docs/PREP.md): the {@code prep.*} actions and PREP tickets. Jobs that join with the same
 * dataset, pipeline fingerprint, seed, batch size, shuffle and drop_last share one {@link PrepGroup}; every
 * batch is fetched and prepared once, by a pool of prep threads sized to the cores, and served to all members.
 * All staging memory comes from the "prep" child of the data plane's streams allocator (half its limit), one
 * child per group bounded by the group's staging limit.
 */
public final class PrepService implements AutoCloseable {
  public static final String ACTION_JOIN = "prep.join";
  public static final String ACTION_HEARTBEAT = "prep.heartbeat";
  public static final String ACTION_LEAVE = "prep.leave";
  public static final String ACTION_STATS = "prep.stats";
  public static final String ACTION_NEXT = "prep.next";
  public static final String ACTION_CLAIM = "prep.claim";
  /** Group key fingerprints of external groups: members prepare batches with their own transforms. */
  static final String EXTERNAL_PREFIX = "python:";
  private static final int HISTORY = 64;

  private final DatasetRegistry registry;
  private final BatchAssembler assembler;
  private final BufferAllocator allocator;
  private final int threads;
  private final ExecutorService pool;
  private final ScheduledExecutorService reaper;
  private final AtomicLong memberIds = new AtomicLong();
  // Guarded by this: the open group of each key, and every group by id (closed ones kept for stats).
  private final Map<PrepGroup.Key, PrepGroup> open = new HashMap<>();
  private final LinkedHashMap<String, PrepGroup> byId = new LinkedHashMap<>();

  /** Prepared tensors for members on this host live in /dev/shm/unstall-prep-<pid>. */
  static final String SHM_PREFIX = "unstall-prep-";

  public PrepService(DatasetRegistry registry, BatchAssembler assembler, BufferAllocator streams) {
    this.registry = registry;
    this.assembler = assembler;
    this.allocator = streams.newChildAllocator("prep", 0, streams.getLimit() / 2);
    this.threads = Math.max(1, Integer.getInteger("unstall.prep.threads", Runtime.getRuntime().availableProcessors()));
    AtomicInteger n = new AtomicInteger();
    this.pool = Executors.newFixedThreadPool(threads, r -> {
      Thread t = new Thread(r, "unstall-prep-worker-" + n.incrementAndGet());
      t.setDaemon(true);
      return t;
    });
    this.reaper = Executors.newSingleThreadScheduledExecutor(r -> {
      Thread t = new Thread(r, "unstall-prep-reaper");
      t.setDaemon(true);
      return t;
    });
    reaper.scheduleWithFixedDelay(this::reap, 100, 100, TimeUnit.MILLISECONDS);
  }

  public static boolean handles(String actionType) {
    return actionType.startsWith("prep.");
  }

  public int threads() {
    return threads;
  }

  public BufferAllocator allocator() {
    return allocator;
  }

  public static void listActions(StreamListener<ActionType> listener) {
    listener.onNext(new ActionType(ACTION_JOIN, "join (or create) a coordinated prep group; JSON in and out"));
    listener.onNext(new ActionType(ACTION_HEARTBEAT, "keep a group member alive: {\"group\",\"member\"}"));
    listener.onNext(new ActionType(ACTION_LEAVE, "leave a group: {\"group\",\"member\"}"));
    listener.onNext(new ActionType(ACTION_NEXT, "shared-memory read: wait for a batch, get its /dev/shm file"));
    listener.onNext(new ActionType(ACTION_CLAIM, "external groups: wait for a batch or the turn to prepare it"));
    listener.onNext(new ActionType(ACTION_STATS, "prep groups, staging memory and prepared/served counts as JSON"));
  }

  /** Runs a {@code prep.*} action; the result is one UTF-8 JSON document. */
  public byte[] doAction(Action action, BooleanSupplier cancelled) throws Exception {
    String type = action.getType();
    String out = switch (type) {
      case ACTION_JOIN -> join(PrepRequests.join(PrepRequests.body(type, action.getBody()))).toString();
      case ACTION_HEARTBEAT -> {
        PrepRequests.Member m = PrepRequests.member(PrepRequests.body(type, action.getBody()));
        group(m.group()).heartbeat(m.member());
        yield "{\"v\":1,\"ok\":true}";
      }
      case ACTION_LEAVE -> {
        PrepRequests.Member m = PrepRequests.member(PrepRequests.body(type, action.getBody()));
        group(m.group()).leave(m.member());
        yield "{\"v\":1,\"left\":true}";
      }
      case ACTION_STATS -> statsJson();
      case ACTION_CLAIM -> {
        PrepRequests.At at = PrepRequests.at(type, PrepRequests.body(type, action.getBody()));
        yield group(at.group()).claim(at.member(), at.epoch(), at.batch(), cancelled).toString();
      }
      case ACTION_NEXT -> {
        PrepRequests.At at = PrepRequests.at(type, PrepRequests.body(type, action.getBody()));
        yield group(at.group()).next(at.member(), at.epoch(), at.batch(), cancelled).toString();
      }
      default -> throw CallStatus.UNIMPLEMENTED.withDescription("unknown action '" + type + "'; prep actions: "
          + List.of(ACTION_JOIN, ACTION_HEARTBEAT, ACTION_LEAVE, ACTION_NEXT, ACTION_CLAIM, ACTION_STATS))
          .toRuntimeException();
    };
    return out.getBytes(StandardCharsets.UTF_8);
  }

  /**
   * DoPut of a member-prepared batch: the descriptor is a command {@code {"prep.put":{"group","member","epoch",
   * "batch"}}}, the stream one record batch.
   */
  public static boolean handlesPut(FlightDescriptor d) {
    return d.isCommand() && new String(d.getCommand(), StandardCharsets.UTF_8).startsWith("{\"prep.put\"");
  }

  public void acceptPut(FlightStream stream, BooleanSupplier cancelled)
      throws Exception {
    PrepRequests.At at = PrepRequests.put(stream.getDescriptor().getCommand());
    if (!stream.next()) {
      throw new IllegalArgumentException("prep.put: the stream carries no record batch");
    }
    group(at.group()).upload(at.member(), at.epoch(), at.batch(), stream.getRoot(), cancelled);
    while (stream.next()) {
      // one batch per upload; drain anything else
    }
  }

  /** Serves a PREP ticket. */
  public void getStream(Ticket ticket, ServerStreamListener listener) throws InterruptedException {
    PrepTicket t = PrepTicket.from(ticket);
    PrepGroup g;
    synchronized (this) {
      g = byId.get(t.group());
    }
    if (g == null) {
      throw CallStatus.NOT_FOUND.withDescription("prep group " + t.group() + " is unknown (join first)")
          .toRuntimeException();
    }
    g.serve(t, listener);
  }

  private PrepGroup group(String id) {
    synchronized (this) {
      PrepGroup g = byId.get(id);
      if (g == null) {
        throw CallStatus.NOT_FOUND.withDescription("prep group '" + id + "' is unknown").toRuntimeException();
      }
      return g;
    }
  }

  ObjectNode join(PrepRequests.Join j) throws Exception {
    Dataset d = registry.get(j.dataset());
    PrepGroup.Key key = new PrepGroup.Key(d.name(), j.fingerprint(), j.seed(), j.batchSize(), j.shuffle(), j.dropLast());
    long member = memberIds.incrementAndGet();
    synchronized (this) {
      PrepGroup g = open.get(key);
      ObjectNode r = g == null ? null : g.join(member, j.name(), j.epochs(), j.startEpoch(), j.startBatch());
      if (r == null) {
        String id = PrepPipeline.sha256(key + "#" + System.nanoTime()).substring(0, 16);
        g = new PrepGroup(id, key, d, j.pipeline(), assembler, pool, threads, allocator, j.settings());
        try {
          r = g.join(member, j.name(), j.epochs(), j.startEpoch(), j.startBatch());
        } catch (RuntimeException e) {
          g.close(); // a bad start position: no group without members is left behind
          throw e;
        }
        open.put(key, g);
        byId.put(id, g);
        trimHistory();
      }
      return r;
    }
  }

  private void trimHistory() {
    if (byId.size() <= HISTORY) {
      return;
    }
    for (var it = byId.entrySet().iterator(); it.hasNext() && byId.size() > HISTORY; ) {
      if (it.next().getValue().isClosed()) {
        it.remove();
      }
    }
  }

  private void reap() {
    List<PrepGroup> groups;
    synchronized (this) {
      groups = new ArrayList<>(open.values());
    }
    long now = System.nanoTime();
    for (PrepGroup g : groups) {
      g.reap(now);
      if (g.isClosed()) {
        synchronized (this) {
          open.remove(g.key, g);
        }
      }
    }
  }

  public synchronized String statsJson() {
    ObjectNode o = JsonNodeFactory.instance.objectNode();
    o.put("v", 1);
    o.put("threads", threads);
    ObjectNode st = o.putObject("staging");
    st.put("limit_bytes", allocator.getLimit());
    st.put("allocated_bytes", allocator.getAllocatedMemory());
    st.put("peak_bytes", allocator.getPeakMemoryAllocation());
    ObjectNode gs = o.putObject("groups");
    byId.forEach((id, g) -> gs.set(id, g.statsJson()));
    return o.toString();
  }

  @Override
  public void close() throws Exception {
    reaper.shutdownNow();
    List<PrepGroup> groups;
    synchronized (this) {
      groups = new ArrayList<>(byId.values());
      open.clear();
    }
    for (PrepGroup g : groups) {
      g.close();
    }
    pool.shutdownNow();
    pool.awaitTermination(10, TimeUnit.SECONDS);
    SharedMemory.removeOwn(SHM_PREFIX); // every group freed its files
    allocator.close();
  }
}
