package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.protocol.BatchSchema;
import java.util.HashMap;
import java.util.Map;
import java.util.function.BooleanSupplier;
import org.apache.arrow.flight.CallStatus;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.types.pojo.Schema;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The member-upload source (a group joined with {@code {"python": fingerprint}}): members transform batches with
 * their own code. A member asks for a position ({@code prep.claim}); if nobody alive makes it and it is within the
 * window's span and what staging holds ({@link #claimEnd}), the member gets its ids, makes it and uploads it
 * (DoPut), and the batch is staged for all. Claims of members that go, and claims held past {@code
 * --prep-claim-timeout}, go back to the group. No producer thread: uploads wait for room in staging instead.
 * Guarded by the group lock.
 */
final class MemberUploads implements BatchSource {
  private static final Logger LOG = LoggerFactory.getLogger(MemberUploads.class);

  /** A member's claim on a position: who makes the batch, since when. */
  private record Claim(long member, long since) {}

  private final BatchOrder order;
  private final Membership members;
  private final PrepCounts counts;
  private final PrepGroup.Limits limits;
  private final GroupLock lock;
  private final Staging staging;
  private final Map<Long, Claim> claimedBy = new HashMap<>(); // position -> the member making it
  private final Map<Long, Long> expiredClaims = new HashMap<>(); // position -> the member whose claim expired
  private final Map<Long, Long> producedBy = new HashMap<>(); // member -> batches uploaded
  private long largestUpload; // bytes of the largest batch uploaded so far: what a claim may need in staging
  private long claimsExpired;
  private long claimsReleased; // given back by their member (a worker process died or its transform raised)

  /** {@code staging}: sized for uploads ({@link Staging#forUploads}). */
  MemberUploads(BatchOrder order, Membership members, Staging staging, PrepCounts counts, PrepGroup.Limits limits,
      GroupLock lock) {
    this.order = order;
    this.members = members;
    this.staging = staging;
    this.counts = counts;
    this.limits = limits;
    this.lock = lock;
  }

  @Override
  public String mode() {
    return "members";
  }

  @Override
  public Schema schema() {
    return BatchSchema.SCHEMA;
  }

  @Override
  public int producers() {
    return 0;
  }

  @Override
  public long batchBytes() {
    return 0;
  }

  @Override
  public long workingBytes() {
    return 0;
  }

  @Override
  public VectorSchemaRoot prepare(long pos, Staging staging) {
    throw new IllegalStateException("prep group " + order.group + ": members upload its batches");
  }

  /**
   * The first position past what may be claimed: the window's span ahead of the slowest cursor ({@link
   * Membership#aheadEnd}), and no more positions than staging holds batches of the largest size uploaded so far, so
   * uploads of later batches never fill staging before the batch the slowest member needs. Caller holds the lock.
   */
  private long claimEnd() {
    long end = members.aheadEnd(staging.window());
    if (largestUpload == 0) {
      return end;
    }
    long min = members.minCursor();
    long held = Math.max(1, staging.limit() / largestUpload);
    return min > Long.MAX_VALUE - held ? end : Math.min(end, min + held);
  }

  /** Who holds the claim on {@code pos}, for messages of calls waiting for it. Caller holds the lock. */
  String claimer(long pos) {
    Claim c = claimedBy.get(pos);
    return c == null ? " (nobody has claimed it)" : " (member " + c.member() + " claimed it)";
  }

  /**
   * Waits until the batch at {@code pos} is staged ({@code "ready"}) or nobody alive makes it and it is within the
   * window ({@code "produce"}: member {@code m} makes the returned ids and uploads them). Caller holds the lock and
   * has checked the position.
   */
  ObjectNode claim(Membership.Member m, long pos, BooleanSupplier cancelled) throws InterruptedException {
    long deadline = limits.deadline();
    while (true) {
      ObjectNode o = JsonNodeFactory.instance.objectNode();
      o.put("v", 1);
      if (staging.has(pos)) {
        return o.put("state", "ready");
      }
      members.maybeStart(System.nanoTime());
      if (members.started() && !claimedBy.containsKey(pos) && pos < claimEnd()) {
        claimedBy.put(pos, new Claim(m.id, System.nanoTime()));
        expiredClaims.remove(pos, m.id);
        o.put("state", "produce");
        ArrayNode ids = o.putArray("ids");
        for (int id : order.ids(pos)) {
          ids.add(id);
        }
        return o;
      }
      checkClaimerStays(m, cancelled);
      limits.check(deadline, order.group, order.at(pos) + (!members.started()
          ? " (the group has not started: group_size not reached)"
          : claimedBy.containsKey(pos) ? claimer(pos) : " to come within the window of the slowest member"));
      m.lastSeen = System.nanoTime();
      lock.await(10);
    }
  }

  /**
   * DataLoader worker processes of a member ({@code prep.claim} with {@code "next": true}): the lowest batch of
   * {@code epoch}, from the member's cursor on, that nobody has staged or claimed and that lies within the window
   * ({@code "produce"} with its {@code "batch"} and {@code "ids"}). Unlike {@link #claim} it does not move the
   * member's cursor (its main process reads in order), so one member's workers hold several claims at once.
   * {@code "done"}: every batch of the epoch from the cursor on is staged; {@code "wait"}: none was free within
   * {@code waitNanos} (ask again: a claim may still be given back). Caller holds the lock.
   */
  ObjectNode claimNext(Membership.Member m, long epoch, long waitNanos, BooleanSupplier cancelled)
      throws InterruptedException {
    long first = order.pos(epoch, 0);
    long end = Math.min(first + order.numBatches, m.endPos);
    if (end <= m.startPos) {
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + order.group + ": member " + m.id
          + " reads epochs " + m.startPos / order.numBatches + " to " + (m.endPos - 1) / order.numBatches + ", not "
          + epoch).toRuntimeException();
    }
    long deadline = System.nanoTime() + waitNanos;
    while (true) {
      long now = System.nanoTime();
      members.maybeStart(now);
      boolean done = true;
      long limit = Math.min(end, claimEnd());
      for (long pos = Math.max(first, m.cursor); pos < end && (done || pos < limit); pos++) {
        if (staging.has(pos)) {
          continue;
        }
        done = false;
        if (members.started() && pos < limit && !claimedBy.containsKey(pos)) {
          claimedBy.put(pos, new Claim(m.id, now));
          expiredClaims.remove(pos, m.id);
          ObjectNode o = JsonNodeFactory.instance.objectNode().put("v", 1).put("state", "produce")
              .put("epoch", epoch).put("batch", pos - first);
          ArrayNode ids = o.putArray("ids");
          for (int id : order.ids(pos)) {
            ids.add(id);
          }
          return o;
        }
      }
      if (done || now >= deadline) {
        return JsonNodeFactory.instance.objectNode().put("v", 1).put("state", done ? "done" : "wait");
      }
      checkClaimerStays(m, cancelled);
      m.lastSeen = now;
      lock.await(10);
    }
  }

  /**
   * A member gives back its claim on {@code pos} ({@code prep.release}): its worker process died or its transform
   * raised, so another worker or member makes the batch. False when it held no such claim (expired). Caller holds
   * the lock.
   */
  boolean giveBack(Membership.Member m, long pos, String reason) {
    Claim c = claimedBy.get(pos);
    if (c == null || c.member() != m.id) {
      return false;
    }
    claimedBy.remove(pos);
    claimsReleased++;
    LOG.info("prep group {}: member {} gave back its claim on {} ({}); another may make it", order.group, m.id,
        order.at(pos), reason.isEmpty() ? "no reason given" : reason);
    lock.changed();
    return true;
  }

  /** A claim that waits ends when its call is cancelled, its member is gone (naming why) or the group closed. */
  private void checkClaimerStays(Membership.Member m, BooleanSupplier cancelled) {
    if (cancelled.getAsBoolean()) {
      throw CallStatus.CANCELLED.withDescription("the call was cancelled").toRuntimeException();
    }
    if (!members.isMember(m.id)) {
      members.member(m.id);
    }
    if (members.closed()) {
      throw CallStatus.UNAVAILABLE.withDescription("prep group " + order.group + " closed").toRuntimeException();
    }
  }

  /** Stages a batch a member made (DoPut): its ids must be the claimed batch's, its size within staging. */
  void upload(long memberId, long epoch, long batch, VectorSchemaRoot in, BooleanSupplier cancelled)
      throws InterruptedException {
    long pos = order.pos(epoch, batch);
    long bytes = 0;
    for (FieldVector v : in.getFieldVectors()) {
      bytes += v.getBufferSize();
    }
    String group = order.group;
    synchronized (lock) {
      Membership.Member m = members.member(memberId);
      Claim claim = claimedBy.get(pos);
      if (claim == null || claim.member() != m.id) {
        Long expired = expiredClaims.get(pos);
        if (expired != null && expired == m.id) {
          throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + group + ": member " + m.id + "'s claim on"
              + " epoch " + epoch + " batch " + batch + " expired: it was not uploaded within "
              + PrepGroup.seconds(limits.claimTimeoutNanos()) + " s (--prep-claim-timeout), so the batch went back"
              + " to the group; ask prep.claim again").toRuntimeException();
        }
        throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + group + ": member " + m.id
            + " did not claim epoch " + epoch + " batch " + batch + " (prep.claim first)").toRuntimeException();
      }
      int[] ids = order.ids(pos);
      FieldVector idv = in.getVector(PrepSchema.ID);
      boolean idsOk = idv instanceof BigIntVector && in.getRowCount() == ids.length;
      for (int i = 0; idsOk && i < ids.length; i++) {
        idsOk = ((BigIntVector) idv).get(i) == ids[i];
      }
      if (!idsOk) {
        throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + group + ": the uploaded batch's \"id\""
            + " column (int64) must be the claimed ids, in order (" + ids.length + " rows)").toRuntimeException();
      }
      if (bytes > staging.limit()) {
        throw CallStatus.RESOURCE_EXHAUSTED.withDescription("prep group " + group + ": an uploaded batch of " + bytes
            + " bytes exceeds staging_bytes " + staging.limit()).toRuntimeException();
      }
      Staging.checkHoldsStep(group, staging.limit(), 0, bytes, members.maxWorld(), "an uploaded batch");
      largestUpload = Math.max(largestUpload, bytes);
      long deadline = limits.deadline();
      while (staging.allocated() + bytes > staging.limit()) { // bounded staging: wait for readers to free
        if (cancelled.getAsBoolean() || members.closed()) {
          throw CallStatus.CANCELLED.withDescription("upload cancelled").toRuntimeException();
        }
        limits.check(deadline, group, "staging room for " + order.at(pos) + " (staging_bytes " + staging.limit()
            + ")");
        m.lastSeen = System.nanoTime();
        claimedBy.put(pos, new Claim(m.id, m.lastSeen)); // it has come back: the upload, not the claim, waits
        lock.await(10);
      }
      claimedBy.remove(pos);
      producedBy.merge(m.id, 1L, Long::sum);
      int rows = staging.adopt(in, pos, members.minCursor(), 0); // no shared memory: no sidecar pipeline
      counts.prepared(epoch, rows);
    }
  }

  /**
   * Gives back claims held past the claim timeout (a member whose transform raised may live on). Caller holds the
   * lock.
   */
  void reap(long now) {
    for (var it = claimedBy.entrySet().iterator(); it.hasNext(); ) {
      var e = it.next();
      if (now - e.getValue().since() > limits.claimTimeoutNanos()) {
        long pos = e.getKey();
        it.remove();
        expiredClaims.put(pos, e.getValue().member());
        claimsExpired++;
        LOG.warn("prep group {}: member {} did not upload epoch {} batch {} within {} s of claiming it"
            + " (--prep-claim-timeout); another member may claim it", order.group, e.getValue().member(),
            pos / order.numBatches, pos % order.numBatches, PrepGroup.seconds(limits.claimTimeoutNanos()));
        lock.changed();
      }
    }
  }

  /** A member went: another member makes what it had claimed. Caller holds the lock. */
  void memberGone(long memberId) {
    claimedBy.values().removeIf(c -> c.member() == memberId);
  }

  /** Forgets expired claims every member is past. Caller holds the lock. */
  void release(long minCursor) {
    expiredClaims.keySet().removeIf(p -> p < minCursor);
  }

  @Override
  public void stats(ObjectNode o) {
    o.put("claims_expired", claimsExpired);
    o.put("claims_released", claimsReleased);
    ObjectNode pb = o.putObject("batches_uploaded_by_member");
    producedBy.forEach((mem, c) -> pb.put(Long.toString(mem), c));
  }
}
