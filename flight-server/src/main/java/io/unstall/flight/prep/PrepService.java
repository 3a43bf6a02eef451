package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.BatchAssembler;
import io.unstall.flight.Bounds;
import io.unstall.flight.auth.PermissionDeniedException;
import io.unstall.flight.auth.Principal;
import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.dataset.DatasetRegistry;
import io.unstall.flight.protocol.PrepRates;
import io.unstall.flight.protocol.PrepTicket;
import io.unstall.flight.shm.SharedMemory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;
import org.apache.arrow.flight.Action;
import org.apache.arrow.flight.ActionType;
import org.apache.arrow.flight.CallOption;
import org.apache.arrow.flight.CallStatus;
import org.apache.arrow.flight.FlightClient;
import org.apache.arrow.flight.FlightDescriptor;
import org.apache.arrow.flight.FlightProducer.ServerStreamListener;
import org.apache.arrow.flight.FlightProducer.StreamListener;
import org.apache.arrow.flight.FlightStream;
import org.apache.arrow.flight.Ticket;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.compression.CompressionUtil;

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
 *
 * <p>This class is the RPC layer: it checks callers and dispatches to the parts, which it makes and closes:
 * {@link PrepResources} (what groups share), {@link PrepGroups} (the registry and its reaper, which announces in
 * the cluster through {@link GroupAnnouncer}), {@link RemotePrep} (remote prep workers, both sides) and
 * {@link PrepStats} (the stats document).
 */
public final class PrepService implements AutoCloseable {
  public static final String ACTION_JOIN = "prep.join";
  public static final String ACTION_HEARTBEAT = "prep.heartbeat";
  public static final String ACTION_LEAVE = "prep.leave";
  public static final String ACTION_STATS = "prep.stats";
  public static final String ACTION_NEXT = "prep.next";
  public static final String ACTION_CLAIM = "prep.claim";
  public static final String ACTION_RELEASE = "prep.release";
  public static final String ACTION_ORDER = "prep.order";
  /** Group key fingerprints of external groups: members prepare batches with their own transforms. */
  static final String EXTERNAL_PREFIX = "python:";
  /** Prepared tensors for members on this host live in /dev/shm/unstall-prep-<pid>. */
  static final String SHM_PREFIX = "unstall-prep-";

  private final DatasetRegistry registry;
  private final PrepPipeline.DecodeLimits decodeLimits;
  private final PrepResources shared;
  private final GroupAnnouncer announcer = new GroupAnnouncer();
  private final PrepGroups groups;
  private final RemotePrep remote;
  private final PrepStats stats;
  private volatile String localSocket; // the local socket's path once it listens (localSocket)

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
    this.decodeLimits = decodeLimits;
    int threads = bounds.prepThreads();
    AtomicInteger n = new AtomicInteger();
    ExecutorService pool = Executors.newFixedThreadPool(threads, r -> {
      Thread t = new Thread(r, "unstall-prep-worker-" + n.incrementAndGet());
      t.setDaemon(true);
      return t;
    });
    PrepGroup.Limits limits = new PrepGroup.Limits(bounds.prepClaimTimeout().toNanos(),
        bounds.waitTimeout().toNanos(), bounds.statsEpochs());
    this.shared = new PrepResources(assembler, pool, threads, prep, new SlotPool(prep),
        new DecodeBudget(decode, timeoutSeconds, TimeUnit.SECONDS), new ReindexedJpegs(reindexed),
        new DecodedImages(reindexed), limits);
    this.groups = new PrepGroups(shared, bounds.prepGroups(), announcer);
    this.remote = new RemotePrep(registry, shared, groups);
    this.stats = new PrepStats(shared, decodeLimits, groups, remote);
  }

  public static boolean handles(String actionType) {
    return actionType.startsWith("prep.");
  }

  /**
   * From now on the groups that take remote prep workers are announced in {@code d} (the cluster's directory),
   * and withdrawn when they close.
   */
  public void announceIn(GroupDirectory d) {
    announcer.announceIn(d);
  }

  /** Whether a {@code prep.*} action may wait (for a batch, or a member's turn): it needs admission. */
  public static boolean waits(String actionType) {
    return actionType.equals(ACTION_CLAIM) || actionType.equals(ACTION_NEXT);
  }

  public int threads() {
    return shared.threads();
  }

  public BufferAllocator allocator() {
    return shared.allocator();
  }

  public DecodeBudget decodeBudget() {
    return shared.decodeBudget();
  }

  public static void listActions(StreamListener<ActionType> listener) {
    listener.onNext(new ActionType(ACTION_JOIN, "join (or create) a coordinated prep group; JSON in and out"));
    listener.onNext(new ActionType(ACTION_HEARTBEAT, "keep a group member alive: {\"group\",\"member\"}"));
    listener.onNext(new ActionType(ACTION_LEAVE, "leave a group: {\"group\",\"member\"}"));
    listener.onNext(new ActionType(ACTION_NEXT, "shared-memory read: wait for a batch, get its /dev/shm file"));
    listener.onNext(new ActionType(ACTION_CLAIM, "external groups: wait for a batch or the turn to prepare it"));
    listener.onNext(new ActionType(ACTION_RELEASE, "external groups: give back a claim another member should make"));
    listener.onNext(new ActionType(ACTION_STATS, "prep groups, staging memory and prepared/served counts as JSON"));
    listener.onNext(new ActionType(ACTION_ORDER, "cache_first groups: an epoch's window and cache snapshot"));
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
          yield group(at.group(), caller).serving().claimNext(at.member(), at.epoch(),
              RemotePrep.PEER_CLAIM_WAIT_NANOS, cancelled).toString();
        }
        PrepRequests.At at = PrepRequests.at(type, b);
        yield group(at.group(), caller).serving().claim(at.member(), at.epoch(), at.batch(), cancelled).toString();
      }
      case ACTION_RELEASE -> {
        JsonNode b = PrepRequests.body(type, action.getBody());
        PrepRequests.At at = PrepRequests.at(type, b);
        boolean released = group(at.group(), caller).serving().release(at.member(), at.epoch(), at.batch(),
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
        PrepRates rates = PrepRequests.rates(type, body);
        if (rates != null) {
          g.rates(at.member(), rates);
        }
        yield g.serving().next(at.member(), at.epoch(), at.batch(), released, cancelled).toString();
      }
      case ACTION_ORDER -> {
        PrepRequests.At at = PrepRequests.epochOf(type, PrepRequests.body(type, action.getBody()));
        yield group(at.group(), caller).cacheOrder(at.member(), at.epoch()).toString();
      }
      default -> throw CallStatus.UNIMPLEMENTED.withDescription("unknown action '" + type + "'; prep actions: "
          + List.of(ACTION_JOIN, ACTION_HEARTBEAT, ACTION_LEAVE, ACTION_NEXT, ACTION_CLAIM, ACTION_RELEASE,
              ACTION_STATS, ACTION_ORDER))
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
    group(at.group(), caller).serving().upload(at.member(), at.epoch(), at.batch(), stream.getRoot(), cancelled);
    while (stream.next()) {
      // one batch per upload; drain anything else
    }
  }

  /** Serves a PREP ticket; a hybrid member's rates in it go to the split as {@code prep.next}'s do. */
  public void getStream(Ticket ticket, ServerStreamListener listener, Principal caller) throws InterruptedException {
    PrepTicket t = PrepTicket.from(ticket);
    PrepGroup g = groups.get(t.group());
    if (g == null) {
      throw CallStatus.NOT_FOUND.withDescription("prep group " + t.group() + " is unknown (join first)")
          .toRuntimeException();
    }
    checkMay(caller, g);
    if (t.rates() != null) {
      g.rates(t.member(), t.rates());
    }
    g.serving().serve(t, listener);
  }

  private PrepGroup group(String id, Principal caller) {
    PrepGroup g = groups.get(id);
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

  /**
   * {@code prep.join} with its {@code "compression"} option: the member's Flight reads come LZ4- or
   * ZSTD-compressed.
   */
  private ObjectNode joinCompressed(JsonNode body, Principal caller) throws Exception {
    CompressionUtil.CodecType codec = PrepRequests.compression(body);
    ObjectNode r = join(PrepRequests.join(body, decodeLimits), caller);
    if (codec != null) {
      group(r.path("group").asText(), caller).serving().setCompression(r.path("member").asLong(), codec);
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
    PrepGroup.Key key =
        new PrepGroup.Key(d.name(), j.fingerprint(), j.seed(), j.batchSize(), j.shuffle(), j.dropLast(),
            j.cacheWindow());
    ObjectNode r = groups.join(key, d, j.pipeline(), s, j);
    // a member decoding on its device (decode(device="mixed")) refuses by the same caps as this sidecar's decode
    decodeLimits.putTo(r.putObject("decode_limits"));
    if (!caller.owner()) {
      r.put("shm", false); // in a group staging in shared memory too: a tenant reads PREP tickets
    } else if (r.path("shm").asBoolean(false) && localSocket != null) {
      r.put("local", localSocket);
    }
    return r;
  }

  // -- remote prep workers (RemotePrep) ---------------------------------------------------------------------

  public static boolean handlesPeer(String actionType) {
    return RemotePrep.handles(actionType);
  }

  /** A {@code peer.prep.*} action of another sidecar (authenticated by the cluster token); one JSON result. */
  public byte[] peerAction(Action action) throws Exception {
    return remote.action(action);
  }

  public static boolean handlesPeerPut(FlightDescriptor d) {
    return RemotePrep.handlesPut(d);
  }

  /** DoPut of a batch a remote worker prepared for one of this sidecar's groups. */
  public void acceptPeerPut(FlightStream stream) {
    remote.acceptPut(stream);
  }

  /** Enlists this sidecar as a remote prep worker of another sidecar's group ({@link RemotePrep#enlist}). */
  public PrepWorker enlist(FlightClient owner, String ownerAddress, CallOption[] options, String group, String name)
      throws Exception {
    return remote.enlist(owner, ownerAddress, options, group, name);
  }

  public String statsJson() {
    return statsJson(Principal.OWNER);
  }

  /** Prep stats with the groups of the datasets {@code caller} may read. */
  public String statsJson(Principal caller) {
    return stats.json(caller);
  }

  @Override
  public void close() throws Exception {
    groups.stopReaper();
    announcer.withdrawAll();
    remote.close();
    groups.closeAll();
    shared.pool().shutdownNow();
    shared.pool().awaitTermination(10, TimeUnit.SECONDS);
    shared.reindexed().close(); // after the decode threads, which read its copies
    shared.decoded().close();
    shared.slotPool().close();
    SharedMemory.removeOwn(SHM_PREFIX); // every group freed its files
    shared.decodeBudget().close(); // the data plane closes the prep and decode allocators next: they throw if held
  }
}
