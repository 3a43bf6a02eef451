package io.unstall.flight.prep;

import io.unstall.flight.BatchAssembler;
import io.unstall.flight.dataset.Dataset;
import java.util.concurrent.ExecutorService;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.VectorSchemaRoot;

/**
 * A remote prep worker's copy of another sidecar's group: the group's order and {@link SidecarPrep}, with staging
 * for the one batch in hand. No members, no producers: it prepares what its {@link PrepWorker} claims, exactly as
 * the owner would (same order, same per-(seed, epoch, sample) randomness).
 */
final class PrepReplica implements AutoCloseable {
  private final BatchOrder order;
  private final SidecarPrep prep;
  private final Staging staging;

  PrepReplica(String group, PrepGroup.Key key, Dataset dataset, PrepPipeline pipeline, BatchAssembler assembler,
      ExecutorService pool, int threads, BufferAllocator parent, DecodeBudget decodeBudget, ReindexedJpegs reindexed,
      PrepGroup.Limits limits) {
    GroupLock lock = new GroupLock();
    PrepCounts counts = new PrepCounts(limits.statsEpochs());
    this.order = new BatchOrder(group, key, dataset);
    RawBatches raw = new RawBatches(order, assembler, parent.getRoundingPolicy(), counts);
    this.prep = new SidecarPrep(order, raw, pipeline, decodeBudget, reindexed, pool, threads,
        parent.getRoundingPolicy(), counts, lock);
    PrepGroup.Settings one = new PrepGroup.Settings(1, 0, 0, 1, 0, false, false, true);
    this.staging = new Staging(group, "prep-worker-" + group, parent,
        Staging.size(prep, one, parent.getLimit(), key.batchSize()), null, lock);
  }

  /** Prepares batch {@code (epoch, batch)}; the caller owns (and closes) the root. */
  VectorSchemaRoot prepare(long epoch, long batch) throws Exception {
    return prep.prepare(order.pos(epoch, batch), staging);
  }

  @Override
  public void close() {
    staging.free();
  }
}
