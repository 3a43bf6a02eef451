package io.unstall.flight.prep;

import io.unstall.flight.protocol.PrepTicket;
import io.unstall.flight.shm.SharedMemory;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.BatchAssembler;
import io.unstall.flight.Bounds;
import io.unstall.flight.auth.PermissionDeniedException;
import io.unstall.flight.auth.Principal;
import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.dataset.DatasetRegistry;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.BooleanSupplier;
import org.apache.arrow.flight.Action;
import org.apache.arrow.vector.compression.CompressionUtil;
import org.apache.arrow.flight.ActionType;
import org.apache.arrow.flight.CallStatus;
import org.apache.arrow.flight.FlightDescriptor;
import org.apache.arrow.flight.FlightProducer.ServerStreamListener;
import org.apache.arrow.flight.FlightProducer.StreamListener;
import org.apache.arrow.flight.FlightStream;
import org.apache.arrow.flight.Ticket;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.util.AutoCloseables;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Coordinated prep (docs/PREP.md): the {@code prep.*} actions and PREP tickets. Jobs that join with the same
 * dataset, pipeline fingerprint, seed, batch size, shuffle and drop_last share one {@link PrepGroup}; every
 * batch is fetched and prepared once, by a pool of prep threads (each group tunes how many it uses, {@link
 * Autotuner}), and served to all members.
 * All staging memory comes from the "prep" child of the data plane's streams allocator (half its limit), one
 * child per group bounded by the group's staging limit; the native memory of decodes in progress is reserved in
 * the {@link DecodeBudget}, another child of the streams allocator. At most {@code --prep-groups} groups are open
 * at once (each has two producer threads), the pool has {@code --prep-threads} threads, a claim of an external
 * group expires after {@code --prep-claim-timeout}, and a call waits at most {@code --wait-timeout} for its batch.
 */
public final class PrepService implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(PrepService.class);
  public static final String ACTION_JOIN = "prep.join";
  public static final String ACTION_HEARTBEAT = "prep.heartbeat";
  public static final String ACTION_LEAVE = "prep.leave";
  public static final String ACTION_STATS = "prep.stats";
  public static final String ACTION_NEXT = "prep.next";
  public static final String ACTION_CLAIM = "prep.claim";
  public static final String ACTION_RELEASE = "prep.release";
  /** Peer-port actions (cluster token) of remote prep workers: protocol/README.md, "Remote prep workers". */
  public static final String PEER_ENLIST = "peer.prep.enlist";
  public static final String PEER_CLAIM = "peer.prep.claim";
  public static final String PEER_RELEASE = "peer.prep.release";
  public static final String PEER_LEAVE = "peer.prep.leave";
  static final String PEER_PUT = "peer.prep.put";
  /** How long one {@code peer.prep.claim} waits for a batch to prepare before answering "wait". */
  static final long PEER_CLAIM_WAIT_NANOS = TimeUnit.SECONDS.toNanos(1);
  /** Group key fingerprints of external groups: members prepare batches with their own transforms. */
  static final String EXTERNAL_PREFIX = "python:";
  private static final int HISTORY = 64;

  private final DatasetRegistry registry;
  private final BatchAssembler assembler;
  private final BufferAllocator allocator;
  private final DecodeBudget decodeBudget;
  private final ReindexedJpegs reindexed;
  private final PrepPipeline.DecodeLimits decodeLimits;
  private final int threads;
  private final int maxGroups;
  private final PrepGroup.Limits limits;
  private final ExecutorService pool;
  private final ScheduledExecutorService reaper;
  private final SlotPool slotPool; // free /dev/shm slot files between groups
  private volatile String localSocket; // the local socket's path once it listens (localSocket)
  private final AtomicLong memberIds = new AtomicLong();
  // Guarded by this: the open group of each key, and every group by id (closed ones kept for stats).
  private final Map<PrepGroup.Key, PrepGroup> open = new HashMap<>();
  private final LinkedHashMap<String, PrepGroup> byId = new LinkedHashMap<>();
  private final List<PrepWorker> workers = new ArrayList<>(); // this sidecar enlisted in other sidecars' groups
  private volatile GroupDirectory directory = GroupDirectory.NONE;
  private final Set<String> announced = new HashSet<>(); // groups in the directory; reaper only

  /** Prepared tensors for members on this host live in /dev/shm/unstall-prep-<pid>. */
  static final String SHM_PREFIX = "unstall-prep-";

  /** Memory for restart-indexed JPEG copies when {@code --reindex-memory} is not given: a quarter of streams. */
  public static long defaultReindexMemory(long streamsLimit) {
    return streamsLimit / 4;
  }

  /** Decode memory when {@code --decode-memory} is not given: a quarter of the streams budget. */
  public static long defaultDecodeMemory(long streamsLimit) {
    return streamsLimit / 4;
  }

  /**
   * {@code bounds}: the prep bounds (threads, groups, claim and wait timeouts, stats epochs);
   * {@code decodeLimits}: the caps of pipelines that name none; {@code prep}: the data plane's "prep" allocator
   * (staging; each group opens its own child of it); {@code decode}: its "decode" allocator (the decode budget);
   * {@code reindexed}: its "reindexed" allocator (restart-indexed JPEG copies, {@link ReindexedJpegs}; null or a
   * zero limit: none); {@code timeoutSeconds}: how long a decode waits for memory before its batch fails. No
   * allocator is closed here: the data plane closes them after this service.
   */
  public PrepService(DatasetRegistry registry, BatchAssembler assembler, BufferAllocator prep, BufferAllocator decode,
      BufferAllocator reindexed, Bounds bounds, PrepPipeline.DecodeLimits decodeLimits, long timeoutSeconds) {
    this.registry = registry;
    this.assembler = assembler;
    this.decodeLimits = decodeLimits;
    this.allocator = prep;
    this.decodeBudget = new DecodeBudget(decode, timeoutSeconds, TimeUnit.SECONDS);
    this.reindexed = new ReindexedJpegs(reindexed);
    this.slotPool = new SlotPool(prep);
    this.threads = bounds.prepThreads();
    this.maxGroups = bounds.prepGroups();
    this.limits = new PrepGroup.Limits(bounds.prepClaimTimeout().toNanos(), bounds.waitTimeout().toNanos(),
        bounds.statsEpochs());
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

  /**
   * From now on the groups that take remote prep workers are announced in {@code d} (the cluster's directory),
   * and withdrawn when they close.
   */
  public void announceIn(GroupDirectory d) {
    directory = d;
  }

  /** Whether a {@code prep.*} action may wait (for a batch, or a member's turn): it needs admission. */
  public static boolean waits(String actionType) {
    return actionType.equals(ACTION_CLAIM) || actionType.equals(ACTION_NEXT);
  }

  public int threads() {
    return threads;
  }

  public BufferAllocator allocator() {
    return allocator;
  }

  public DecodeBudget decodeBudget() {
    return decodeBudget;
  }

  public static void listActions(StreamListener<ActionType> listener) {
    listener.onNext(new ActionType(ACTION_JOIN, "join (or create) a coordinated prep group; JSON in and out"));
    listener.onNext(new ActionType(ACTION_HEARTBEAT, "keep a group member alive: {\"group\",\"member\"}"));
    listener.onNext(new ActionType(ACTION_LEAVE, "leave a group: {\"group\",\"member\"}"));
    listener.onNext(new ActionType(ACTION_NEXT, "shared-memory read: wait for a batch, get its /dev/shm file"));
    listener.onNext(new ActionType(ACTION_CLAIM, "external groups: wait for a batch or the turn to prepare it"));
    listener.onNext(new ActionType(ACTION_RELEASE, "external groups: give back a claim another member should make"));
    listener.onNext(new ActionType(ACTION_STATS, "prep groups, staging memory and prepared/served counts as JSON"));
  }

  /**
   * Runs a {@code prep.*} action for {@code caller}; the result is one UTF-8 JSON document. A tenant may use only
   * groups of the datasets granted to it, and reads batches over Flight, never from the owner's shared memory.
   */
  public byte[] doAction(Action action, BooleanSupplier cancelled, Principal caller) throws Exception {
    String type = action.getType();
    String out = switch (type) {
      case ACTION_JOIN -> joinCompressed(PrepRequests.body(type, action.getBody()), caller).toString();
      case ACTION_HEARTBEAT -> {
        PrepRequests.Member m = PrepRequests.member(PrepRequests.body(type, action.getBody()));
        group(m.group(), caller).heartbeat(m.member());
        yield "{\"v\":1,\"ok\":true}";
      }
      case ACTION_LEAVE -> {
        PrepRequests.Member m = PrepRequests.member(PrepRequests.body(type, action.getBody()));
        group(m.group(), caller).leave(m.member());
        yield "{\"v\":1,\"left\":true}";
      }
      case ACTION_STATS -> statsJson(caller);
      case ACTION_CLAIM -> {
        JsonNode b = PrepRequests.body(type, action.getBody());
        if (b.path("next").asBoolean(false)) { // a DataLoader worker process: the next free batch of the epoch
          PrepRequests.At at = PrepRequests.epochOf(type, b);
          yield group(at.group(), caller).claimNext(at.member(), at.epoch(), PEER_CLAIM_WAIT_NANOS, cancelled)
              .toString();
        }
        PrepRequests.At at = PrepRequests.at(type, b);
        yield group(at.group(), caller).claim(at.member(), at.epoch(), at.batch(), cancelled).toString();
      }
      case ACTION_RELEASE -> {
        JsonNode b = PrepRequests.body(type, action.getBody());
        PrepRequests.At at = PrepRequests.at(type, b);
        boolean released = group(at.group(), caller).release(at.member(), at.epoch(), at.batch(),
            b.path("reason").asText(""));
        yield "{\"v\":1,\"released\":" + released + "}";
      }
      case ACTION_NEXT -> {
        JsonNode body = PrepRequests.body(type, action.getBody());
        PrepRequests.At at = PrepRequests.at(type, body);
        long[][] released = PrepRequests.released(type, body);
        PrepGroup g = group(at.group(), caller);
        if (!caller.owner()) {
          throw new PermissionDeniedException(ACTION_NEXT + " hands out the sidecar owner's shared-memory files; "
              + caller + " reads prepared batches with PREP DoGet tickets");
        }
        yield g.next(at.member(), at.epoch(), at.batch(), released, cancelled).toString();
      }
      default -> throw CallStatus.UNIMPLEMENTED.withDescription("unknown action '" + type + "'; prep actions: "
          + List.of(ACTION_JOIN, ACTION_HEARTBEAT, ACTION_LEAVE, ACTION_NEXT, ACTION_CLAIM, ACTION_RELEASE,
              ACTION_STATS))
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

  public void acceptPut(FlightStream stream, BooleanSupplier cancelled, Principal caller)
      throws Exception {
    PrepRequests.At at = PrepRequests.put(stream.getDescriptor().getCommand());
    if (!stream.next()) {
      throw new IllegalArgumentException("prep.put: the stream carries no record batch");
    }
    group(at.group(), caller).upload(at.member(), at.epoch(), at.batch(), stream.getRoot(), cancelled);
    while (stream.next()) {
      // one batch per upload; drain anything else
    }
  }

  /** Serves a PREP ticket. */
  public void getStream(Ticket ticket, ServerStreamListener listener, Principal caller) throws InterruptedException {
    PrepTicket t = PrepTicket.from(ticket);
    PrepGroup g;
    synchronized (this) {
      g = byId.get(t.group());
    }
    if (g == null) {
      throw CallStatus.NOT_FOUND.withDescription("prep group " + t.group() + " is unknown (join first)")
          .toRuntimeException();
    }
    checkMay(caller, g);
    g.serve(t, listener);
  }

  private PrepGroup group(String id, Principal caller) {
    PrepGroup g;
    synchronized (this) {
      g = byId.get(id);
    }
    if (g == null) {
      throw CallStatus.NOT_FOUND.withDescription("prep group '" + id + "' is unknown").toRuntimeException();
    }
    checkMay(caller, g);
    return g;
  }

  /** A group of a dataset the caller was not granted is refused without naming that dataset. */
  private static void checkMay(Principal caller, PrepGroup g) {
    if (!caller.mayRead(g.key.dataset())) {
      throw new PermissionDeniedException(caller + " may not use prep group '" + g.id + "'");
    }
  }

  /** {@code prep.join} with its {@code "compression"} option: the member's Flight reads come LZ4- or ZSTD-compressed. */
  private ObjectNode joinCompressed(JsonNode body, Principal caller) throws Exception {
    CompressionUtil.CodecType codec = PrepRequests.compression(body);
    ObjectNode r = join(PrepRequests.join(body, decodeLimits), caller);
    if (codec != null) {
      group(r.path("group").asText(), caller).setCompression(r.path("member").asLong(), codec);
      r.put("compression", CompressedBatches.wire(codec));
    }
    return r;
  }

  /**
   * The sidecar's local socket, once it listens: an owner's join of a group staging in shared memory names it
   * ({@code "local"}), where the member then sends its {@code prep.next} requests (protocol/README.md, kind 6).
   */
  public void localSocket(Path socket) {
    this.localSocket = socket == null ? null : socket.toString();
  }

  ObjectNode join(PrepRequests.Join j, Principal caller) throws Exception {
    caller.checkRead(j.dataset());
    Dataset d = registry.get(j.dataset(), caller::mayRead);
    PrepGroup.Settings s = j.settings();
    if (!caller.owner()) { // a tenant cannot open the owner's /dev/shm files
      s = s.withShm(false);
    }
    PrepGroup.Key key = new PrepGroup.Key(d.name(), j.fingerprint(), j.seed(), j.batchSize(), j.shuffle(), j.dropLast());
    long member = memberIds.incrementAndGet();
    synchronized (this) {
      PrepGroup g = open.get(key);
      ObjectNode r = g == null ? null : g.join(member, j.name(), j.epochs(), j.startEpoch(), j.startBatch());
      if (r == null) {
        long running = open.values().stream().filter(o -> !o.isClosed()).count();
        if (running >= maxGroups) {
          throw CallStatus.RESOURCE_EXHAUSTED.withDescription("prep.join: the sidecar already runs " + running
              + " prep groups (--prep-groups " + maxGroups + "); a new group needs another dataset, pipeline, seed,"
              + " batch_size, shuffle or drop_last than those: join one of them, wait for one to end, or raise"
              + " --prep-groups").toRuntimeException();
        }
        String id = PrepPipeline.sha256(key + "#" + System.nanoTime()).substring(0, 16);
        g = new PrepGroup(id, key, d, j.pipeline(), assembler, pool, threads, allocator, slotPool, decodeBudget,
            reindexed, s, limits);
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
      if (!caller.owner()) {
        r.put("shm", false); // in a group staging in shared memory too: a tenant reads PREP tickets
      } else if (r.path("shm").asBoolean(false) && localSocket != null) {
        r.put("local", localSocket);
      }
      return r;
    }
  }

  // -- remote prep workers: the owner's side (peer port) -----------------------------------------------------

  public static boolean handlesPeer(String actionType) {
    return actionType.startsWith("peer.prep.");
  }

  /** A {@code peer.prep.*} action of another sidecar (authenticated by the cluster token); one JSON result. */
  public byte[] peerAction(Action action) throws Exception {
    String type = action.getType();
    JsonNode b = PrepRequests.body(type, action.getBody());
    String out = switch (type) {
      case PEER_ENLIST -> peerGroup(b).enlist(memberIds.incrementAndGet(), b.path("name").asText("")).toString();
      case PEER_CLAIM -> {
        RemoteWorkers.Turn t = peerGroup(b).workerClaim(worker(type, b), PEER_CLAIM_WAIT_NANOS);
        ObjectNode o = JsonNodeFactory.instance.objectNode().put("v", 1).put("state", t.state());
        if (t.state().equals("produce")) {
          o.put("epoch", t.epoch()).put("batch", t.batch());
        }
        yield o.toString();
      }
      case PEER_RELEASE -> {
        PrepRequests.At at = PrepRequests.workerAt(type, b);
        peerGroup(b).workerRelease(at.member(), at.epoch(), at.batch(), b.path("reason").asText(""));
        yield "{\"v\":1,\"released\":true}";
      }
      case PEER_LEAVE -> {
        peerGroup(b).workerLeave(worker(type, b));
        yield "{\"v\":1,\"left\":true}";
      }
      default -> throw CallStatus.UNIMPLEMENTED.withDescription("unknown peer action '" + type + "'; peer actions: "
          + List.of(PEER_ENLIST, PEER_CLAIM, PEER_RELEASE, PEER_LEAVE)).toRuntimeException();
    };
    return out.getBytes(StandardCharsets.UTF_8);
  }

  public static boolean handlesPeerPut(FlightDescriptor d) {
    return d.isCommand() && new String(d.getCommand(), StandardCharsets.UTF_8).startsWith("{\"" + PEER_PUT + "\"");
  }

  /** DoPut of a batch a remote worker prepared: descriptor {@code {"peer.prep.put":{"group","worker","epoch","batch"}}}. */
  public void acceptPeerPut(FlightStream stream) {
    JsonNode c = PrepRequests.body(PEER_PUT, stream.getDescriptor().getCommand()).get(PEER_PUT);
    if (c == null || !c.isObject()) {
      throw new IllegalArgumentException(PEER_PUT + ": expected {\"" + PEER_PUT + "\":{\"group\",\"worker\",\"epoch\",\"batch\"}}");
    }
    PrepRequests.At at = PrepRequests.workerAt(PEER_PUT, c);
    PrepGroup g = peerGroup(c);
    if (!stream.next()) {
      throw new IllegalArgumentException(PEER_PUT + ": the stream carries no record batch");
    }
    g.workerUpload(at.member(), at.epoch(), at.batch(), stream.getRoot());
    while (stream.next()) {
      // one batch per upload; drain anything else
    }
  }

  private static long worker(String type, JsonNode b) {
    return PrepRequests.workerAt(type, ((ObjectNode) b.deepCopy()).put("epoch", 0).put("batch", 0)).member();
  }

  private PrepGroup peerGroup(JsonNode b) {
    PrepGroup g;
    synchronized (this) {
      g = byId.get(PrepRequests.group(b));
    }
    if (g == null) {
      throw CallStatus.NOT_FOUND.withDescription("prep group '" + PrepRequests.group(b) + "' is unknown here")
          .toRuntimeException();
    }
    return g;
  }

  // -- remote prep workers: the worker's side ------------------------------------------------------------------

  /**
   * Enlists this sidecar as a remote prep worker of group {@code group} owned by the sidecar whose peer port
   * {@code owner} reaches (with the cluster token in {@code options}); returns once enlisted, then prepares the
   * batches it claims until {@link PrepWorker#close()} or the group closes. The group's dataset must be registered
   * here under the same name (same samples).
   */
  public PrepWorker enlist(org.apache.arrow.flight.FlightClient owner, String ownerAddress,
      org.apache.arrow.flight.CallOption[] options, String group, String name) throws Exception {
    PrepWorker w = new PrepWorker(this, owner, ownerAddress, options, group, name);
    synchronized (this) {
      workers.removeIf(PrepWorker::finished);
      workers.add(w);
    }
    w.start();
    return w;
  }

  /** The worker's copy of an owner's group, from the owner's {@code peer.prep.enlist} answer. */
  PrepReplica replica(JsonNode spec) {
    Dataset d = registry.get(spec.path("dataset").asText());
    if (d.size() != spec.path("num_samples").asInt()) {
      throw new IllegalArgumentException("remote prep worker: dataset '" + d.name() + "' has " + d.size()
          + " samples here and " + spec.path("num_samples").asInt() + " on the group's sidecar");
    }
    PrepPipeline p = PrepPipeline.parse(spec.get("pipeline"));
    if (!p.fingerprint().equals(spec.path("fingerprint").asText())) {
      throw new IllegalArgumentException("remote prep worker: the pipeline parses to another fingerprint here ("
          + p.fingerprint() + " vs " + spec.path("fingerprint").asText() + "): different sidecar versions?");
    }
    PrepGroup.Key key = new PrepGroup.Key(d.name(), p.fingerprint(), spec.path("seed").asLong(),
        spec.path("batch_size").asInt(), spec.path("shuffle").asBoolean(), spec.path("drop_last").asBoolean());
    return new PrepReplica(spec.path("group").asText(), key, d, p, assembler, pool, threads, allocator, decodeBudget,
        reindexed, limits);
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
    slotPool.expire(System.nanoTime());
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
    try {
      announce(groups);
    } catch (RuntimeException e) { // the cluster going away: retried on the next round, never kills the reaper
      LOG.warn("announcing prep groups to the cluster failed (retried): {}", e.toString());
    }
  }

  /** Brings the directory in line with the open groups (on the reaper's thread: one writer, at most 100 ms late). */
  private void announce(List<PrepGroup> groups) {
    GroupDirectory d = directory;
    if (d == GroupDirectory.NONE) {
      return;
    }
    Set<String> now = new HashSet<>();
    for (PrepGroup g : groups) {
      if (g.takesWorkers()) {
        now.add(g.id);
        if (announced.add(g.id)) {
          Dataset ds = g.dataset();
          d.opened(g.id, JsonNodeFactory.instance.objectNode()
              .put("group", g.id).put("dataset", ds.name()).put("format", ds.format().name())
              .put("uri", ds.storage().uri()));
        }
      }
    }
    for (var it = announced.iterator(); it.hasNext(); ) {
      String id = it.next();
      if (!now.contains(id)) {
        it.remove();
        d.closed(id);
      }
    }
  }

  public String statsJson() {
    return statsJson(Principal.OWNER);
  }

  /** Prep stats with the groups of the datasets {@code caller} may read. */
  public synchronized String statsJson(Principal caller) {
    ObjectNode o = JsonNodeFactory.instance.objectNode();
    o.put("v", 1);
    o.put("threads", threads);
    o.put("max_groups", maxGroups);
    ObjectNode st = o.putObject("staging");
    st.put("limit_bytes", allocator.getLimit());
    st.put("allocated_bytes", allocator.getAllocatedMemory());
    st.put("peak_bytes", allocator.getPeakMemoryAllocation());
    slotPool.stats(st);
    ObjectNode dc = o.putObject("decode");
    dc.put("max_pixels", decodeLimits.maxPixels());
    dc.put("max_aspect_ratio", decodeLimits.maxAspectRatio());
    dc.put("memory_limit_bytes", decodeBudget.limit());
    dc.put("memory_reserved_bytes", decodeBudget.reservedBytes());
    dc.put("memory_peak_bytes", decodeBudget.peakBytes());
    dc.put("largest_request_bytes", decodeBudget.largestRequest());
    dc.put("waits", decodeBudget.waits());
    dc.put("decoder", NativeJpeg.AVAILABLE ? NativeJpeg.NAME : NativeJpeg.OPENCV); // for JPEGs the fast path takes
    if (!NativeJpeg.AVAILABLE) {
      dc.put("decoder_reason", NativeJpeg.PROBLEM);
    }
    dc.put("samples_native", NativeJpeg.NATIVE_SAMPLES.sum()); // this process, every group
    dc.put("samples_opencv", NativeJpeg.OPENCV_SAMPLES.sum());
    if (NativeJpeg.AVAILABLE) {
      dc.put("samples_spliced", NativeJpeg.splicedDecodes()); // of samples_native: only the crop's MCUs decoded
    }
    reindexed.stats(dc.putObject("reindexed"));
    ObjectNode gs = o.putObject("groups");
    byId.forEach((id, g) -> {
      if (caller.mayRead(g.key.dataset())) {
        gs.set(id, g.statsJson());
      }
    });
    if (caller.owner()) {
      ArrayNode ws = o.putArray("workers"); // groups of other sidecars this one prepares batches for
      workers.forEach(w -> ws.add(w.statsJson()));
    }
    return o.toString();
  }

  @Override
  public void close() throws Exception {
    reaper.shutdownNow();
    reaper.awaitTermination(10, TimeUnit.SECONDS);
    try {
      for (String id : announced) {
        directory.closed(id);
      }
    } catch (RuntimeException e) { // this sidecar left the cluster already: the others forget its groups
      LOG.debug("withdrawing prep groups from the cluster: {}", e.toString());
    }
    announced.clear();
    List<PrepWorker> ws;
    synchronized (this) {
      ws = new ArrayList<>(workers);
    }
    AutoCloseables.close(ws);
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
    reindexed.close(); // after the decode threads, which read its copies
    slotPool.close();
    SharedMemory.removeOwn(SHM_PREFIX); // every group freed its files
    decodeBudget.close(); // the data plane closes the prep and decode allocators next: they throw if memory is held
  }
}
