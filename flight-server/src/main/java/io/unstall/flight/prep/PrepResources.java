package io.unstall.flight.prep;

import io.unstall.flight.BatchAssembler;
import java.util.concurrent.ExecutorService;
import org.apache.arrow.memory.BufferAllocator;

/**
 * What every group of one sidecar shares, made once by {@link PrepService}: the assembler batches are fetched
 * through, the prep pool and its size, the "prep" allocator (each group's staging is a child of it), the /dev/shm
 * slot files free between groups, the decode budget, the cache forms (restart-indexed JPEG copies, decoded
 * pixels) and the bounds of a group.
 */
record PrepResources(BatchAssembler assembler, ExecutorService pool, int threads, BufferAllocator allocator,
    SlotPool slotPool, DecodeBudget decodeBudget, ReindexedJpegs reindexed, DecodedImages decoded,
    PrepGroup.Limits limits) {

  /** The sidecar-prep source of a group or replica: its raw batches decoded by {@code pipeline} on the pool. */
  SidecarPrep sidecarPrep(BatchOrder order, PrepPipeline pipeline, PrepCounts counts, GroupLock lock) {
    return sidecarPrep(order, rawBatches(order, counts), pipeline, counts, lock);
  }

  private SidecarPrep sidecarPrep(BatchOrder order, RawBatches raw, PrepPipeline pipeline, PrepCounts counts,
      GroupLock lock) {
    return new SidecarPrep(order, raw, pipeline, decodeBudget, reindexed, decoded, pool, threads,
        allocator.getRoundingPolicy(), counts, lock);
  }

  /** The hybrid source: the first rows of each raw batch prepared by {@code pipeline}, the rest left encoded. */
  HybridPrep hybridPrep(BatchOrder order, PrepPipeline pipeline, double cpuLoad, PrepCounts counts, GroupLock lock) {
    RawBatches raw = rawBatches(order, counts);
    return new HybridPrep(order, raw, sidecarPrep(order, raw, pipeline, counts, lock), pipeline, cpuLoad,
        allocator.getRoundingPolicy());
  }

  /** The raw-batch source: batches fetched through the data plane's tiers. */
  RawBatches rawBatches(BatchOrder order, PrepCounts counts) {
    return new RawBatches(order, assembler, allocator.getRoundingPolicy(), counts);
  }
}
