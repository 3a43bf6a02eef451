package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A group's counts for stats: batches and samples prepared (per epoch, and by whom), batches served, and the time
 * preparing took. Guarded by the group lock, but for the fetch and CPU clocks, which prep threads add to as they go.
 */
final class PrepCounts {
  private final int statsEpochs;
  long batchesPrepared;
  long samplesPrepared;
  long batchesServed;
  long prepNanos;
  private long busyNanos; // time in which at least one producer was preparing a batch, up to busySince
  private long busySince = -1; // when the producers' current busy span began; -1: none preparing
  final AtomicLong fetchNanos = new AtomicLong();
  final AtomicLong prepCpuNanos = new AtomicLong();
  private final TreeMap<Long, Long> perEpoch = new TreeMap<>();
  final Map<String, Long> preparedBy = new LinkedHashMap<>(); // "local" or "worker <id> (<name>)" -> batches

  PrepCounts(int statsEpochs) {
    this.statsEpochs = statsEpochs;
  }

  /** Counts a batch of {@code rows} prepared in its epoch, keeping the latest epochs' counts. Caller holds the lock. */
  void prepared(long epoch, int rows) {
    batchesPrepared++;
    samplesPrepared += rows;
    perEpoch.merge(epoch, 1L, Long::sum);
    while (perEpoch.size() > statsEpochs) {
      perEpoch.pollFirstEntry();
    }
  }

  /**
   * A producer started ({@code active} producers now preparing, itself included) or ended ({@code active} left) a
   * batch at {@code now}: tracks the time in which at least one was preparing. Caller holds the lock.
   */
  void producers(int active, long now) {
    if (active > 0 && busySince < 0) {
      busySince = now;
    } else if (active == 0 && busySince >= 0) {
      busyNanos += now - busySince;
      busySince = -1;
    }
  }

  /** The time up to {@code now} in which at least one producer was preparing a batch. Caller holds the lock. */
  long busyNanos(long now) {
    return busyNanos + (busySince >= 0 ? now - busySince : 0);
  }

  void statsCounts(ObjectNode o) {
    o.put("batches_prepared", batchesPrepared);
    o.put("samples_prepared", samplesPrepared);
  }

  void statsTimes(ObjectNode o) {
    o.put("batches_served", batchesServed);
    o.put("prep_seconds", prepNanos / 1e9); // wall time of fetch + decode + augment, summed over batches
    o.put("fetch_seconds", fetchNanos.get() / 1e9); // of which: assembling the raw batch (cache or storage)
    o.put("decode_cpu_seconds", prepCpuNanos.get() / 1e9); // CPU time of decode + augment on the prep threads
  }

  void statsPerEpoch(ObjectNode o) {
    ObjectNode per = o.putObject("batches_prepared_per_epoch");
    perEpoch.forEach((e, c) -> per.put(Long.toString(e), c));
  }
}
