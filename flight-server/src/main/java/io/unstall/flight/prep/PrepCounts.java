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
