package io.unstall.flight.prep;

import io.unstall.flight.protocol.PrepTicket;
import io.unstall.flight.shm.SharedMemory;
import io.unstall.flight.shm.ShmBuffer;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.BatchAssembler;
import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.protocol.BatchSchema;
import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.nio.file.Path;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.SplittableRandom;
import java.util.TreeMap;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;
import java.util.function.BooleanSupplier;
import org.apache.arrow.flight.CallStatus;
import org.apache.arrow.flight.FlightProducer.ServerStreamListener;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.BitVectorHelper;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.FixedSizeBinaryVector;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VectorLoader;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.VectorUnloader;
import org.apache.arrow.vector.compression.CompressionUtil;
import org.apache.arrow.vector.ipc.message.ArrowFieldNode;
import org.apache.arrow.vector.ipc.message.ArrowRecordBatch;
import org.apache.arrow.vector.types.pojo.Schema;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One coordinated-prep group: the jobs that declared the same dataset, pipeline, seed, batch size, shuffle and
 * drop_last. Batch positions run over epochs ({@code pos = epoch * numBatches + batch}); producer threads
 * prepare each position once, in order (two at a time), into the group's staging allocator, and a staged batch
 * is freed as soon as every member's cursor has passed it. Production stays at most {@code window} positions ahead of
 * the slowest member and never allocates beyond the staging limit, so staging memory is bounded. Members that
 * neither wait in a DoGet nor heartbeat for {@code memberTimeout} are dropped, so a dead job stalls the others
 * for at most that long.
 */
final class PrepGroup {
  private static final Logger LOG = LoggerFactory.getLogger(PrepGroup.class);
  private static final ObjectMapper JSON = new ObjectMapper();
  /** Ids, labels, validity bits per row, on top of the tensor (a generous bound, as StreamBudget's). */
  static final long ROW_OVERHEAD = 512;
  /** Minimum allocations of a batch's small vectors (keys, ids, labels, validity), whatever its rows. */
  static final long BATCH_OVERHEAD = 256 << 10;

  record Key(String dataset, String fingerprint, long seed, int batchSize, boolean shuffle, boolean dropLast) {}

  /** The group's settings, fixed by the first joiner. */
  record Settings(int window, long stagingBytes, long memberTimeoutNanos, int groupSize, long joinTimeoutNanos,
      boolean shm) {}

  /**
   * The sidecar's bounds on a group: how long a member may hold a claim ({@code --prep-claim-timeout}), how long
   * a call waits for a batch, a claim or staging room ({@code --wait-timeout}), how many epochs' counts are kept
   * ({@code --stats-epochs}).
   */
  record Limits(long claimTimeoutNanos, long waitTimeoutNanos, int statsEpochs) {}

  /** An external group's claim: the member making a batch, since when. Also a remote prep worker's claim. */
  private record Claim(long member, long since) {}

  /** A remote prep worker: another sidecar of the cluster that prepares some of this group's batches. */
  private static final class Worker {
    final long id;
    final String name;
    long lastSeen;

    Worker(long id, String name, long now) {
      this.id = id;
      this.name = name;
      this.lastSeen = now;
    }
  }

  /** What a remote worker's claim asks of it: prepare {@code (epoch, batch)}, or wait, or stop (group closed). */
  record WorkerTurn(String state, long epoch, long batch) {}

  private static final class Member {
    final long id;
    final String name;
    final long startPos;
    final long endPos;
    long cursor;
    long lastSeen;
    int waiting;

    Member(long id, String name, long startPos, long endPos, long now) {
      this.id = id;
      this.name = name;
      this.startPos = startPos;
      this.endPos = endPos;
      this.cursor = startPos;
      this.lastSeen = now;
    }
  }

  final String id;
  final Key key;
  private final Dataset dataset;
  private final PrepPipeline pipeline; // null: raw batches (or, external, member-made batches), no sidecar prep
  private final boolean external; // members prepare batches with their own (Python) transforms and upload them
  private final boolean replica; // a remote prep worker's copy of another sidecar's group: prepares what it claims
  private final ImagePrep imagePrep;
  private final BatchAssembler assembler;
  private final ExecutorService pool;
  private final int threads;
  private final BufferAllocator alloc;
  private final Schema schema;
  private final int numSamples;
  private final int numBatches;
  private final int window;
  private final long stagingLimit;
  private final long rawCost;
  private final long outCost;
  private final Settings settings;
  private final Limits limits;
  private final long created = System.nanoTime();
  /** Batches prepared concurrently: one's serial fetch overlaps another's parallel decode. */
  static final int PRODUCERS = 2;
  private final List<Thread> producers = new ArrayList<>();
  private final Object orderLock = new Object();
  private final Path shmDir; // null: prepared tensors live in ordinary Arrow memory
  private final boolean skip; // on_error "skip": a bad image is left out of its batch instead of failing it
  /** The last skipped samples kept for stats. */
  static final int SKIPPED_HISTORY = 64;

  // Guarded by this.
  private final Map<Long, Member> members = new LinkedHashMap<>();
  private final Map<Long, String> gone = new HashMap<>();
  private final List<ObjectNode> dropped = new ArrayList<>();
  private final TreeMap<Long, VectorSchemaRoot> staged = new TreeMap<>();
  private final Map<Long, FlightRuntimeException> failed = new HashMap<>();
  private final Map<Long, String> shmPaths = new HashMap<>();
  private final Map<Long, Claim> claimedBy = new HashMap<>(); // external groups: position -> producing member
  private final Map<Long, Long> expiredClaims = new HashMap<>(); // position -> the member whose claim expired
  private long claimsExpired;
  private long claimsReleased; // given back by their member (a worker process died or its transform raised)
  private final CompressedBatches compressed; // LZ4/ZSTD copies of staged batches for members that asked
  private final Map<Long, Long> producedBy = new HashMap<>(); // external groups: member -> batches uploaded
  private final Map<Long, Worker> workers = new LinkedHashMap<>(); // remote prep workers enlisted now
  private final Map<Long, Claim> workerClaims = new HashMap<>(); // position -> the remote worker preparing it
  private final Map<Long, Long> expiredWorkerClaims = new HashMap<>(); // position -> the worker whose claim expired
  private final java.util.TreeSet<Long> returned = new java.util.TreeSet<>(); // given back by workers: prepare again
  private final Map<String, Long> preparedBy = new LinkedHashMap<>(); // "local" or "worker <id> (<name>)" -> batches
  private long workerClaimsExpired;
  private final TreeMap<Long, Long> preparedPerEpoch = new TreeMap<>();
  private long nextToProduce;
  private boolean started;
  private boolean closed;
  private int inFlight;
  private int preparing;
  private int liveProducers;
  private int left;
  private long batchesPrepared;
  private long samplesPrepared;
  private long batchesServed;
  private long samplesSkipped;
  private final ArrayDeque<ObjectNode> skippedRecent = new ArrayDeque<>();
  private final Set<Integer> skippedLogged = new HashSet<>(); // samples warned about once
  private long prepNanos;
  private final AtomicLong fetchNanos = new AtomicLong();
  private final AtomicLong prepCpuNanos = new AtomicLong();
  private static final ThreadMXBean CPU = ManagementFactory.getThreadMXBean();
  private int stagedPeak;
  private long orderEpoch = -1;
  private int[] order;

  PrepGroup(String id, Key key, Dataset dataset, PrepPipeline pipeline, BatchAssembler assembler, ExecutorService pool,
      int threads, BufferAllocator parent, DecodeBudget decodeBudget, Settings requested, Limits limits) {
    this(id, key, dataset, pipeline, assembler, pool, threads, parent, decodeBudget, requested, limits, false);
  }

  /**
   * {@code replica}: this sidecar is a remote prep worker of the group {@code id} owned by another sidecar; the
   * object runs no producers and has no members, it prepares the batches its worker claims ({@link #prepareClaimed}).
   */
  PrepGroup(String id, Key key, Dataset dataset, PrepPipeline pipeline, BatchAssembler assembler, ExecutorService pool,
      int threads, BufferAllocator parent, DecodeBudget decodeBudget, Settings requested, Limits limits,
      boolean replica) {
    this.id = id;
    this.replica = replica;
    this.limits = limits;
    this.key = key;
    this.dataset = dataset;
    this.pipeline = pipeline;
    this.external = key.fingerprint().startsWith(PrepService.EXTERNAL_PREFIX);
    this.imagePrep = pipeline == null ? null : new ImagePrep(pipeline, decodeBudget);
    this.skip = pipeline != null && pipeline.decode().onError() == PrepPipeline.OnError.SKIP;
    this.assembler = assembler;
    this.pool = pool;
    this.threads = threads;
    this.numSamples = dataset.size();
    int b = key.batchSize();
    this.numBatches = key.dropLast() ? numSamples / b : (numSamples + b - 1) / b;
    if (numBatches == 0) {
      throw new IllegalArgumentException("prep group: dataset '" + dataset.name() + "' has " + numSamples
          + " samples, fewer than batch_size " + b + " with drop_last: no batch at all");
    }
    int maxLen = 0;
    for (int i = 0; i < numSamples; i++) {
      maxLen = Math.max(maxLen, dataset.length(i));
    }
    long rounded = parent.getRoundingPolicy().getRoundedSize(Math.max(1L, (long) maxLen * b));
    this.rawCost = rounded + b * ROW_OVERHEAD + BATCH_OVERHEAD;
    this.outCost = pipeline == null
        ? 0
        : parent.getRoundingPolicy().getRoundedSize((long) pipeline.sampleBytes() * b) + b * ROW_OVERHEAD + BATCH_OVERHEAD;
    long perBatch = pipeline == null ? rawCost : outCost;
    long fixed = pipeline == null ? 0 : rawCost; // one raw batch being decoded
    long staging = requested.stagingBytes() > 0
        ? requested.stagingBytes()
        : Math.min(parent.getLimit(), external ? 256L << 20 : fixed + perBatch * requested.window());
    if (staging > parent.getLimit()) {
      throw CallStatus.RESOURCE_EXHAUSTED.withDescription("prep group: staging_bytes " + staging
          + " exceeds the sidecar's prep staging budget of " + parent.getLimit() + " bytes").toRuntimeException();
    }
    if (!external && fixed + perBatch > staging) {
      throw CallStatus.RESOURCE_EXHAUSTED.withDescription("prep group: staging_bytes " + staging
          + " cannot hold one batch (" + (fixed + perBatch) + " bytes for batch_size " + b
          + (pipeline == null ? "" : " and output " + Arrays.toString(pipeline.sampleShape()) + " " + pipeline.dtype().wire())
          + "); raise staging_bytes or lower batch_size").toRuntimeException();
    }
    this.window = external
        ? requested.window() // uploads wait for room in staging_bytes instead
        : (int) Math.max(1, Math.min(requested.window(), (staging - fixed) / perBatch));
    this.stagingLimit = staging;
    Path shm = null;
    if (requested.shm() && pipeline != null && SharedMemory.available()) {
      try {
        shm = SharedMemory.create(PrepService.SHM_PREFIX).dir();
      } catch (IOException e) {
        LOG.warn("prep group {}: no shared memory ({}); members get batches over Flight", id, e.toString());
      }
    }
    this.shmDir = shm;
    this.settings = new Settings(window, staging, requested.memberTimeoutNanos(), requested.groupSize(),
        requested.joinTimeoutNanos(), shm != null);
    this.schema = pipeline == null ? BatchSchema.SCHEMA : PrepSchema.of(pipeline);
    this.alloc = parent.newChildAllocator((replica ? "prep-worker-" : "prep-group-") + id, 0, staging);
    this.compressed = new CompressedBatches(id, parent, staging);
    this.liveProducers = external || replica ? 0 : PRODUCERS;
    for (int i = 0; i < liveProducers; i++) {
      Thread t = new Thread(this::produceLoop, "unstall-prep-" + id + "-" + i);
      t.setDaemon(true);
      producers.add(t);
      t.start();
    }
  }

  Settings settings() {
    return settings;
  }

  int numBatches() {
    return numBatches;
  }

  Dataset dataset() {
    return dataset;
  }

  /** Whether remote prep workers may enlist: an open group this sidecar prepares itself (not raw or external). */
  synchronized boolean takesWorkers() {
    return !closed && pipeline != null && !external && !replica;
  }

  synchronized boolean isClosed() {
    return closed;
  }

  // -- membership ---------------------------------------------------------------------------------------

  /**
   * Adds a member; null when the group has just closed (the caller makes a new one). {@code startEpoch} >= 0: a
   * resumed member (a job restored from a checkpoint) that starts at batch {@code startBatch} of that epoch; the
   * group never prepares the batches before it for this member. {@code epochs} counts from {@code startEpoch},
   * the partial first epoch included.
   */
  synchronized ObjectNode join(long memberId, String name, long epochs, long startEpoch, long startBatch) {
    if (closed) {
      return null;
    }
    long now = System.nanoTime();
    long startPos = 0;
    if (startEpoch >= 0) {
      if (startBatch < 0 || startBatch >= numBatches) {
        throw CallStatus.INVALID_ARGUMENT.withDescription("prep.join: \"start_batch\" " + startBatch
            + " is out of range; an epoch of prep group " + id + " has " + numBatches + " batches").toRuntimeException();
      }
      startPos = startEpoch * numBatches + startBatch;
      if (started && startPos < minCursor()) {
        long min = minCursor();
        throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + id + " (dataset '" + key.dataset()
            + "', seed " + key.seed() + ") cannot start a member at epoch " + startEpoch + " batch " + startBatch
            + ": its members have read up to epoch " + min / numBatches + " batch " + min % numBatches
            + " and every batch is prepared once, so it no longer has that one; join without a start position to"
            + " start at the group's next whole epoch").toRuntimeException();
      }
    } else if (started) {
      // A late joiner starts at the first whole epoch whose batch 0 every member still holds or has yet to
      // read: it never sees a partial epoch and never makes the group re-prepare a batch.
      long min = minCursor();
      startPos = (min + numBatches - 1) / numBatches * numBatches;
    }
    long endPos = epochs > 0 ? (startPos / numBatches + epochs) * numBatches : Long.MAX_VALUE;
    members.put(memberId, new Member(memberId, name, startPos, endPos, now));
    notifyAll();
    ObjectNode o = JsonNodeFactory.instance.objectNode();
    o.put("v", 1);
    o.put("group", id);
    o.put("member", memberId);
    o.put("start_epoch", startPos / numBatches);
    o.put("start_batch", startPos % numBatches);
    o.put("num_batches", numBatches);
    o.put("num_samples", numSamples);
    o.put("batch_size", key.batchSize());
    o.put("fingerprint", key.fingerprint());
    if (pipeline != null) {
      ArrayNode shape = o.putArray("shape");
      for (int s : pipeline.sampleShape()) {
        shape.add(s);
      }
      o.put("dtype", pipeline.dtype().wire());
      o.put("layout", pipeline.layout().name());
      o.put("on_error", pipeline.decode().onError().wire());
    }
    o.put("window", window);
    o.put("staging_limit_bytes", stagingLimit);
    o.put("member_timeout_s", settings.memberTimeoutNanos() / 1e9);
    o.put("group_size", settings.groupSize());
    o.put("shm", shmDir != null);
    return o;
  }

  synchronized void heartbeat(long memberId) {
    member(memberId).lastSeen = System.nanoTime();
  }

  synchronized void leave(long memberId) {
    remove(member(memberId), "left");
    left++;
  }

  /**
   * Drops members that neither wait in a DoGet nor heartbeat; opens the join barrier on its timeout; gives back
   * claims held past the claim timeout (a member whose transform raised may live on, heartbeating).
   */
  synchronized void reap(long now) {
    if (closed) {
      return;
    }
    maybeStart(now);
    for (var it = claimedBy.entrySet().iterator(); it.hasNext(); ) {
      var e = it.next();
      if (now - e.getValue().since() > limits.claimTimeoutNanos()) {
        long pos = e.getKey();
        it.remove();
        expiredClaims.put(pos, e.getValue().member());
        claimsExpired++;
        LOG.warn("prep group {}: member {} did not upload epoch {} batch {} within {} s of claiming it"
            + " (--prep-claim-timeout); another member may claim it", id, e.getValue().member(), pos / numBatches,
            pos % numBatches, seconds(limits.claimTimeoutNanos()));
        notifyAll();
      }
    }
    for (var it = workerClaims.entrySet().iterator(); it.hasNext(); ) {
      var e = it.next();
      if (now - e.getValue().since() > limits.claimTimeoutNanos()) {
        long pos = e.getKey();
        it.remove();
        expiredWorkerClaims.put(pos, e.getValue().member());
        returned.add(pos);
        workerClaimsExpired++;
        LOG.warn("prep group {}: remote prep worker {} did not upload epoch {} batch {} within {} s of claiming it"
            + " (--prep-claim-timeout); it is prepared again", id, e.getValue().member(), pos / numBatches,
            pos % numBatches, seconds(limits.claimTimeoutNanos()));
        notifyAll();
      }
    }
    for (Worker w : List.copyOf(workers.values())) {
      if (now - w.lastSeen > settings.memberTimeoutNanos()
          && workerClaims.values().stream().noneMatch(c -> c.member() == w.id)) {
        LOG.warn("prep group {}: remote prep worker {} ({}) silent for {} s; dropped", id, w.id, w.name,
            String.format("%.1f", (now - w.lastSeen) / 1e9));
        removeWorker(w.id);
      }
    }
    for (Member m : List.copyOf(members.values())) {
      long silent = now - m.lastSeen;
      if (m.waiting == 0 && silent > settings.memberTimeoutNanos()) {
        String why = "dropped after no heartbeat for " + String.format("%.1f", silent / 1e9) + " s (member_timeout_s "
            + settings.memberTimeoutNanos() / 1e9 + ")";
        LOG.warn("prep group {}: member {} ({}) {}; the others go on", id, m.id, m.name, why);
        ObjectNode d = JsonNodeFactory.instance.objectNode();
        d.put("member", m.id);
        d.put("name", m.name);
        d.put("at_epoch", m.cursor / numBatches);
        d.put("at_batch", m.cursor % numBatches);
        d.put("reason", why);
        dropped.add(d);
        remove(m, why);
      }
    }
  }

  private void maybeStart(long now) {
    if (!started && (members.size() >= settings.groupSize() || (!members.isEmpty()
        && now - created > settings.joinTimeoutNanos()))) {
      started = true;
      LOG.info("prep group {} starts with {} member(s) (group_size {})", id, members.size(), settings.groupSize());
      notifyAll();
    }
  }

  private Member member(long memberId) {
    Member m = members.get(memberId);
    if (m == null) {
      String why = gone.get(memberId);
      throw CallStatus.NOT_FOUND.withDescription("prep group " + id + ": member " + memberId
          + (why != null ? " was " + why : " is unknown (join first)")).toRuntimeException();
    }
    return m;
  }

  private void remove(Member m, String why) {
    members.remove(m.id);
    gone.put(m.id, why);
    releaseConsumed();
    claimedBy.values().removeIf(c -> c.member() == m.id); // another member prepares what it had claimed
    compressed.removeMember(m.id);
    if (members.isEmpty() && started) {
      closed = true; // the producers free everything on their way out
      if (external) {
        Thread t = new Thread(this::free, "unstall-prep-free-" + id);
        t.setDaemon(true);
        t.start();
      }
    }
    notifyAll();
  }

  private long minCursor() {
    long min = Long.MAX_VALUE;
    for (Member m : members.values()) {
      min = Math.min(min, m.cursor);
    }
    return min == Long.MAX_VALUE ? nextToProduce : min;
  }

  private long maxEnd() {
    long max = 0;
    for (Member m : members.values()) {
      max = Math.max(max, m.endPos);
    }
    return max;
  }

  /** Frees every staged batch all members are past; removes members that read all their epochs. */
  private void releaseConsumed() {
    long min = minCursor();
    while (!staged.isEmpty() && staged.firstKey() < min) {
      shmPaths.remove(staged.firstKey());
      staged.pollFirstEntry().getValue().close();
    }
    compressed.freeBelow(min);
    failed.keySet().removeIf(p -> p < min);
    expiredClaims.keySet().removeIf(p -> p < min);
    expiredWorkerClaims.keySet().removeIf(p -> p < min);
  }

  /** The deadline of a wait that starts now ({@code --wait-timeout}). */
  private long waitDeadline() {
    return System.nanoTime() + limits.waitTimeoutNanos();
  }

  /** A wait past its deadline: TIMED_OUT, naming what it waited for. */
  private void checkDeadline(long deadline, String waitedFor) {
    if (System.nanoTime() - deadline > 0) {
      throw CallStatus.TIMED_OUT.withDescription("prep group " + id + ": gave up after "
          + seconds(limits.waitTimeoutNanos()) + " s waiting for " + waitedFor + " (--wait-timeout)")
          .toRuntimeException();
    }
  }

  /** Seconds for a message: "120", or "0.3" for a bound under a second (tests). */
  static String seconds(long nanos) {
    return nanos % 1_000_000_000L == 0 ? Long.toString(nanos / 1_000_000_000L) : String.format("%.1f", nanos / 1e9);
  }

  private String at(long pos) {
    return "epoch " + pos / numBatches + " batch " + pos % numBatches;
  }

  /** Counts a batch prepared in its epoch, keeping the latest epochs' counts. */
  private void countPrepared(long epoch) {
    preparedPerEpoch.merge(epoch, 1L, Long::sum);
    while (preparedPerEpoch.size() > limits.statsEpochs()) {
      preparedPerEpoch.pollFirstEntry();
    }
  }

  // -- production ---------------------------------------------------------------------------------------

  private void produceLoop() {
    try {
      while (true) {
        long pos;
        synchronized (this) {
          while (true) {
            if (closed) {
              return;
            }
            maybeStart(System.nanoTime());
            if (started && !members.isEmpty()) {
              // Every member is past what lies below the slowest cursor (resumed members, skips): never prepared.
              nextToProduce = Math.max(nextToProduce, minCursor());
            }
            // Memory: what is allocated (staged, being sent, partly prepared) plus a whole batch for each one
            // in preparation and this one: conservative, so an allocation never fails.
            if (started && !members.isEmpty() && alloc.getAllocatedMemory() + (preparing + 1) * (outCost + rawCost)
                + workerClaims.size() * outCost <= stagingLimit) {
              long p = takePosition();
              if (p >= 0) {
                pos = p;
                break;
              }
            }
            wait(10); // sends release memory without telling us: look again soon
          }
          preparing++;
        }
        long t0 = System.nanoTime();
        VectorSchemaRoot root = null;
        FlightRuntimeException failure = null;
        try {
          root = prepare(pos, shmPaths);
        } catch (FlightRuntimeException e) {
          failure = e;
        } catch (Exception e) {
          failure = CallStatus.INTERNAL.withDescription(e.getMessage() == null ? e.toString() : e.getMessage())
              .withCause(e).toRuntimeException();
        }
        synchronized (this) {
          preparing--;
          if (failure != null) {
            LOG.warn("prep group {}: batch {} of epoch {} failed: {}", id, pos % numBatches, pos / numBatches,
                failure.getMessage());
            failed.put(pos, failure);
          } else {
            prepNanos += System.nanoTime() - t0;
            preparedBy.merge("local", 1L, Long::sum);
            batchesPrepared++;
            samplesPrepared += root.getRowCount();
            countPrepared(pos / numBatches);
            if (closed || pos < minCursor()) {
              root.close();
            } else {
              staged.put(pos, root);
              stagedPeak = Math.max(stagedPeak, staged.size());
            }
          }
          notifyAll();
        }
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    } catch (Throwable e) {
      LOG.error("prep group {}: producer failed", id, e);
    } finally {
      boolean last;
      synchronized (this) {
        closed = true;
        notifyAll();
        last = --liveProducers == 0;
      }
      if (last) {
        free();
      }
    }
  }

  /**
   * The next position to prepare (by a local producer or a remote worker), or -1: first a position a worker gave
   * back (its claim expired, it left, or it failed), then the next new one within the window. Caller holds the lock.
   */
  private long takePosition() {
    long min = minCursor();
    while (!returned.isEmpty() && returned.first() < min) {
      returned.pollFirst(); // every member skipped past it
    }
    if (!returned.isEmpty()) {
      return returned.pollFirst();
    }
    nextToProduce = Math.max(nextToProduce, min);
    if (nextToProduce < min + window && nextToProduce < maxEnd()) {
      return nextToProduce++;
    }
    return -1;
  }

  // -- remote prep workers (docs/ARCHITECTURE.md, "Across nodes": remote prep workers) ------------------------

  /** What a worker needs to prepare this group's batches exactly as this sidecar would. */
  synchronized ObjectNode enlist(long workerId, String name) {
    if (pipeline == null || external || replica) {
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + id + " is not prepared by its sidecar"
          + " (raw or external group): remote prep workers run a sidecar pipeline").toRuntimeException();
    }
    if (closed) {
      throw CallStatus.NOT_FOUND.withDescription("prep group " + id + " closed").toRuntimeException();
    }
    workers.put(workerId, new Worker(workerId, name, System.nanoTime()));
    LOG.info("prep group {}: remote prep worker {} ({}) enlisted", id, workerId, name);
    ObjectNode o = JsonNodeFactory.instance.objectNode();
    o.put("v", 1);
    o.put("group", id);
    o.put("worker", workerId);
    o.put("dataset", key.dataset());
    o.put("num_samples", numSamples);
    o.set("pipeline", pipeline.canonical());
    o.put("fingerprint", key.fingerprint());
    o.put("seed", key.seed());
    o.put("batch_size", key.batchSize());
    o.put("shuffle", key.shuffle());
    o.put("drop_last", key.dropLast());
    o.put("num_batches", numBatches);
    return o;
  }

  private Worker worker(long workerId) {
    Worker w = workers.get(workerId);
    if (w == null) {
      throw CallStatus.NOT_FOUND.withDescription("prep group " + id + ": remote prep worker " + workerId
          + " is not enlisted (it left, was dropped, or never enlisted)").toRuntimeException();
    }
    w.lastSeen = System.nanoTime();
    return w;
  }

  /**
   * A remote worker asks for a batch to prepare: waits up to {@code waitNanos} for a position (one a worker gave
   * back first, then the next within the window and staging, as a local producer would take it).
   */
  synchronized WorkerTurn workerClaim(long workerId, long waitNanos) throws InterruptedException {
    long deadline = System.nanoTime() + waitNanos;
    while (true) {
      if (closed) {
        return new WorkerTurn("closed", 0, 0);
      }
      Worker w = worker(workerId);
      maybeStart(System.nanoTime());
      if (started && !members.isEmpty() && alloc.getAllocatedMemory() + preparing * (outCost + rawCost)
          + (workerClaims.size() + 1) * outCost <= stagingLimit) {
        long pos = takePosition();
        if (pos >= 0) {
          workerClaims.put(pos, new Claim(w.id, System.nanoTime()));
          expiredWorkerClaims.remove(pos, w.id);
          notifyAll();
          return new WorkerTurn("produce", pos / numBatches, pos % numBatches);
        }
      }
      long left = deadline - System.nanoTime();
      if (left <= 0) {
        return new WorkerTurn("wait", 0, 0);
      }
      wait(Math.max(1, Math.min(10, left / 1_000_000)));
    }
  }

  /** The ids of batch {@code (epoch, batch)}, in order (what its uploaded "id" column must be). */
  int[] batchIds(long epoch, long batch) {
    int from = (int) batch * key.batchSize();
    int to = Math.min(from + key.batchSize(), numSamples);
    return Arrays.copyOfRange(order(epoch), from, to);
  }

  /**
   * Stages a batch a remote worker prepared: accepted once, only from the worker whose claim is live; its ids
   * must be the batch's and its schema this group's (shape, dtype, fingerprint). A late upload is refused.
   */
  synchronized void workerUpload(long workerId, long epoch, long batch, VectorSchemaRoot in) {
    long pos = epoch * numBatches + batch;
    if (closed) {
      throw CallStatus.NOT_FOUND.withDescription("prep group " + id + " closed").toRuntimeException();
    }
    Worker w = worker(workerId);
    Claim claim = workerClaims.get(pos);
    if (claim == null || claim.member() != w.id) {
      Long expired = expiredWorkerClaims.get(pos);
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + id + ": remote prep worker " + w.id
          + (expired != null && expired == w.id
              ? "'s claim on epoch " + epoch + " batch " + batch + " expired: it was not uploaded within "
                  + seconds(limits.claimTimeoutNanos()) + " s (--prep-claim-timeout) and was prepared again"
              : " holds no claim on epoch " + epoch + " batch " + batch)).toRuntimeException();
    }
    Map<String, String> meta = in.getSchema().getCustomMetadata();
    if (meta == null || !key.fingerprint().equals(meta.get(PrepSchema.FINGERPRINT))
        || !in.getSchema().getFields().equals(schema.getFields())) {
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + id + ": the uploaded batch's schema is not"
          + " the group's prepared-batch schema (pipeline " + key.fingerprint() + ")").toRuntimeException();
    }
    int[] ids = batchIds(epoch, batch);
    BigIntVector idv = (BigIntVector) in.getVector(PrepSchema.ID);
    boolean skippedSome = meta.containsKey(PrepSchema.SKIPPED);
    boolean idsOk = skippedSome ? in.getRowCount() <= ids.length : in.getRowCount() == ids.length;
    for (int i = 0, j = 0; idsOk && i < in.getRowCount(); i++, j++) {
      while (skippedSome && j < ids.length && idv.get(i) != ids[j]) {
        j++; // skipped samples leave gaps; the kept ones stay in order
      }
      idsOk = j < ids.length && idv.get(i) == ids[j];
    }
    if (!idsOk) {
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + id + ": the uploaded batch's \"id\" column"
          + " is not epoch " + epoch + " batch " + batch + "'s ids in order (is the dataset registered differently"
          + " on the worker?)").toRuntimeException();
    }
    workerClaims.remove(pos);
    preparedBy.merge("worker " + w.id + " (" + w.name + ")", 1L, Long::sum);
    adoptUpload(in, pos, epoch);
  }

  /** A worker gives a claim back (its prepare failed): this sidecar prepares the batch (and reports any error). */
  synchronized void workerRelease(long workerId, long epoch, long batch, String why) {
    long pos = epoch * numBatches + batch;
    Worker w = worker(workerId);
    Claim c = workerClaims.get(pos);
    if (c != null && c.member() == w.id) {
      workerClaims.remove(pos);
      returned.add(pos);
      LOG.info("prep group {}: remote prep worker {} gave back epoch {} batch {}: {}", id, w.id, epoch, batch, why);
      notifyAll();
    }
  }

  synchronized void workerLeave(long workerId) {
    if (workers.containsKey(workerId)) {
      removeWorker(workerId);
      LOG.info("prep group {}: remote prep worker {} left", id, workerId);
    }
  }

  /** Removes a worker; its claims go back and are prepared again (an upload after that is refused). */
  private void removeWorker(long workerId) {
    workers.remove(workerId);
    for (var it = workerClaims.entrySet().iterator(); it.hasNext(); ) {
      var e = it.next();
      if (e.getValue().member() == workerId) {
        it.remove();
        returned.add(e.getKey());
      }
    }
    notifyAll();
  }

  /** A replica (remote worker side): prepares batch {@code (epoch, batch)} as the owner would, same randomness. */
  VectorSchemaRoot prepareClaimed(long epoch, long batch) throws Exception {
    if (!replica) {
      throw new IllegalStateException("not a remote worker's replica");
    }
    long t0 = System.nanoTime();
    VectorSchemaRoot r = prepare(epoch * numBatches + batch, shmPaths);
    synchronized (this) {
      prepNanos += System.nanoTime() - t0;
      batchesPrepared++;
      samplesPrepared += r.getRowCount();
      countPrepared(epoch);
    }
    return r;
  }

  /** Waits for sends still holding staged buffers, then frees the staging allocator. */
  private boolean freed; // guarded by this

  private void free() {
    synchronized (this) {
      if (freed) {
        return;
      }
      freed = true;
    }
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
    synchronized (this) {
      while (inFlight > 0 && System.nanoTime() < deadline) {
        try {
          wait(10);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          break;
        }
      }
      staged.values().forEach(VectorSchemaRoot::close);
      staged.clear();
      shmPaths.clear();
    }
    try {
      compressed.close();
      alloc.close();
    } catch (RuntimeException e) {
      LOG.warn("prep group {}: {}", id, e.getMessage());
    }
  }

  /** Stops the producer (sidecar shutdown) and waits until it has freed its memory. */
  void close() throws InterruptedException {
    synchronized (this) {
      closed = true;
      notifyAll();
    }
    for (Thread t : producers) {
      t.join(TimeUnit.SECONDS.toMillis(40));
    }
    if (external || replica) {
      free();
    }
  }

  private int[] order(long epoch) {
    synchronized (orderLock) {
      return orderLocked(epoch);
    }
  }

  private int[] orderLocked(long epoch) {
    if (orderEpoch != epoch) {
      int[] o = new int[numSamples];
      for (int i = 0; i < o.length; i++) {
        o[i] = i;
      }
      if (key.shuffle()) {
        SplittableRandom r = ImagePrep.rng(key.seed() ^ 0x5EED5EEDL, epoch, Long.MIN_VALUE);
        for (int i = o.length - 1; i > 0; i--) {
          int j = r.nextInt(i + 1);
          int t = o[i];
          o[i] = o[j];
          o[j] = t;
        }
      }
      order = o;
      orderEpoch = epoch;
    }
    return order;
  }

  private VectorSchemaRoot prepare(long pos, Map<Long, String> paths) throws Exception {
    long epoch = pos / numBatches;
    int b = (int) (pos % numBatches);
    int from = b * key.batchSize();
    int to = Math.min(from + key.batchSize(), numSamples);
    int[] ids = Arrays.copyOfRange(order(epoch), from, to);
    long t0 = System.nanoTime();
    VectorSchemaRoot raw =
        assembler.assemble(dataset, new BatchAssembler.Requester("prep-" + id, dataset.stats()), epoch, ids, alloc);
    fetchNanos.addAndGet(System.nanoTime() - t0);
    if (pipeline == null) {
      return raw;
    }
    try {
      return decode(raw, pos, ids, paths);
    } finally {
      raw.close();
    }
  }

  /**
   * Runs the pipeline on every row of {@code raw}, spread over the prep pool. A sample that is not a decodable image
   * within the pipeline's rules fails the batch, naming it, or (on_error "skip") is left out: the kept rows close
   * up, and the batch's schema lists the skipped ones ({@link PrepSchema#SKIPPED}).
   */
  private VectorSchemaRoot decode(VectorSchemaRoot raw, long pos, int[] ids, Map<Long, String> paths)
      throws Exception {
    long epoch = pos / numBatches;
    int n = ids.length;
    VectorSchemaRoot out = VectorSchemaRoot.create(schema, alloc);
    try {
      BigIntVector idOut = (BigIntVector) out.getVector(PrepSchema.ID);
      BigIntVector labelOut = (BigIntVector) out.getVector(PrepSchema.LABEL);
      FixedSizeBinaryVector tensor = (FixedSizeBinaryVector) out.getVector(PrepSchema.TENSOR);
      BigIntVector labelIn = (BigIntVector) raw.getVector(BatchSchema.LABEL);
      VarBinaryVector payload = (VarBinaryVector) raw.getVector(BatchSchema.PAYLOAD);
      idOut.allocateNew(n);
      labelOut.allocateNew(n);
      if (shmDir == null) {
        tensor.allocateNew(n);
      } else {
        // The tensor buffer is a /dev/shm file mapped here, counted by the staging allocator like any other.
        ShmBuffer shm = ShmBuffer.create(shmDir.resolve(id + "-" + pos), (long) n * pipeline.sampleBytes(), false);
        try (ArrowBuf data = alloc.wrapForeignAllocation(shm);
            ArrowBuf validity = alloc.buffer(Math.max(8, (n + 7) / 8))) {
          validity.setZero(0, validity.capacity());
          tensor.loadFieldBuffers(new ArrowFieldNode(n, 0), List.of(validity, data));
        }
        synchronized (this) {
          paths.put(pos, shm.path().toString());
        }
      }
      int sb = (int) pipeline.sampleBytes(); // at most Integer.MAX_VALUE (PrepPipeline.parse)
      ArrowBuf in = payload.getDataBuffer();
      ArrowBuf dst = tensor.getDataBuffer();
      String[] bad = new String[n]; // why each skipped sample was skipped
      int chunks = Math.min(n, threads * 4); // small chunks even out the threads' finishing times
      List<Callable<Void>> tasks = new ArrayList<>(chunks);
      for (int c = 0; c < chunks; c++) {
        int lo = (int) ((long) n * c / chunks);
        int hi = (int) ((long) n * (c + 1) / chunks);
        tasks.add(() -> {
          long cpu0 = CPU.getCurrentThreadCpuTime();
          for (int i = lo; i < hi; i++) {
            int start = payload.getStartOffset(i);
            int len = payload.getEndOffset(i) - start;
            try {
              imagePrep.run(in.nioBuffer(start, len), ImagePrep.rng(key.seed(), epoch, ids[i]),
                  dst.nioBuffer((long) i * sb, sb));
            } catch (ImagePrep.BadImageException e) {
              if (!skip) {
                throw CallStatus.INTERNAL.withDescription(sample(ids[i]) + ": " + e.getMessage()
                    + "; prep with on_error=\"skip\" leaves such samples out").toRuntimeException();
              }
              bad[i] = e.getMessage();
            } catch (DecodeBudget.ExhaustedException e) {
              throw CallStatus.RESOURCE_EXHAUSTED.withDescription(sample(ids[i]) + ": " + e.getMessage())
                  .toRuntimeException();
            }
          }
          prepCpuNanos.addAndGet(CPU.getCurrentThreadCpuTime() - cpu0);
          return null;
        });
      }
      for (Future<Void> f : pool.invokeAll(tasks)) {
        try {
          f.get();
        } catch (ExecutionException e) {
          if (e.getCause() instanceof Exception ex) {
            throw ex;
          }
          throw e;
        }
      }
      // The kept rows, in order, close up over the skipped ones: row k is the k-th kept sample.
      ArrowBuf validity = tensor.getValidityBuffer();
      int kept = 0;
      ArrayNode skipped = JsonNodeFactory.instance.arrayNode();
      for (int i = 0; i < n; i++) {
        if (bad[i] != null) {
          skipped.addObject().put("id", ids[i]).put("key", dataset.key(ids[i])).put("reason", bad[i]);
          continue;
        }
        if (kept != i) {
          dst.setBytes((long) kept * sb, dst, (long) i * sb, sb);
        }
        idOut.set(kept, ids[i]);
        if (labelIn.isNull(i)) {
          labelOut.setNull(kept);
        } else {
          labelOut.set(kept, labelIn.get(i));
        }
        BitVectorHelper.setBit(validity, kept);
        kept++;
      }
      out.setRowCount(kept);
      if (skipped.isEmpty()) {
        return out;
      }
      noteSkipped(epoch, pos % numBatches, skipped);
      Map<String, String> meta = new HashMap<>(schema.getCustomMetadata());
      meta.put(PrepSchema.SKIPPED, skipped.toString());
      return new VectorSchemaRoot(new Schema(schema.getFields(), meta), out.getFieldVectors(), kept);
    } catch (Exception | Error e) {
      out.close();
      throw e;
    }
  }

  /** "dataset 'imgs' sample 12 ('c0/x.jpg')": how errors name a sample. */
  private String sample(int sampleId) {
    return "dataset '" + dataset.name() + "' sample " + sampleId + " ('" + dataset.key(sampleId) + "')";
  }

  private synchronized void noteSkipped(long epoch, long batch, ArrayNode skipped) {
    for (var it = skipped.elements(); it.hasNext(); ) {
      ObjectNode s = ((ObjectNode) it.next()).deepCopy();
      samplesSkipped++;
      int sampleId = s.get("id").asInt();
      if (skippedLogged.add(sampleId)) { // each epoch skips it again: warn once
        LOG.warn("prep group {}: skipped {} (on_error skip): {}", id, sample(sampleId), s.get("reason").asText());
      }
      s.put("epoch", epoch);
      s.put("batch", batch);
      skippedRecent.addLast(s);
      if (skippedRecent.size() > SKIPPED_HISTORY) {
        skippedRecent.removeFirst();
      }
    }
  }

  // -- serving ------------------------------------------------------------------------------------------

  /** Serves one batch to one member: waits until it is staged, sends it, then advances the member's cursor. */
  void serve(PrepTicket t, ServerStreamListener listener) throws InterruptedException {
    VectorSchemaRoot view;
    long pos;
    synchronized (this) {
      Member m = member(t.member());
      pos = checkedPosition(m, t.epoch(), t.batch());
      m.waiting++;
      try {
        awaitStaged(m, pos, listener::isCancelled);
      } catch (FlightRuntimeException e) {
        if (listener.isCancelled()) {
          return;
        }
        throw e;
      } finally {
        m.waiting--;
      }
      view = share(staged.get(pos));
      inFlight++;
    }
    boolean sent = false;
    ArrowRecordBatch compressedSend = null; // the compressed batch sent instead of the view's buffers
    try {
      CompressionUtil.CodecType codec = compressed.of(t.member());
      if (codec == null) {
        listener.start(view);
      } else {
        compressedSend = compressed.send(listener, view, pos, codec);
      }
      long deadline = waitDeadline();
      while (!listener.isReady() && !listener.isCancelled()) {
        checkDeadline(deadline, "member " + t.member() + " to take " + at(pos));
        LockSupport.parkNanos(20_000);
      }
      if (!listener.isCancelled()) {
        listener.putNext();
        listener.completed();
        sent = true;
      }
    } finally {
      view.close();
      if (compressedSend != null) {
        compressedSend.close();
      }
      synchronized (this) {
        inFlight--;
        Member m = members.get(t.member());
        if (sent) {
          batchesServed++;
        }
        if (sent && m != null) {
          m.cursor = Math.max(m.cursor, pos + 1);
          m.lastSeen = System.nanoTime();
          if (m.cursor >= m.endPos) {
            remove(m, "finished its " + (m.endPos - m.startPos) / numBatches + " epochs");
          }
        }
        releaseConsumed();
        notifyAll();
      }
    }
  }

  /**
   * Shared-memory read (the {@code prep.next} action): waits until batch {@code (epoch, batch)} is staged and
   * names its /dev/shm file. The member holds that batch until it asks for a later one (or leaves), since
   * it maps the file after this returns.
   */
  ObjectNode next(long memberId, long epoch, long batch, BooleanSupplier cancelled)
      throws InterruptedException {
    if (shmDir == null) {
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + id
          + " does not stage in shared memory; read batches with PREP DoGet tickets").toRuntimeException();
    }
    synchronized (this) {
      Member m = member(memberId);
      long pos = checkedPosition(m, epoch, batch);
      m.waiting++;
      try {
        awaitStaged(m, pos, cancelled);
      } finally {
        m.waiting--;
      }
      VectorSchemaRoot r = staged.get(pos);
      BigIntVector ids = (BigIntVector) r.getVector(PrepSchema.ID);
      BigIntVector labels = (BigIntVector) r.getVector(PrepSchema.LABEL);
      ObjectNode o = JsonNodeFactory.instance.objectNode();
      o.put("v", 1);
      o.put("path", shmPaths.get(pos));
      o.put("rows", r.getRowCount());
      ArrayNode shape = o.putArray("shape");
      for (int s : pipeline.sampleShape()) {
        shape.add(s);
      }
      o.put("dtype", pipeline.dtype().wire());
      ArrayNode idArr = o.putArray("ids");
      ArrayNode labelArr = o.putArray("labels");
      for (int i = 0; i < r.getRowCount(); i++) {
        idArr.add(ids.get(i));
        labelArr.add(labels.isNull(i) ? -1 : labels.get(i));
      }
      String skipped = r.getSchema().getCustomMetadata().get(PrepSchema.SKIPPED);
      if (skipped != null) {
        try {
          o.set("skipped", JSON.readTree(skipped));
        } catch (IOException e) {
          throw new IllegalStateException(e); // written by decode() above
        }
      }
      batchesServed++;
      m.lastSeen = System.nanoTime();
      return o;
    }
  }

  /** Checks a member's request and moves its cursor forward to it (the batch is held until the cursor passes). */
  private long checkedPosition(Member m, long epoch, long batch) {
    if (batch >= numBatches) {
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + id + ": batch " + batch
          + " out of range; an epoch has " + numBatches + " batches").toRuntimeException();
    }
    long pos = epoch * numBatches + batch;
    if (pos < m.startPos) {
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + id + ": member " + m.id + " joined at epoch "
          + m.startPos / numBatches + (m.startPos % numBatches == 0 ? "" : " batch " + m.startPos % numBatches)
          + "; epoch " + epoch + " batch " + batch + " is before it").toRuntimeException();
    }
    if (pos < m.cursor) {
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + id + ": member " + m.id
          + " already read past epoch " + epoch + " batch " + batch + " (members read forward only)")
          .toRuntimeException();
    }
    if (pos >= m.endPos) {
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + id + ": member " + m.id
          + " declared " + (m.endPos - m.startPos) / numBatches + " epochs; epoch " + epoch + " is beyond them")
          .toRuntimeException();
    }
    if (pos > m.cursor) { // skipped ahead, or (shared memory) moved on: its holds on earlier batches end
      m.cursor = pos;
      releaseConsumed();
      notifyAll();
    }
    return pos;
  }

  private void awaitStaged(Member m, long pos, BooleanSupplier cancelled)
      throws InterruptedException {
    long deadline = waitDeadline();
    while (!staged.containsKey(pos)) {
      FlightRuntimeException f = failed.get(pos);
      if (f != null) {
        throw f;
      }
      if (cancelled.getAsBoolean()) {
        throw CallStatus.CANCELLED.withDescription("the call was cancelled").toRuntimeException();
      }
      if (!members.containsKey(m.id)) {
        member(m.id); // throws, naming why
      }
      if (closed) {
        throw CallStatus.UNAVAILABLE.withDescription("prep group " + id + " closed (sidecar stopping)")
            .toRuntimeException();
      }
      checkDeadline(deadline, at(pos) + " to be prepared" + (external ? claimer(pos) : ""));
      m.lastSeen = System.nanoTime();
      wait(10);
    }
  }

  private String claimer(long pos) {
    Claim c = claimedBy.get(pos);
    return c == null ? " (nobody has claimed it)" : " (member " + c.member() + " claimed it)";
  }

  /**
   * External groups (the {@code prep.claim} action): waits until batch {@code (epoch, batch)} is staged
   * ({@code "ready"}: read it with a PREP DoGet) or nobody alive prepares it and it is within the window
   * ({@code "produce"}: this member fetches the returned ids, transforms them and uploads the batch with DoPut).
   * A claimer that is dropped or leaves gives its claim back, so a dead job never blocks the others for longer
   * than the member timeout, and a claim not uploaded within the claim timeout is given back too (its member
   * gets an error if it uploads late).
   */
  ObjectNode claim(long memberId, long epoch, long batch, BooleanSupplier cancelled)
      throws InterruptedException {
    if (!external) {
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + id
          + " is prepared by the sidecar; prep.claim is for groups joined with {\"python\": fingerprint}")
          .toRuntimeException();
    }
    synchronized (this) {
      Member m = member(memberId);
      long pos = checkedPosition(m, epoch, batch);
      long deadline = waitDeadline();
      m.waiting++;
      try {
        while (true) {
          ObjectNode o = JsonNodeFactory.instance.objectNode();
          o.put("v", 1);
          if (staged.containsKey(pos)) {
            return o.put("state", "ready");
          }
          maybeStart(System.nanoTime());
          if (started && !claimedBy.containsKey(pos) && pos < minCursor() + window) {
            claimedBy.put(pos, new Claim(m.id, System.nanoTime()));
            expiredClaims.remove(pos, m.id);
            o.put("state", "produce");
            putIds(o, pos);
            return o;
          }
          checkClaimerStays(m, cancelled);
          checkDeadline(deadline, at(pos) + (!started ? " (the group has not started: group_size not reached)"
              : claimedBy.containsKey(pos) ? claimer(pos) : " to come within the window of the slowest member"));
          m.lastSeen = System.nanoTime();
          wait(10);
        }
      } finally {
        m.waiting--;
      }
    }
  }

  /** The sample ids of batch position {@code pos}, in order, as the {@code "ids"} array of a claim's answer. */
  private void putIds(ObjectNode o, long pos) {
    ArrayNode ids = o.putArray("ids");
    int from = (int) (pos % numBatches) * key.batchSize();
    int to = Math.min(from + key.batchSize(), numSamples);
    int[] order = order(pos / numBatches);
    for (int i = from; i < to; i++) {
      ids.add(order[i]);
    }
  }

  /**
   * DataLoader worker processes of an external group's members ({@code prep.claim} with {@code "next": true}): the
   * lowest batch of {@code epoch}, from the member's cursor on, that nobody has staged or claimed and that lies within
   * the window ({@code "produce"} with its {@code "batch"} and {@code "ids"}). Unlike {@link #claim} it does not move
   * the member's cursor (its main process reads in order), so one member's workers hold several claims at once.
   * {@code "done"}: every batch of the epoch from the cursor on is staged; {@code "wait"}: none was free within
   * {@code waitNanos} (ask again: a claim may still be given back).
   */
  ObjectNode claimNext(long memberId, long epoch, long waitNanos, BooleanSupplier cancelled)
      throws InterruptedException {
    requireExternal("prep.claim");
    synchronized (this) {
      Member m = member(memberId);
      long first = epoch * numBatches;
      long end = Math.min(first + numBatches, m.endPos);
      if (end <= m.startPos) {
        throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + id + ": member " + m.id + " reads epochs "
            + m.startPos / numBatches + " to " + (m.endPos - 1) / numBatches + ", not " + epoch).toRuntimeException();
      }
      long deadline = System.nanoTime() + waitNanos;
      m.waiting++;
      try {
        while (true) {
          long now = System.nanoTime();
          maybeStart(now);
          boolean done = true;
          long limit = Math.min(end, minCursor() + window);
          for (long pos = Math.max(first, m.cursor); pos < end && (done || pos < limit); pos++) {
            if (staged.containsKey(pos)) {
              continue;
            }
            done = false;
            if (started && pos < limit && !claimedBy.containsKey(pos)) {
              claimedBy.put(pos, new Claim(m.id, now));
              expiredClaims.remove(pos, m.id);
              ObjectNode o = JsonNodeFactory.instance.objectNode().put("v", 1).put("state", "produce")
                  .put("epoch", epoch).put("batch", pos - first);
              putIds(o, pos);
              return o;
            }
          }
          if (done || now >= deadline) {
            return JsonNodeFactory.instance.objectNode().put("v", 1).put("state", done ? "done" : "wait");
          }
          checkClaimerStays(m, cancelled);
          m.lastSeen = now;
          wait(10);
        }
      } finally {
        m.waiting--;
      }
    }
  }

  /**
   * A member gives back its claim on batch {@code (epoch, batch)} ({@code prep.release}): its worker process died or
   * its transform raised, so another worker or member makes the batch. False when it held no such claim (expired).
   */
  synchronized boolean release(long memberId, long epoch, long batch, String reason) {
    requireExternal("prep.release");
    Member m = member(memberId);
    long pos = epoch * numBatches + batch;
    Claim c = claimedBy.get(pos);
    if (c == null || c.member() != m.id) {
      return false;
    }
    claimedBy.remove(pos);
    claimsReleased++;
    LOG.info("prep group {}: member {} gave back its claim on epoch {} batch {} ({}); another may make it", id, m.id,
        epoch, batch, reason.isEmpty() ? "no reason given" : reason);
    notifyAll();
    return true;
  }

  private void requireExternal(String action) {
    if (!external) {
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + id + " is prepared by the sidecar; " + action
          + " is for groups joined with {\"python\": fingerprint}").toRuntimeException();
    }
  }

  /** Sets (or clears) the Arrow IPC body compression of the batches {@code member} reads over Flight. */
  void setCompression(long memberId, CompressionUtil.CodecType codec) {
    synchronized (this) {
      member(memberId);
    }
    compressed.setMember(memberId, codec);
  }

  /** A claim that waits ends when its call is cancelled, its member is gone (naming why) or the group closed. */
  private void checkClaimerStays(Member m, BooleanSupplier cancelled) {
    if (cancelled.getAsBoolean()) {
      throw CallStatus.CANCELLED.withDescription("the call was cancelled").toRuntimeException();
    }
    if (!members.containsKey(m.id)) {
      member(m.id);
    }
    if (closed) {
      throw CallStatus.UNAVAILABLE.withDescription("prep group " + id + " closed").toRuntimeException();
    }
  }

  /** Stages a batch a member prepared (DoPut): its ids must be the claimed batch's, its size within staging. */
  void upload(long memberId, long epoch, long batch, VectorSchemaRoot in, BooleanSupplier cancelled)
      throws InterruptedException {
    long pos = epoch * numBatches + batch;
    long bytes = 0;
    for (FieldVector v : in.getFieldVectors()) {
      bytes += v.getBufferSize();
    }
    synchronized (this) {
      Member m = member(memberId);
      Claim claim = claimedBy.get(pos);
      if (claim == null || claim.member() != m.id) {
        Long expired = expiredClaims.get(pos);
        if (expired != null && expired == m.id) {
          throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + id + ": member " + m.id + "'s claim on"
              + " epoch " + epoch + " batch " + batch + " expired: it was not uploaded within "
              + seconds(limits.claimTimeoutNanos()) + " s (--prep-claim-timeout), so the batch went back to"
              + " the group; ask prep.claim again").toRuntimeException();
        }
        throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + id + ": member " + m.id
            + " did not claim epoch " + epoch + " batch " + batch + " (prep.claim first)").toRuntimeException();
      }
      int from = (int) batch * key.batchSize();
      int to = Math.min(from + key.batchSize(), numSamples);
      int[] order = order(epoch);
      FieldVector idv = in.getVector(PrepSchema.ID);
      boolean idsOk = idv instanceof BigIntVector && in.getRowCount() == to - from;
      for (int i = 0; idsOk && i < to - from; i++) {
        idsOk = ((BigIntVector) idv).get(i) == order[from + i];
      }
      if (!idsOk) {
        throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + id + ": the uploaded batch's \"id\""
            + " column (int64) must be the claimed ids, in order (" + (to - from) + " rows)").toRuntimeException();
      }
      if (bytes > stagingLimit) {
        throw CallStatus.RESOURCE_EXHAUSTED.withDescription("prep group " + id + ": an uploaded batch of " + bytes
            + " bytes exceeds staging_bytes " + stagingLimit).toRuntimeException();
      }
      long deadline = waitDeadline();
      while (alloc.getAllocatedMemory() + bytes > stagingLimit) { // bounded staging: wait for readers to free
        if (cancelled.getAsBoolean() || closed) {
          throw CallStatus.CANCELLED.withDescription("upload cancelled").toRuntimeException();
        }
        checkDeadline(deadline, "staging room for " + at(pos) + " (staging_bytes " + stagingLimit + ")");
        m.lastSeen = System.nanoTime();
        claimedBy.put(pos, new Claim(m.id, m.lastSeen)); // it has come back: the upload, not the claim, waits
        wait(10);
      }
      claimedBy.remove(pos);
      producedBy.merge(m.id, 1L, Long::sum);
      adoptUpload(in, pos, epoch);
    }
  }

  /**
   * Takes an uploaded batch's buffers (a member's or a remote worker's, its claim already checked and removed)
   * into this group's staging at {@code pos}, counts it, and wakes the readers. Caller holds the lock.
   */
  private void adoptUpload(VectorSchemaRoot in, long pos, long epoch) {
    VectorSchemaRoot copy = VectorSchemaRoot.create(in.getSchema(), alloc);
    for (int i = 0; i < in.getFieldVectors().size(); i++) {
      in.getVector(i).makeTransferPair(copy.getVector(i)).transfer();
    }
    copy.setRowCount(in.getRowCount());
    if (shmDir != null) {
      try {
        toSharedMemory(copy, pos);
      } catch (IOException | RuntimeException e) { // /dev/shm full: this sidecar prepares it (and reports why)
        copy.close();
        returned.add(pos);
        notifyAll();
        LOG.warn("prep group {}: epoch {} batch {} from a remote prep worker could not be staged in shared memory ({});"
            + " preparing it here", id, epoch, pos % numBatches, e.toString());
        return;
      }
    }
    batchesPrepared++;
    samplesPrepared += copy.getRowCount();
    countPrepared(epoch);
    if (pos < minCursor()) {
      copy.close();
    } else {
      staged.put(pos, copy);
      stagedPeak = Math.max(stagedPeak, staged.size());
    }
    notifyAll();
  }

  /**
   * Moves an uploaded batch's tensor column into a /dev/shm file, as {@link #prepare} makes the batches prepared
   * here: members on this host map every staged batch, whoever prepared it.
   */
  private void toSharedMemory(VectorSchemaRoot r, long pos) throws IOException {
    FixedSizeBinaryVector tensor = (FixedSizeBinaryVector) r.getVector(PrepSchema.TENSOR);
    int n = r.getRowCount();
    long bytes = (long) n * pipeline.sampleBytes();
    ShmBuffer shm = ShmBuffer.create(shmDir.resolve(id + "-" + pos), bytes, false);
    try (ArrowBuf data = alloc.wrapForeignAllocation(shm);
        ArrowBuf validity = alloc.buffer(Math.max(8, (n + 7) / 8))) {
      data.setBytes(0, tensor.getDataBuffer(), 0, bytes);
      validity.setZero(0, validity.capacity());
      validity.setBytes(0, tensor.getValidityBuffer(), 0, (n + 7) / 8);
      tensor.loadFieldBuffers(new ArrowFieldNode(n, tensor.getNullCount()), List.of(validity, data));
    }
    shmPaths.put(pos, shm.path().toString());
  }

  /** A root over the same buffers (reference counted): members are sent one staged batch without copies. */
  private VectorSchemaRoot share(VectorSchemaRoot src) {
    VectorSchemaRoot view = VectorSchemaRoot.create(src.getSchema(), alloc);
    try (ArrowRecordBatch rb = new VectorUnloader(src).getRecordBatch()) {
      new VectorLoader(view).load(rb);
    }
    return view;
  }

  // -- stats ----------------------------------------------------------------------------------------------

  synchronized ObjectNode statsJson() {
    ObjectNode o = JsonNodeFactory.instance.objectNode();
    o.put("dataset", key.dataset());
    o.put("fingerprint", key.fingerprint());
    o.put("prep", pipeline != null ? "sidecar" : external ? "members" : "none");
    o.put("seed", key.seed());
    o.put("batch_size", key.batchSize());
    o.put("shuffle", key.shuffle());
    o.put("drop_last", key.dropLast());
    o.put("num_batches", numBatches);
    o.put("state", closed ? "closed" : started ? "running" : "waiting");
    o.put("group_size", settings.groupSize());
    o.put("window", window);
    o.put("staging_limit_bytes", stagingLimit);
    o.put("staging_allocated_bytes", closed ? 0 : alloc.getAllocatedMemory());
    o.put("staging_peak_bytes", alloc.getPeakMemoryAllocation());
    o.put("staged_batches", staged.size());
    o.put("staged_batches_peak", stagedPeak);
    o.put("batches_prepared", batchesPrepared);
    o.put("samples_prepared", samplesPrepared);
    if (pipeline != null) {
      o.put("on_error", pipeline.decode().onError().wire());
      o.put("samples_skipped", samplesSkipped);
      ArrayNode sk = o.putArray("skipped");
      skippedRecent.forEach(sk::add);
    }
    o.put("batches_served", batchesServed);
    o.put("prep_seconds", prepNanos / 1e9); // wall time of fetch + decode + augment, summed over batches
    o.put("fetch_seconds", fetchNanos.get() / 1e9); // of which: assembling the raw batch (cache or storage)
    o.put("decode_cpu_seconds", prepCpuNanos.get() / 1e9); // CPU time of decode + augment on the prep threads
    o.put("threads", threads);
    compressed.stats(o);
    if (external) {
      o.put("claims_expired", claimsExpired);
      o.put("claims_released", claimsReleased);
    }
    ObjectNode per = o.putObject("batches_prepared_per_epoch");
    preparedPerEpoch.forEach((e, c) -> per.put(Long.toString(e), c));
    ArrayNode ms = o.putArray("members");
    for (Member m : members.values()) {
      ObjectNode mo = ms.addObject();
      mo.put("member", m.id);
      mo.put("name", m.name);
      mo.put("start_epoch", m.startPos / numBatches);
      mo.put("start_batch", m.startPos % numBatches);
      mo.put("epoch", m.cursor / numBatches);
      mo.put("batch", m.cursor % numBatches);
    }
    ArrayNode ds = o.putArray("dropped");
    dropped.forEach(ds::add);
    o.put("left", left);
    if (pipeline != null && !replica) {
      ObjectNode pw = o.putObject("batches_prepared_by");
      preparedBy.forEach(pw::put);
      ArrayNode ws = o.putArray("workers");
      for (Worker w : workers.values()) {
        ws.addObject().put("worker", w.id).put("name", w.name)
            .put("claims", workerClaims.values().stream().filter(c -> c.member() == w.id).count());
      }
      o.put("worker_claims_expired", workerClaimsExpired);
    }
    if (external) {
      ObjectNode pb = o.putObject("batches_uploaded_by_member");
      producedBy.forEach((mem, c) -> pb.put(Long.toString(mem), c));
    }
    return o;
  }
}
