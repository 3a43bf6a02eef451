package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.types.pojo.Schema;

/**
 * Where a group's batches come from, one implementation per mode: {@link RawBatches} (no prep: the fetched batch),
 * {@link SidecarPrep} (the sidecar's pipeline on the prep pool) and {@link MemberUploads} (members transform and
 * upload). {@link Production} asks it for each position it takes, on its producer threads and without the group
 * lock; a source whose batches arrive by upload asks for no producer thread.
 *
 * <p>A new mode is a new implementation: say what a batch costs in staging, make it in {@link #prepare}, and add
 * its fields to the join answer and the stats; {@code PrepGroup} picks the source from the join.
 */
interface BatchSource {
  /** Stats' {@code "prep"}: "none" (raw), "sidecar" or "members". */
  String mode();

  /** The schema of the batches it stages. */
  Schema schema();

  /** Producer threads it needs ({@link Production#PRODUCERS}); 0 when its batches arrive by upload instead. */
  default int producers() {
    return Production.PRODUCERS;
  }

  /** An upper bound of one staged batch's bytes; 0 when known only as uploads arrive (checked then). */
  long batchBytes();

  /** Memory besides the staged batch while one is made (sidecar prep: the raw batch it decodes). */
  long workingBytes();

  /**
   * The bytes of the /dev/shm slot one batch needs when the group stages in shared memory ({@link ShmSlots}): its
   * tensor, or its payloads; 0 when its batches do not go to shared memory (member uploads).
   */
  default long slotBytes() {
    return 0;
  }

  /** The sidecar pipeline its batches come out of; null when it has none (raw batches, member uploads). */
  default PrepPipeline pipeline() {
    return null;
  }

  /** Whether its batches are made by tasks on the prep pool, so that {@link #parallelism} applies. */
  default boolean parallel() {
    return false;
  }

  /** At most {@code n} tasks of one batch run at once from now on ({@link Autotuner}); only if {@link #parallel}. */
  default void parallelism(int n) {}

  /** Whether the {@link Autotuner} moves its split between the sidecar's CPUs and the members' device. */
  default boolean tunesSplit() {
    return false;
  }

  /** The samples of a batch the sidecar prepares (a hybrid source; the rest are decoded on the device). */
  default int cpuRows() {
    return -1;
  }

  /** From the next batch on, the sidecar prepares {@code n} samples of each (within the batch); returns that. */
  default int cpuRows(int n) {
    return -1;
  }

  /** The samples of a batch the split divides (its batch size); 0 without a split. */
  default int batchSize() {
    return 0;
  }

  /** The samples the sidecar prepared of a hybrid source's batches so far (its CPU share); 0 without a split. */
  default long cpuSamples() {
    return 0;
  }

  /** How many samples one step of the split's tuning moves. */
  default int splitStep() {
    return 1;
  }

  /** " and output [3, 224, 224] float32": the batch for messages; empty when the batch is the raw one. */
  default String describeOutput() {
    return "";
  }

  /** Makes the batch at {@code pos} in {@code staging}'s allocator. Called without the group lock. */
  VectorSchemaRoot prepare(long pos, Staging staging) throws Exception;

  /** This mode's fields of the join answer. */
  default void describe(ObjectNode join) {}

  /** This mode's fields of the group's stats. Caller holds the group lock. */
  default void stats(ObjectNode o) {}
}
