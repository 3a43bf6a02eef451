package io.unstall.flight.dataset;

import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.Map;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.ConcurrentSkipListMap;
import java.util.concurrent.atomic.LongAdder;

/**
 * Per-epoch counters of one dataset: samples served, cache hits and misses, bytes from storage and cache. Only the
 * counters of the latest {@code keep} epochs begun are kept ({@code --stats-epochs}): a client names any epoch it
 * likes, and an epoch's counters must not outlive their use.
 */
public final class DatasetStats {
  private static final org.slf4j.Logger LOG = org.slf4j.LoggerFactory.getLogger(DatasetStats.class);


  /** Counters of one epoch; with a parent (a session's counters), every count also goes to the parent's. */
  public static final class Epoch {
    private final Epoch parent;
    final LongAdder samples = new LongAdder();
    final LongAdder hits = new LongAdder();
    final LongAdder misses = new LongAdder();
    final LongAdder storageBytes = new LongAdder();
    final LongAdder cacheBytes = new LongAdder();
    final LongAdder diskHits = new LongAdder();
    final LongAdder diskBytes = new LongAdder();
    final LongAdder prefetchHits = new LongAdder();
    final LongAdder verified = new LongAdder();
    final LongAdder verifyMismatches = new LongAdder();
    final LongAdder peerHits = new LongAdder();
    final LongAdder peerBytes = new LongAdder();
    final LongAdder peerFallbacks = new LongAdder();

    Epoch(Epoch parent) {
      this.parent = parent;
    }

    public void hit(long bytes) {
      samples.increment();
      hits.increment();
      cacheBytes.add(bytes);
      if (parent != null) {
        parent.hit(bytes);
      }
    }

    /** Served from the disk tier. */
    public void diskHit(long bytes) {
      samples.increment();
      diskHits.increment();
      diskBytes.add(bytes);
      if (parent != null) {
        parent.diskHit(bytes);
      }
    }

    /** Served from the memory cache of the sidecar that owns the sample (the partitioned cache). */
    public void peerHit(long bytes) {
      samples.increment();
      peerHits.increment();
      peerBytes.add(bytes);
      if (parent != null) {
        parent.peerHit(bytes);
      }
    }

    /** Asked of its owner ahead of consumption (prefetch in a cluster); the sample is counted when served. */
    public void peerPrefetched(long bytes) {
      peerHits.increment();
      peerBytes.add(bytes);
      if (parent != null) {
        parent.peerPrefetched(bytes);
      }
    }

    /** Samples whose owner failed or left: they are read from storage instead (and counted as misses then). */
    public void peerFallback(long samples) {
      peerFallbacks.add(samples);
      if (parent != null) {
        parent.peerFallback(samples);
      }
    }

    /** Read from storage ahead of time by the prefetcher (the storage bytes were counted then). */
    public void prefetchHit() {
      samples.increment();
      prefetchHits.increment();
      if (parent != null) {
        parent.prefetchHit();
      }
    }

    /** Bytes read from storage ahead of consumption (prefetch), counted in the epoch they are for. */
    public void prefetched(long bytes) {
      misses.increment();
      storageBytes.add(bytes);
      if (parent != null) {
        parent.prefetched(bytes);
      }
    }

    public void miss(long bytes) {
      samples.increment();
      misses.increment();
      storageBytes.add(bytes);
      if (parent != null) {
        parent.miss(bytes);
      }
    }

    /** What a storage read made of an imported claim on its sample ({@link Dataset#learn}). */
    public void claim(Dataset.Claim c) {
      if (c == Dataset.Claim.VERIFIED) {
        verified.increment();
      } else if (c == Dataset.Claim.MISMATCH) {
        verifyMismatches.increment();
      } else {
        return;
      }
      if (parent != null) {
        parent.claim(c);
      }
    }

    /** Samples served to clients this epoch. */
    public long servedSamples() {
      return samples.sum();
    }

    public long hits() {
      return hits.sum();
    }

    public long misses() {
      return misses.sum();
    }

    public long storageBytes() {
      return storageBytes.sum();
    }

    /** Imported claims that a read confirmed, and that it refused. */
    public long verified() {
      return verified.sum();
    }

    public long verifyMismatches() {
      return verifyMismatches.sum();
    }

    public long peerHits() {
      return peerHits.sum();
    }

    public long peerFallbacks() {
      return peerFallbacks.sum();
    }

    void add(Epoch other) {
      samples.add(other.samples.sum());
      hits.add(other.hits.sum());
      misses.add(other.misses.sum());
      storageBytes.add(other.storageBytes.sum());
      cacheBytes.add(other.cacheBytes.sum());
      diskHits.add(other.diskHits.sum());
      diskBytes.add(other.diskBytes.sum());
      prefetchHits.add(other.prefetchHits.sum());
      verified.add(other.verified.sum());
      verifyMismatches.add(other.verifyMismatches.sum());
      peerHits.add(other.peerHits.sum());
      peerBytes.add(other.peerBytes.sum());
      peerFallbacks.add(other.peerFallbacks.sum());
    }

    ObjectNode toJson() {
      ObjectNode o = JsonNodeFactory.instance.objectNode();
      o.put("samples", samples.sum());
      o.put("hits", hits.sum());
      o.put("misses", misses.sum());
      o.put("storage_bytes", storageBytes.sum());
      o.put("cache_bytes", cacheBytes.sum());
      o.put("disk_hits", diskHits.sum());
      o.put("disk_bytes", diskBytes.sum());
      o.put("prefetch_hits", prefetchHits.sum());
      o.put("verified", verified.sum());
      o.put("verify_mismatches", verifyMismatches.sum());
      o.put("peer_hits", peerHits.sum());
      o.put("peer_bytes", peerBytes.sum());
      o.put("peer_fallbacks", peerFallbacks.sum());
      return o;
    }
  }

  private final ConcurrentSkipListMap<Long, Epoch> epochs = new ConcurrentSkipListMap<>();
  private final ConcurrentLinkedQueue<Long> begun = new ConcurrentLinkedQueue<>(); // epochs, in the order begun
  private final DatasetStats parent;
  private final int keep;

  /** A dataset's counters, keeping the latest {@code keep} epochs. */
  public DatasetStats(int keep) {
    this(null, keep);
  }

  /** Counters whose every count also goes to {@code parent} (a session's, under its dataset's), kept as long. */
  public DatasetStats(DatasetStats parent) {
    this(parent, parent.keep);
  }

  private DatasetStats(DatasetStats parent, int keep) {
    if (keep < 1) {
      throw new IllegalArgumentException("--stats-epochs must be at least 1, got " + keep);
    }
    this.parent = parent;
    this.keep = keep;
  }

  /** The counters of {@code epoch}, created on first use. */
  public Epoch epoch(long epoch) {
    Epoch e = epochs.get(epoch);
    if (e != null) {
      return e;
    }
    Epoch fresh = new Epoch(parent == null ? null : parent.epoch(epoch));
    Epoch prior = epochs.putIfAbsent(epoch, fresh);
    if (prior != null) {
      return prior;
    }
    begun(epoch);
    return fresh;
  }

  /** Records a new epoch; drops the counters of the earliest begun beyond {@code keep}. */
  private void begun(long epoch) {
    begun.add(epoch);
    while (epochs.size() > keep) {
      Long oldest = begun.poll();
      if (oldest == null) {
        break;
      }
      epochs.remove(oldest);
    }
  }

  /**
   * Notes that a batch of {@code epoch} of {@code dataset} is being served; the first time, logs the previous
   * epoch's summary line.
   */
  public void startEpoch(String dataset, long epoch) {
    if (epochs.containsKey(epoch)) {
      return;
    }
    Map.Entry<Long, Epoch> prev = previous(epoch);
    Epoch fresh = new Epoch(parent == null ? null : parent.epoch(epoch));
    if (epochs.putIfAbsent(epoch, fresh) == null) { // else another batch got here first and logs
      if (prev != null) {
        LOG.info(summary(dataset, prev.getKey(), prev.getValue()));
      }
      begun(epoch);
    }
  }

  public boolean hasEpoch(long epoch) {
    return epochs.containsKey(epoch);
  }

  /** The latest epoch seen before {@code epoch}, or null. */
  public Map.Entry<Long, Epoch> previous(long epoch) {
    return epochs.lowerEntry(epoch);
  }

  public void forEach(java.util.function.BiConsumer<Long, Epoch> action) {
    epochs.forEach(action);
  }

  public ObjectNode toJson() {
    ObjectNode o = JsonNodeFactory.instance.objectNode();
    ObjectNode per = o.putObject("epochs");
    Epoch total = new Epoch(null);
    for (Map.Entry<Long, Epoch> e : epochs.entrySet()) {
      per.set(Long.toString(e.getKey()), e.getValue().toJson());
      total.add(e.getValue());
    }
    o.set("total", total.toJson());
    return o;
  }

  /** One line for the sidecar's log. */
  public static String summary(String dataset, long epoch, Epoch e) {
    long s = e.samples.sum();
    long h = e.hits.sum();
    return String.format(
        "dataset '%s' epoch %d: %d samples, cache hits %d (%.1f%%), disk hits %d, misses %d, %d bytes from storage,"
            + " %d from cache%s",
        dataset, epoch, s, h, s == 0 ? 0.0 : 100.0 * h / s, e.diskHits.sum(), e.misses.sum(), e.storageBytes.sum(),
        e.cacheBytes.sum(), e.peerHits.sum() + e.peerFallbacks.sum() == 0 ? ""
            : String.format(", peer hits %d (%d bytes), peer fallbacks %d", e.peerHits.sum(), e.peerBytes.sum(),
                e.peerFallbacks.sum()));
  }
}
