package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.arrow.flight.CallStatus;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A group's members, their cursors and the group's life: the join barrier ({@code group_size}, {@code
 * join_timeout_s}), late joiners (they start at the next whole epoch), resumed members (at their own position),
 * heartbeats, dropping the silent, and closing once the last member of a started group is gone. A member's cursor
 * is the first position it may still read; the slowest cursor ({@link #minCursor}) bounds what is prepared ahead
 * ({@link #aheadEnd}) and what staging keeps. Guarded by the group lock: every method is called with it held.
 */
final class Membership {
  private static final Logger LOG = LoggerFactory.getLogger(Membership.class);

  static final class Member {
    final long id;
    final String name;
    final long startPos;
    final long endPos;
    long cursor;
    long lastSeen;
    int waiting; // calls of this member waiting in the group now: such a member is alive
    boolean reportsReleases; // shared memory: it says which batches it let go of (prep.next "released")
    final RankShare share; // a data-parallel rank's share of each epoch; null: every batch

    Member(long id, String name, long startPos, long endPos, long now, RankShare share) {
      this.id = id;
      this.name = name;
      this.startPos = startPos;
      this.endPos = endPos;
      this.share = share;
      this.cursor = next(startPos);
      this.lastSeen = now;
    }

    /** The first position at or after {@code from} this member reads; {@code endPos} when none is left. */
    long next(long from) {
      return share == null ? from : Math.min(share.next(from), endPos);
    }
  }

  private final BatchOrder order;
  private final PrepGroup.Settings settings;
  private final GroupLock lock;
  private final String prepared;
  private final long created = System.nanoTime();
  private final Map<Long, Member> members = new LinkedHashMap<>();
  private final Map<Long, String> gone = new HashMap<>();
  private final List<ObjectNode> dropped = new ArrayList<>();
  private int left;
  private boolean started;
  private boolean closed;

  /** {@code prepared}: ", JPEGs prepared by ...", which decoder the sidecar prepares with; empty without a pipeline. */
  Membership(BatchOrder order, PrepGroup.Settings settings, GroupLock lock, String prepared) {
    this.order = order;
    this.prepared = prepared;
    this.settings = settings;
    this.lock = lock;
  }

  boolean started() {
    return started;
  }

  boolean closed() {
    return closed;
  }

  /** Started and someone to prepare for: production may run. */
  boolean running() {
    return started && !members.isEmpty();
  }

  void close() {
    closed = true;
    lock.changed();
  }

  /**
   * Adds a member; null when the group has closed. {@code startEpoch} >= 0: a resumed member starting at batch
   * {@code startBatch} of that epoch; otherwise a late joiner starts at the group's next whole epoch. {@code share}:
   * the batches of each epoch a data-parallel rank reads (null: all); its cursor is always the next of them, so the
   * group frees a batch once every rank that reads it did, and the member finishes after its last one. A member whose
   * share has nothing left is gone at once ("finished").
   */
  Member join(long memberId, String name, long epochs, long startEpoch, long startBatch, RankShare share) {
    if (closed) {
      return null;
    }
    int numBatches = order.numBatches;
    long startPos = 0;
    if (startEpoch >= 0) {
      if (startBatch < 0 || startBatch >= numBatches) {
        throw CallStatus.INVALID_ARGUMENT.withDescription("prep.join: \"start_batch\" " + startBatch
            + " is out of range; an epoch of prep group " + order.group + " has " + numBatches + " batches")
            .toRuntimeException();
      }
      startPos = startEpoch * numBatches + startBatch;
      long first = share == null ? startPos : share.next(startPos);
      if (started && first < minCursor()) {
        long min = minCursor();
        throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + order.group + " (dataset '"
            + order.key.dataset() + "', seed " + order.key.seed() + ") cannot start a member at epoch " + startEpoch
            + " batch " + startBatch + ": its members have read up to epoch " + min / numBatches + " batch "
            + min % numBatches + " and every batch is prepared once, so it no longer has that one; join without a"
            + " start position to start at the group's next whole epoch").toRuntimeException();
      }
    } else if (started) {
      // A late joiner starts at the first whole epoch whose batch 0 every member still holds or has yet to
      // read: it never sees a partial epoch and never makes the group re-prepare a batch.
      long min = minCursor();
      startPos = (min + numBatches - 1) / numBatches * numBatches;
    }
    long endPos = epochs > 0 ? (startPos / numBatches + epochs) * numBatches : Long.MAX_VALUE;
    Member m = new Member(memberId, name, startPos, endPos, System.nanoTime(), share);
    if (m.cursor >= endPos) {
      gone.put(memberId, "finished: its share of its " + epochs + " epochs had nothing left");
      return m;
    }
    members.put(memberId, m);
    lock.changed();
    return m;
  }

  /** The member, or NOT_FOUND naming why it is gone. */
  Member member(long memberId) {
    Member m = members.get(memberId);
    if (m == null) {
      String why = gone.get(memberId);
      throw CallStatus.NOT_FOUND.withDescription("prep group " + order.group + ": member " + memberId
          + (why != null ? " was " + why : " is unknown (join first)")).toRuntimeException();
    }
    return m;
  }

  boolean isMember(long memberId) {
    return members.containsKey(memberId);
  }

  /** Opens the join barrier once {@code group_size} members joined, or on the join timeout with at least one. */
  void maybeStart(long now) {
    if (!started && (members.size() >= settings.groupSize() || (!members.isEmpty()
        && now - created > settings.joinTimeoutNanos()))) {
      started = true;
      LOG.info("prep group {} starts with {} member(s) (group_size {}){}", order.group, members.size(),
          settings.groupSize(), prepared);
      lock.changed();
    }
  }

  /** Removes a member; returns whether that closed the group (the last member of a started group). */
  boolean remove(Member m, String why) {
    members.remove(m.id);
    gone.put(m.id, why);
    lock.changed();
    if (members.isEmpty() && started && !closed) {
      closed = true;
      return true;
    }
    return false;
  }

  /** A member leaves; returns whether that closed the group. */
  boolean leave(long memberId) {
    Member m = member(memberId);
    left++;
    return remove(m, "left");
  }

  /** Drops members that neither wait in a call nor heartbeat for the member timeout; returns the dropped. */
  List<Member> dropSilent(long now) {
    List<Member> out = new ArrayList<>();
    for (Member m : List.copyOf(members.values())) {
      long silent = now - m.lastSeen;
      if (m.waiting == 0 && silent > settings.memberTimeoutNanos()) {
        String why = "dropped after no heartbeat for " + String.format("%.1f", silent / 1e9) + " s (member_timeout_s "
            + settings.memberTimeoutNanos() / 1e9 + ")";
        LOG.warn("prep group {}: member {} ({}) {}; the others go on", order.group, m.id, m.name, why);
        ObjectNode d = JsonNodeFactory.instance.objectNode();
        d.put("member", m.id);
        d.put("name", m.name);
        d.put("at_epoch", m.cursor / order.numBatches);
        d.put("at_batch", m.cursor % order.numBatches);
        d.put("reason", why);
        dropped.add(d);
        members.remove(m.id);
        gone.put(m.id, why);
        out.add(m);
      }
    }
    if (!out.isEmpty()) {
      lock.changed();
    }
    return out;
  }

  /** Closes a group nobody is in, started or not (its only joiner had nothing to read); returns whether it did. */
  boolean closeIfNobody() {
    if (members.isEmpty() && !closed) {
      closed = true;
      lock.changed();
      return true;
    }
    return false;
  }

  /** Closes a started group whose members are all gone; returns whether it did. */
  boolean closeIfEmpty() {
    if (members.isEmpty() && started && !closed) {
      closed = true;
      lock.changed();
      return true;
    }
    return false;
  }

  /** The slowest member's cursor: no member reads below it. {@code Long.MAX_VALUE} with no member (none holds any). */
  long minCursor() {
    long min = Long.MAX_VALUE;
    for (Member m : members.values()) {
      min = Math.min(min, m.cursor);
    }
    return min;
  }

  /** The largest world size among the members that are data-parallel ranks; 1 without ranks. */
  int maxWorld() {
    int w = 1;
    for (Member m : members.values()) {
      if (m.share != null) {
        w = Math.max(w, m.share.world);
      }
    }
    return w;
  }

  /**
   * The first position past what may be prepared (or claimed) ahead of the slowest cursor: {@code window} steps of
   * the widest job, {@code window * maxWorld()} positions. The W ranks of a data-parallel job read W consecutive
   * positions at each step and wait for each other there (DDP's allreduce), so a span of fewer than W positions
   * leaves the ranks past its end waiting for the slowest rank, which waits for them.
   */
  long aheadEnd(int window) {
    long min = minCursor();
    long span = (long) window * maxWorld();
    return min > Long.MAX_VALUE - span ? Long.MAX_VALUE : min + span;
  }

  /** The end of the longest membership: nothing at or past it is prepared. */
  long maxEnd() {
    long max = 0;
    for (Member m : members.values()) {
      max = Math.max(max, m.endPos);
    }
    return max;
  }

  /** Checks a member's request for {@code (epoch, batch)}: in range and not behind the member. */
  long position(Member m, long epoch, long batch) {
    int numBatches = order.numBatches;
    String group = order.group;
    if (batch >= numBatches) {
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + group + ": batch " + batch
          + " out of range; an epoch has " + numBatches + " batches").toRuntimeException();
    }
    long pos = epoch * numBatches + batch;
    if (pos < m.startPos) {
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + group + ": member " + m.id + " joined at epoch "
          + m.startPos / numBatches + (m.startPos % numBatches == 0 ? "" : " batch " + m.startPos % numBatches)
          + "; epoch " + epoch + " batch " + batch + " is before it").toRuntimeException();
    }
    if (pos < m.cursor) {
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + group + ": member " + m.id
          + " already read past epoch " + epoch + " batch " + batch + " (members read forward only)")
          .toRuntimeException();
    }
    if (pos >= m.endPos) {
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + group + ": member " + m.id
          + " declared " + (m.endPos - m.startPos) / numBatches + " epochs; epoch " + epoch + " is beyond them")
          .toRuntimeException();
    }
    if (m.share != null && !m.share.reads(pos)) {
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + group + ": member " + m.id + " is rank "
          + m.share.rank + " of " + m.share.world + " and does not read epoch " + epoch + " batch " + batch
          + " (another rank's, or one its job read before its checkpoint)").toRuntimeException();
    }
    return pos;
  }

  void stats(ObjectNode o) {
    ArrayNode ms = o.putArray("members");
    int numBatches = order.numBatches;
    for (Member m : members.values()) {
      ObjectNode mo = ms.addObject();
      mo.put("member", m.id);
      mo.put("name", m.name);
      mo.put("start_epoch", m.startPos / numBatches);
      mo.put("start_batch", m.startPos % numBatches);
      mo.put("epoch", m.cursor / numBatches);
      mo.put("batch", m.cursor % numBatches);
      if (m.share != null) {
        mo.put("world_size", m.share.world);
        mo.put("rank", m.share.rank);
      }
    }
    ArrayNode ds = o.putArray("dropped");
    dropped.forEach(ds::add);
    o.put("left", left);
  }
}
