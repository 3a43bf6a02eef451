package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.arrow.flight.CallStatus;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Remote prep workers of a sidecar-prep group (docs/ARCHITECTURE.md, "Across nodes"): other sidecars that enlist,
 * claim positions from {@link Production} as a local producer would take them, prepare them with a
 * {@link PrepReplica} and upload them. A worker's upload is accepted once, only while its claim is live; a claim not
 * uploaded within {@code --prep-claim-timeout}, or of a worker that leaves, fails or goes silent, goes back to
 * production and is prepared again. A contributor to {@link SidecarPrep}: other groups refuse to enlist workers.
 * Guarded by the group lock.
 */
final class RemoteWorkers {
  private static final Logger LOG = LoggerFactory.getLogger(RemoteWorkers.class);

  /** What a worker's claim asks of it: prepare {@code (epoch, batch)}, or wait, or stop (group closed). */
  record Turn(String state, long epoch, long batch) {}

  private record Claim(long worker, long since) {}

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

  private final BatchOrder order;
  private final BatchSource source; // null: the group takes no workers (raw or member-upload groups)
  private final Membership members;
  private final Staging staging;
  private final Production production;
  private final PrepCounts counts;
  private final PrepGroup.Limits limits;
  private final long memberTimeoutNanos;
  private final GroupLock lock;
  private final Map<Long, Worker> workers = new LinkedHashMap<>(); // enlisted now
  private final Map<Long, Claim> claims = new HashMap<>(); // position -> the worker preparing it
  private final Map<Long, Long> expiredClaims = new HashMap<>(); // position -> the worker whose claim expired
  private long claimsExpired;

  RemoteWorkers(BatchOrder order, BatchSource source, Membership members, Staging staging, Production production,
      PrepCounts counts, PrepGroup.Limits limits, long memberTimeoutNanos, GroupLock lock) {
    this.order = order;
    // workers run the sidecar's pipeline, over the seeded order only (a cache-first order needs this cache's snapshot)
    this.source = source.pipeline() == null || order.key.cacheWindow() > 0 ? null : source;
    this.members = members;
    this.staging = staging;
    this.production = production;
    this.counts = counts;
    this.limits = limits;
    this.memberTimeoutNanos = memberTimeoutNanos;
    this.lock = lock;
  }

  /** Whether workers may enlist: an open group this sidecar prepares. Caller holds the lock. */
  boolean accepting() {
    return source != null && !members.closed();
  }

  /** Positions workers are preparing now. Caller holds the lock. */
  int claims() {
    return claims.size();
  }

  /** What a worker needs to prepare this group's batches exactly as this sidecar would. Caller holds the lock. */
  ObjectNode enlist(long workerId, String name) {
    if (source == null) {
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + order.group + (order.key.cacheWindow() > 0
          ? " reads a cache_first order, computed from this sidecar's cache: remote prep workers prepare the seeded"
          + " order only" : " is not prepared by its sidecar (raw or external group): remote prep workers run a"
          + " sidecar pipeline")).toRuntimeException();
    }
    if (members.closed()) {
      throw CallStatus.NOT_FOUND.withDescription("prep group " + order.group + " closed").toRuntimeException();
    }
    workers.put(workerId, new Worker(workerId, name, System.nanoTime()));
    LOG.info("prep group {}: remote prep worker {} ({}) enlisted", order.group, workerId, name);
    PrepGroup.Key key = order.key;
    ObjectNode o = JsonNodeFactory.instance.objectNode();
    o.put("v", 1);
    o.put("group", order.group);
    o.put("worker", workerId);
    o.put("dataset", key.dataset());
    o.put("num_samples", order.numSamples);
    o.set("pipeline", source.pipeline().canonical());
    o.put("fingerprint", key.fingerprint());
    o.put("seed", key.seed());
    o.put("batch_size", key.batchSize());
    o.put("shuffle", key.shuffle());
    o.put("drop_last", key.dropLast());
    o.put("num_batches", order.numBatches);
    return o;
  }

  private Worker worker(long workerId) {
    Worker w = workers.get(workerId);
    if (w == null) {
      throw CallStatus.NOT_FOUND.withDescription("prep group " + order.group + ": remote prep worker " + workerId
          + " is not enlisted (it left, was dropped, or never enlisted)").toRuntimeException();
    }
    w.lastSeen = System.nanoTime();
    return w;
  }

  /**
   * A worker asks for a batch to prepare: waits up to {@code waitNanos} for a position (one given back first, then
   * the next within the window and staging, as a local producer would take it). Caller holds the lock.
   */
  Turn claim(long workerId, long waitNanos) throws InterruptedException {
    long deadline = System.nanoTime() + waitNanos;
    while (true) {
      if (members.closed()) {
        return new Turn("closed", 0, 0);
      }
      Worker w = worker(workerId);
      members.maybeStart(System.nanoTime());
      if (members.running() && production.roomFor(0, claims.size() + 1)) {
        long pos = production.take();
        if (pos >= 0) {
          claims.put(pos, new Claim(w.id, System.nanoTime()));
          expiredClaims.remove(pos, w.id);
          lock.changed();
          return new Turn("produce", pos / order.numBatches, pos % order.numBatches);
        }
      }
      long left = deadline - System.nanoTime();
      if (left <= 0) {
        return new Turn("wait", 0, 0);
      }
      lock.await(Math.max(1, Math.min(10, left / 1_000_000)));
    }
  }

  /**
   * Stages a batch a worker prepared: accepted once, only from the worker whose claim is live; its ids must be the
   * batch's and its schema this group's (shape, dtype, fingerprint). A late upload is refused. Caller holds the lock.
   */
  void upload(long workerId, long epoch, long batch, VectorSchemaRoot in) {
    long pos = order.pos(epoch, batch);
    String group = order.group;
    if (members.closed()) {
      throw CallStatus.NOT_FOUND.withDescription("prep group " + group + " closed").toRuntimeException();
    }
    Worker w = worker(workerId);
    Claim claim = claims.get(pos);
    if (claim == null || claim.worker() != w.id) {
      Long expired = expiredClaims.get(pos);
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + group + ": remote prep worker " + w.id
          + (expired != null && expired == w.id
              ? "'s claim on epoch " + epoch + " batch " + batch + " expired: it was not uploaded within "
                  + PrepGroup.seconds(limits.claimTimeoutNanos()) + " s (--prep-claim-timeout) and was prepared again"
              : " holds no claim on epoch " + epoch + " batch " + batch)).toRuntimeException();
    }
    Map<String, String> meta = in.getSchema().getCustomMetadata();
    if (meta == null || !order.key.fingerprint().equals(meta.get(PrepSchema.FINGERPRINT))
        || !in.getSchema().getFields().equals(source.schema().getFields())) {
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + group + ": the uploaded batch's schema is not"
          + " the group's prepared-batch schema (pipeline " + order.key.fingerprint() + ")").toRuntimeException();
    }
    int[] ids = order.ids(pos);
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
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + group + ": the uploaded batch's \"id\" column"
          + " is not epoch " + epoch + " batch " + batch + "'s ids in order (is the dataset registered differently"
          + " on the worker?)").toRuntimeException();
    }
    claims.remove(pos);
    counts.preparedBy.merge("worker " + w.id + " (" + w.name + ")", 1L, Long::sum);
    int rows = staging.adopt(in, pos, members.minCursor(), (int) source.pipeline().sampleBytes());
    if (rows < 0) { // /dev/shm full: this sidecar prepares it (and reports why)
      LOG.warn("prep group {}: {} from remote prep worker {} is prepared here", group, order.at(pos), w.id);
      production.giveBack(pos);
      return;
    }
    counts.prepared(epoch, rows);
  }

  /** A worker gives a claim back (its prepare failed): this sidecar prepares the batch. Caller holds the lock. */
  void release(long workerId, long epoch, long batch, String why) {
    long pos = order.pos(epoch, batch);
    Worker w = worker(workerId);
    Claim c = claims.get(pos);
    if (c != null && c.worker() == w.id) {
      claims.remove(pos);
      production.giveBack(pos);
      LOG.info("prep group {}: remote prep worker {} gave back epoch {} batch {}: {}", order.group, w.id, epoch, batch,
          why);
    }
  }

  /** Caller holds the lock. */
  void leave(long workerId) {
    if (workers.containsKey(workerId)) {
      remove(workerId);
      LOG.info("prep group {}: remote prep worker {} left", order.group, workerId);
    }
  }

  /** Removes a worker; its claims go back and are prepared again (an upload after that is refused). */
  private void remove(long workerId) {
    workers.remove(workerId);
    for (var it = claims.entrySet().iterator(); it.hasNext(); ) {
      var e = it.next();
      if (e.getValue().worker() == workerId) {
        it.remove();
        production.giveBack(e.getKey());
      }
    }
    lock.changed();
  }

  /**
   * Gives back claims held past the claim timeout; drops workers silent for the member timeout. Caller holds the
   * lock.
   */
  void reap(long now) {
    for (var it = claims.entrySet().iterator(); it.hasNext(); ) {
      var e = it.next();
      if (now - e.getValue().since() > limits.claimTimeoutNanos()) {
        long pos = e.getKey();
        it.remove();
        expiredClaims.put(pos, e.getValue().worker());
        production.giveBack(pos);
        claimsExpired++;
        LOG.warn("prep group {}: remote prep worker {} did not upload epoch {} batch {} within {} s of claiming it"
            + " (--prep-claim-timeout); it is prepared again", order.group, e.getValue().worker(),
            pos / order.numBatches, pos % order.numBatches, PrepGroup.seconds(limits.claimTimeoutNanos()));
      }
    }
    for (Worker w : List.copyOf(workers.values())) {
      if (now - w.lastSeen > memberTimeoutNanos && claims.values().stream().noneMatch(c -> c.worker() == w.id)) {
        LOG.warn("prep group {}: remote prep worker {} ({}) silent for {} s; dropped", order.group, w.id, w.name,
            String.format("%.1f", (now - w.lastSeen) / 1e9));
        remove(w.id);
      }
    }
  }

  /** Forgets expired claims every member is past. Caller holds the lock. */
  void release(long minCursor) {
    expiredClaims.keySet().removeIf(p -> p < minCursor);
  }

  /** Caller holds the lock; only for sidecar-prep groups. */
  void stats(ObjectNode o) {
    if (order.key.cacheWindow() > 0) {
      o.put("remote_workers", "refused: a cache_first order is computed from this sidecar's cache");
    }
    if (source == null) {
      return;
    }
    ObjectNode pw = o.putObject("batches_prepared_by");
    counts.preparedBy.forEach(pw::put);
    ArrayNode ws = o.putArray("workers");
    for (Worker w : workers.values()) {
      ws.addObject().put("worker", w.id).put("name", w.name)
          .put("claims", claims.values().stream().filter(c -> c.worker() == w.id).count());
    }
    o.put("worker_claims_expired", claimsExpired);
  }
}
