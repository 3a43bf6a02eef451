package io.unstall.flight.prep;

import io.unstall.flight.BatchAssembler;
import io.unstall.flight.protocol.BatchSchema;
import java.io.IOException;
import org.apache.arrow.memory.rounding.RoundingPolicy;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.types.pojo.Schema;

/**
 * The raw-batch source (a group joined without a pipeline): each batch is the encoded samples as a DoGet of the
 * dataset would send them, assembled through the data plane's tiers (cache, peers, storage). {@link SidecarPrep}
 * fetches with it too.
 */
final class RawBatches implements BatchSource {
  private final BatchOrder order;
  private final BatchAssembler assembler;
  private final PrepCounts counts;
  private final long cost;

  RawBatches(BatchOrder order, BatchAssembler assembler, RoundingPolicy rounding, PrepCounts counts) {
    this.order = order;
    this.assembler = assembler;
    this.counts = counts;
    int maxLen = 0;
    for (int i = 0; i < order.numSamples; i++) {
      maxLen = Math.max(maxLen, order.dataset.length(i));
    }
    int b = order.key.batchSize();
    this.cost = rounding.getRoundedSize(Math.max(1L, (long) maxLen * b)) + b * PrepGroup.ROW_OVERHEAD
        + PrepGroup.BATCH_OVERHEAD;
  }

  @Override
  public String mode() {
    return "none";
  }

  @Override
  public Schema schema() {
    return BatchSchema.SCHEMA;
  }

  @Override
  public long batchBytes() {
    return cost;
  }

  @Override
  public long workingBytes() {
    return 0;
  }

  @Override
  public VectorSchemaRoot prepare(long pos, Staging staging) throws IOException {
    return fetch(pos, order.ids(pos), staging);
  }

  /** Assembles the samples {@code ids} of position {@code pos} into staging. */
  VectorSchemaRoot fetch(long pos, int[] ids, Staging staging) throws IOException {
    long t0 = System.nanoTime();
    VectorSchemaRoot raw = assembler.assemble(order.dataset,
        new BatchAssembler.Requester("prep-" + order.group, order.dataset.stats()), pos / order.numBatches, ids,
        staging.allocator());
    counts.fetchNanos.addAndGet(System.nanoTime() - t0);
    return raw;
  }
}
