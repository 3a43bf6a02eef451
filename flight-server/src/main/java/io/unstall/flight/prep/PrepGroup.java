package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.protocol.PrepRates;
import java.nio.file.Path;
import java.util.BitSet;
import org.apache.arrow.flight.CallStatus;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.VectorSchemaRoot;

/**
 * One coordinated-prep group: the jobs that declared the same dataset, pipeline, seed, batch size, shuffle and
 * drop_last. Batch positions run over epochs ({@code pos = epoch * numBatches + batch}); each is made once and
 * served to every member. This class makes its parts, answers joins, heartbeats and leaves, frees what members are
 * past or left behind, and reports stats; the parts:
 * <ul>
 *   <li>{@link Membership}: members, cursors, the join barrier, late joiners, resumed members, dropping the silent;
 *   <li>{@link Serving}: the members' requests for batches (PREP DoGet, {@code prep.next}, claims, uploads);
 *   <li>{@link Staging}: the bounded staging allocator, the staged batches until the last reader is past them, and
 *       their /dev/shm files;
 *   <li>{@link Production}: which position is made next (within the window ahead of the slowest member and within
 *       staging memory) and the producer threads;
 *   <li>a {@link BatchSource} per mode: {@link RawBatches}, {@link SidecarPrep} or {@link MemberUploads};
 *   <li>{@link RemoteWorkers}: other sidecars preparing some positions of a sidecar-prep group;
 *   <li>{@link Autotuner}: the window and decode threads, tuned from the measured rates;
 *   <li>{@link PrepCounts}: what stats report.
 * </ul>
 * All of them share one monitor, the group's {@link GroupLock} (which also states the lock order). Members that
 * neither wait in a call nor heartbeat for {@code memberTimeout} are dropped, so a dead job stalls the others for at
 * most that long.
 */
final class PrepGroup {
  /** Ids, labels, validity bits per row, on top of the tensor (a generous bound, as StreamBudget's). */
  static final long ROW_OVERHEAD = 512;
  /** Minimum allocations of a batch's small vectors (keys, ids, labels, validity), whatever its rows. */
  static final long BATCH_OVERHEAD = 256 << 10;

  /** {@code cacheWindow}: a cache-first order's window ({@link BatchOrder#cacheFirst}); 0: the seeded order. */
  record Key(String dataset, String fingerprint, long seed, int batchSize, boolean shuffle, boolean dropLast,
      int cacheWindow) {
    Key(String dataset, String fingerprint, long seed, int batchSize, boolean shuffle, boolean dropLast) {
      this(dataset, fingerprint, seed, batchSize, shuffle, dropLast, 0);
    }
  }

  /**
   * The group's settings, fixed by the first joiner. {@code autotune}: tune threads and (unless {@code windowGiven})
   * the window online ({@link Autotuner}); off, both stay as given.
   */
  record Settings(int window, long stagingBytes, long memberTimeoutNanos, int groupSize, long joinTimeoutNanos,
      boolean shm, boolean autotune, boolean windowGiven) {
    boolean tunesWindow() {
      return autotune && !windowGiven;
    }

    Settings withShm(boolean on) {
      return new Settings(window, stagingBytes, memberTimeoutNanos, groupSize, joinTimeoutNanos, on, autotune,
          windowGiven);
    }
  }

  /**
   * The sidecar's bounds on a group: how long a member may hold a claim ({@code --prep-claim-timeout}), how long
   * a call waits for a batch, a claim or staging room ({@code --wait-timeout}), how many epochs' counts are kept
   * ({@code --stats-epochs}).
   */
  record Limits(long claimTimeoutNanos, long waitTimeoutNanos, int statsEpochs) {
    /** The deadline of a wait that starts now ({@code --wait-timeout}). */
    long deadline() {
      return System.nanoTime() + waitTimeoutNanos;
    }

    /** A wait past its deadline: TIMED_OUT, naming what it waited for. */
    void check(long deadline, String group, String waitedFor) {
      if (System.nanoTime() - deadline > 0) {
        throw CallStatus.TIMED_OUT.withDescription("prep group " + group + ": gave up after "
            + seconds(waitTimeoutNanos) + " s waiting for " + waitedFor + " (--wait-timeout)").toRuntimeException();
      }
    }
  }

  final String id;
  final Key key;
  private final BatchOrder order;
  private final Settings settings;
  private final Limits limits;
  private final GroupLock lock = new GroupLock();
  private final PrepCounts counts;
  private final Membership members;
  private final BatchSource source;
  private final MemberUploads uploads; // the source of an external group; null when the sidecar makes the batches
  private final Staging staging;
  private final Production production;
  private final RemoteWorkers workers;
  private final Autotuner tuner;
  private final CompressedBatches compressed; // LZ4/ZSTD copies of staged batches for members that asked
  private final Serving serving;
  private final int threads;

  /**
   * {@code pipeline}: the sidecar's pipeline, or null for a raw group or (fingerprint {@code python:...}) a group
   * whose members upload their batches. The parts are made in the order they need each other; only the producer
   * threads and the remote workers' claims (which production counts) meet after construction. {@code world}: the
   * first joiner's world size if it is a data-parallel rank (1 if not), which default staging is sized for.
   * {@code cpuLoad}: a hybrid group's share of each batch the sidecar prepares (negative: tuned), else null.
   */
  PrepGroup(String id, Key key, Dataset dataset, PrepPipeline pipeline, PrepResources shared, Settings requested,
      int world, Double cpuLoad) {
    this.id = id;
    this.key = key;
    this.limits = shared.limits();
    this.threads = shared.threads();
    BufferAllocator parent = shared.allocator();
    this.order = new BatchOrder(id, key, dataset, () -> shared.assembler().cached(dataset));
    this.counts = new PrepCounts(limits.statsEpochs());
    this.members = new Membership(order, requested, lock,
        pipeline == null ? "" : ", JPEGs prepared by " + ImagePrep.describeDecoder(pipeline));
    // null: an external group, whose source (member uploads) needs its staging
    BatchSource made = key.fingerprint().startsWith(PrepService.EXTERNAL_PREFIX) ? null
        : pipeline == null ? shared.rawBatches(order, counts)
        : cpuLoad != null ? shared.hybridPrep(order, pipeline, cpuLoad, counts, lock)
        : shared.sidecarPrep(order, pipeline, counts, lock);
    Staging.Size size = made == null ? Staging.forUploads(requested, parent.getLimit())
        : Staging.size(made, requested, parent.getLimit(), key.batchSize(), world);
    long slotBytes = made == null ? 0 : made.slotBytes();
    // a slot file is at most 2 GiB (ShmBuffer): a group whose batch needs more is read over Flight
    Path dir = requested.shm() && slotBytes > 0 && slotBytes <= Integer.MAX_VALUE ? Staging.sharedMemory(id) : null;
    ShmSlots.Files shm = dir == null ? null : new ShmSlots.Files(dir, shared.slotPool(), slotBytes);
    shared.slotPool().keepOnly(shm == null ? 0 : shm.slotBytes());
    this.settings = new Settings(size.window(), size.limit(), requested.memberTimeoutNanos(), requested.groupSize(),
        requested.joinTimeoutNanos(), shm != null, requested.autotune(), requested.windowGiven());
    this.compressed = new CompressedBatches(id, parent, size.limit());
    this.staging = new Staging(id, "prep-group-" + id, parent, size, shm, lock, compressed);
    this.uploads = made == null ? new MemberUploads(order, members, staging, counts, limits, lock) : null;
    this.source = made == null ? uploads : made;
    this.production = new Production(order, members, staging, source, counts, lock, this::remoteClaims,
        System::nanoTime);
    this.workers = new RemoteWorkers(order, source, members, staging, production, counts, limits,
        requested.memberTimeoutNanos(), lock);
    this.tuner = new Autotuner(requested.tunesWindow(), requested.autotune(), threads, staging, source, counts,
        members::maxWorld);
    if (source instanceof SidecarPrep sp) {
      sp.consumption(tuner::consumerCapacity);
    }
    this.serving = new Serving(order, members, staging, source, uploads, compressed, tuner, counts, limits, lock,
        this::release, this::afterRemoval);
    production.start();
  }

  /** Positions remote workers are preparing now (production's threads ask, holding the lock). */
  private int remoteClaims() {
    return workers.claims();
  }

  Settings settings() {
    return settings;
  }

  /** The members' requests for batches: PREP DoGet, {@code prep.next}, claims and uploads. */
  Serving serving() {
    return serving;
  }

  int numBatches() {
    return order.numBatches;
  }

  Dataset dataset() {
    return order.dataset;
  }

  /** Whether remote prep workers may enlist: an open group this sidecar prepares itself (not raw or external). */
  boolean takesWorkers() {
    synchronized (lock) {
      return workers.accepting();
    }
  }

  boolean isClosed() {
    synchronized (lock) {
      return members.closed();
    }
  }

  // -- membership ---------------------------------------------------------------------------------------

  /**
   * Adds a member; null when the group has just closed (the caller makes a new one). {@code startEpoch} >= 0: a
   * resumed member (a job restored from a checkpoint) that starts at batch {@code startBatch} of that epoch; the
   * group never prepares the batches before it for this member. {@code epochs} counts from {@code startEpoch},
   * the partial first epoch included. {@code share}: a data-parallel rank's share of each epoch (null: all);
   * RESOURCE_EXHAUSTED when staging cannot hold a step of its job's ranks.
   */
  ObjectNode join(long memberId, String name, long epochs, long startEpoch, long startBatch, RankShare.Spec share) {
    return join(memberId, name, epochs, startEpoch, startBatch, share, null);
  }

  /**
   * {@link #join}, for a resumed member of a cache-first group that carries the snapshot ({@code cacheSnapshot},
   * as {@link BatchOrder#encode} writes it) its epoch {@code startEpoch} was ordered from: fixed for that epoch
   * unless the group fixed another (refused, naming both).
   */
  ObjectNode join(long memberId, String name, long epochs, long startEpoch, long startBatch, RankShare.Spec share,
      String cacheSnapshot) {
    synchronized (lock) {
      if (cacheSnapshot != null && !members.closed()) {
        order.pin(startEpoch, order.decode(cacheSnapshot, "prep.join"));
      }
      if (share != null) {
        staging.checkHoldsStep(share.world(), source, key.batchSize());
      }
      Membership.Member m = members.join(memberId, name, epochs, startEpoch, startBatch,
          share == null ? null : share.of(order.numBatches, startEpoch));
      if (m == null) {
        return null;
      }
      if (!members.isMember(memberId)) { // its share had nothing left: gone at once, and the group if it was alone
        afterRemoval(memberId, members.closeIfNobody());
      }
      ObjectNode o = JsonNodeFactory.instance.objectNode();
      o.put("v", 1);
      o.put("group", id);
      o.put("member", memberId);
      o.put("start_epoch", m.startPos / order.numBatches);
      o.put("start_batch", m.startPos % order.numBatches);
      o.put("num_batches", order.numBatches);
      o.put("num_samples", order.numSamples);
      o.put("batch_size", key.batchSize());
      o.put("fingerprint", key.fingerprint());
      o.put("order_window", key.cacheWindow());
      source.describe(o);
      o.put("window", staging.window());
      o.put("staging_limit_bytes", staging.limit());
      o.put("member_timeout_s", settings.memberTimeoutNanos() / 1e9);
      o.put("group_size", settings.groupSize());
      o.put("shm", staging.shm());
      return o;
    }
  }

  void heartbeat(long memberId) {
    synchronized (lock) {
      members.member(memberId).lastSeen = System.nanoTime();
    }
  }

  /** A hybrid member's measured rates, for the split ({@link Autotuner#report}); a stranger's are ignored. */
  void rates(long memberId, PrepRates rates) {
    synchronized (lock) {
      if (members.isMember(memberId)) {
        tuner.report(memberId, rates.decodePerSample(), rates.step(), System.nanoTime());
      }
    }
  }

  void leave(long memberId) {
    synchronized (lock) {
      boolean closed = members.leave(memberId);
      afterRemoval(memberId, closed);
    }
  }

  /**
   * Drops members that neither wait in a call nor heartbeat; opens the join barrier on its timeout; gives back
   * claims held past the claim timeout (a member whose transform raised may live on, heartbeating).
   */
  void reap(long now) {
    synchronized (lock) {
      if (members.closed()) {
        return;
      }
      members.maybeStart(now);
      tuner.tick(now);
      if (uploads != null) {
        uploads.reap(now);
      }
      workers.reap(now);
      for (Membership.Member m : members.dropSilent(now)) {
        afterRemoval(m.id, members.closeIfEmpty());
      }
    }
  }

  /**
   * After member {@code memberId} went: frees what nobody reads any more, gives its claims back and, if it was the
   * last, frees staging of a group without producer threads (those free it on their way out). Caller holds the lock.
   */
  private void afterRemoval(long memberId, boolean closedGroup) {
    staging.memberGone(memberId);
    release();
    compressed.removeMember(memberId);
    if (uploads != null) {
      uploads.memberGone(memberId);
    }
    if (closedGroup && !production.runsThreads()) {
      Thread t = new Thread(staging::free, "unstall-prep-free-" + id);
      t.setDaemon(true);
      t.start();
    }
    lock.changed();
  }

  /** Frees every staged batch all members are past, and what is remembered about those positions. */
  private void release() {
    long min = members.minCursor();
    order.forgetBefore(min / order.numBatches);
    staging.release(min);
    compressed.freeBelow(min);
    if (uploads != null) {
      uploads.release(min);
    }
    workers.release(min);
  }

  /**
   * A cache-first group's order of {@code epoch} for member {@code memberId} ({@code prep.order}): its window, and
   * the snapshot it is computed from (taken now if the epoch's order was not needed yet), which a resumed member
   * carries back on its join.
   */
  ObjectNode cacheOrder(long memberId, long epoch) {
    synchronized (lock) {
      members.member(memberId);
      if (key.cacheWindow() == 0) {
        throw new IllegalArgumentException("prep.order: prep group " + id + " reads the seeded order (joined"
            + " without \"order\": {\"cache_first\": window})");
      }
      BitSet snapshot = order.snapshot(epoch);
      ObjectNode o = JsonNodeFactory.instance.objectNode();
      o.put("v", 1);
      o.put("group", id);
      o.put("epoch", epoch);
      o.put("window", key.cacheWindow());
      o.put("samples", order.numSamples);
      o.put("cached", snapshot.cardinality());
      o.put("digest", order.digest(snapshot));
      o.put("cache_snapshot", order.encode(snapshot));
      return o;
    }
  }

  // -- remote prep workers (docs/ARCHITECTURE.md, "Across nodes": remote prep workers) ------------------------

  ObjectNode enlist(long workerId, String name) {
    synchronized (lock) {
      return workers.enlist(workerId, name);
    }
  }

  RemoteWorkers.Turn workerClaim(long workerId, long waitNanos) throws InterruptedException {
    synchronized (lock) {
      return workers.claim(workerId, waitNanos);
    }
  }

  void workerUpload(long workerId, long epoch, long batch, VectorSchemaRoot in) {
    synchronized (lock) {
      workers.upload(workerId, epoch, batch, in);
    }
  }

  void workerRelease(long workerId, long epoch, long batch, String why) {
    synchronized (lock) {
      workers.release(workerId, epoch, batch, why);
    }
  }

  void workerLeave(long workerId) {
    synchronized (lock) {
      workers.leave(workerId);
    }
  }

  /** Stops the producers (sidecar shutdown) and waits until staging is freed. */
  void close() throws InterruptedException {
    synchronized (lock) {
      members.close();
    }
    production.join();
    if (!production.runsThreads()) {
      staging.free();
    }
  }

  /** Seconds for a message: "120", or "0.3" for a bound under a second (tests). */
  static String seconds(long nanos) {
    return nanos % 1_000_000_000L == 0 ? Long.toString(nanos / 1_000_000_000L) : String.format("%.1f", nanos / 1e9);
  }

  // -- stats ----------------------------------------------------------------------------------------------

  ObjectNode statsJson() {
    synchronized (lock) {
      ObjectNode o = JsonNodeFactory.instance.objectNode();
      o.put("dataset", key.dataset());
      o.put("fingerprint", key.fingerprint());
      o.put("prep", source.mode());
      o.put("seed", key.seed());
      o.put("batch_size", key.batchSize());
      o.put("shuffle", key.shuffle());
      o.put("drop_last", key.dropLast());
      o.put("order", key.cacheWindow() > 0 ? "cache_first" : "seeded");
      o.put("order_window", key.cacheWindow());
      o.put("num_batches", order.numBatches);
      o.put("state", members.closed() ? "closed" : members.started() ? "running" : "waiting");
      o.put("group_size", settings.groupSize());
      staging.stats(o, members.closed());
      o.put("window", tuner.maxWindowUsed()); // the largest window used: staged_batches_peak stays within it
      counts.statsCounts(o);
      source.stats(o);
      counts.statsTimes(o);
      o.put("threads", threads);
      counts.statsPerEpoch(o);
      members.stats(o);
      workers.stats(o);
      tuner.stats(o);
      compressed.stats(o);
      return o;
    }
  }
}
