package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.dataset.Dataset;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.arrow.flight.CallStatus;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The sidecar's prep groups: the open group of each {@link PrepGroup.Key}, every group by id (the last closed ones
 * kept for stats), at most {@code --prep-groups} open at once; and the reaper, a thread that every 100 ms drops
 * silent members and expired claims, tunes each group ({@link PrepGroup#reap}), forgets closed groups, expires
 * pooled /dev/shm slots and brings the cluster's directory in line ({@link GroupAnnouncer}). Its monitor guards the
 * two maps and comes before any group's lock ({@link GroupLock}).
 */
final class PrepGroups {
  private static final Logger LOG = LoggerFactory.getLogger(PrepGroups.class);
  private static final int HISTORY = 64;

  private final PrepResources shared;
  private final int maxGroups;
  private final GroupAnnouncer announcer;
  private final ScheduledExecutorService reaper;
  private final AtomicLong memberIds = new AtomicLong(); // members and remote workers alike
  // Guarded by this: the open group of each key, and every group by id (closed ones kept for stats).
  private final Map<PrepGroup.Key, PrepGroup> open = new HashMap<>();
  private final LinkedHashMap<String, PrepGroup> byId = new LinkedHashMap<>();

  PrepGroups(PrepResources shared, int maxGroups, GroupAnnouncer announcer) {
    this.shared = shared;
    this.maxGroups = maxGroups;
    this.announcer = announcer;
    this.reaper = Executors.newSingleThreadScheduledExecutor(r -> {
      Thread t = new Thread(r, "unstall-prep-reaper");
      t.setDaemon(true);
      return t;
    });
    reaper.scheduleWithFixedDelay(this::reap, 100, 100, TimeUnit.MILLISECONDS);
  }

  int maxGroups() {
    return maxGroups;
  }

  /** A new id for a member or a remote worker. */
  long nextMemberId() {
    return memberIds.incrementAndGet();
  }

  /** The group with id {@code id}, open or recently closed; null if unknown. */
  synchronized PrepGroup get(String id) {
    return byId.get(id);
  }

  /** Every group known by id, in the order they opened. */
  synchronized List<PrepGroup> all() {
    return new ArrayList<>(byId.values());
  }

  /**
   * Adds a member to the open group of {@code key}, or opens one ({@code d}, {@code pipeline}, settings {@code s})
   * when there is none or it has just closed; returns the join answer.
   */
  synchronized ObjectNode join(PrepGroup.Key key, Dataset d, PrepPipeline pipeline, PrepGroup.Settings s,
      PrepRequests.Join j) throws Exception {
    long member = nextMemberId();
    PrepGroup g = open.get(key);
    ObjectNode r = g == null ? null
        : g.join(member, j.name(), j.epochs(), j.startEpoch(), j.startBatch(), j.share(), j.cacheSnapshot());
    if (r != null) {
      return r;
    }
    long running = open.values().stream().filter(o -> !o.isClosed()).count();
    if (running >= maxGroups) {
      throw CallStatus.RESOURCE_EXHAUSTED.withDescription("prep.join: the sidecar already runs " + running
          + " prep groups (--prep-groups " + maxGroups + "); a new group needs another dataset, pipeline, seed,"
          + " batch_size, shuffle, drop_last or order than those: join one of them, wait for one to end, or raise"
          + " --prep-groups").toRuntimeException();
    }
    String id = PrepPipeline.sha256(key + "#" + System.nanoTime()).substring(0, 16);
    g = new PrepGroup(id, key, d, pipeline, shared, s, j.share() == null ? 1 : j.share().world(), j.cpuLoad());
    try {
      r = g.join(member, j.name(), j.epochs(), j.startEpoch(), j.startBatch(), j.share(), j.cacheSnapshot());
    } catch (RuntimeException e) {
      g.close(); // a bad start position: no group without members is left behind
      throw e;
    }
    open.put(key, g);
    byId.put(id, g);
    trimHistory();
    return r;
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
    shared.slotPool().expire(System.nanoTime());
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
      announcer.sync(groups);
    } catch (RuntimeException e) { // the cluster going away: retried on the next round, never kills the reaper
      LOG.warn("announcing prep groups to the cluster failed (retried): {}", e.toString());
    }
  }

  /** Stops the reaper (first at shutdown: nothing is announced after it). */
  void stopReaper() throws InterruptedException {
    reaper.shutdownNow();
    reaper.awaitTermination(10, TimeUnit.SECONDS);
  }

  /** Closes every group: stops its producers and waits until its staging is freed. */
  void closeAll() throws InterruptedException {
    List<PrepGroup> groups;
    synchronized (this) {
      groups = new ArrayList<>(byId.values());
      open.clear();
    }
    for (PrepGroup g : groups) {
      g.close();
    }
  }
}
