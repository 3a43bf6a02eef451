package io.unstall.flight.prep;

import io.unstall.flight.dataset.Dataset;
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

  PrepReplica(String group, PrepGroup.Key key, Dataset dataset, PrepPipeline pipeline, PrepResources shared) {
    GroupLock lock = new GroupLock();
    PrepCounts counts = new PrepCounts(shared.limits().statsEpochs());
    BufferAllocator parent = shared.allocator();
    this.order = new BatchOrder(group, key, dataset);
    this.prep = shared.sidecarPrep(order, pipeline, counts, lock);
    PrepGroup.Settings one = new PrepGroup.Settings(1, 0, 0, 1, 0, false, false, true);
    this.staging = new Staging(group, "prep-worker-" + group, parent,
        Staging.size(prep, one, parent.getLimit(), key.batchSize(), 1), null, lock);
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
