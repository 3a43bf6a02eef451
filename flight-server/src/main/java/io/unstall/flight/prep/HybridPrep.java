package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.protocol.BatchSchema;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.rounding.RoundingPolicy;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.BitVector;
import org.apache.arrow.vector.FixedSizeBinaryVector;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.types.pojo.ArrowType;
import org.apache.arrow.vector.types.pojo.Field;
import org.apache.arrow.vector.types.pojo.FieldType;
import org.apache.arrow.vector.types.pojo.Schema;

/**
 * The hybrid source ({@code prep.join}'s {@code "hybrid"}; the shim's {@code decode(device="mixed", cpu_load=...)}):
 * of each raw batch, the sidecar prepares the first {@link #cpuRows} samples with the group's pipeline (uint8 NHWC,
 * the same code and draws as {@link SidecarPrep}) and leaves the rest encoded, for the members' device to decode.
 * A batch is the raw one with a {@code prepared} column: where it is true, {@code payload} holds the sample's
 * prepared pixels instead of its stored bytes (and {@code header} is null). The {@link Autotuner} moves the split
 * online when it is "auto".
 */
final class HybridPrep implements BatchSource {
  static final String PREPARED = "prepared";
  static final Schema SCHEMA = hybridSchema();

  private final BatchOrder order;
  private final RawBatches raw;
  private final SidecarPrep rows;
  private final PrepPipeline pipeline;
  private final boolean auto;
  private final long cost;
  private volatile int cpuRows;
  // Guarded by the group lock (stats) or updated by producers under it (PrepCounts-style totals).
  private long samplesPrepared;
  private long samplesEncoded;

  /** {@code cpuLoad}: the fraction of each batch the sidecar prepares, or negative for "auto" (tuned, from half). */
  HybridPrep(BatchOrder order, RawBatches raw, SidecarPrep rows, PrepPipeline pipeline, double cpuLoad,
      RoundingPolicy rounding) {
    this.order = order;
    this.raw = raw;
    this.rows = rows;
    this.pipeline = pipeline;
    this.auto = cpuLoad < 0;
    int b = order.key.batchSize();
    this.cpuRows = (int) Math.round((auto ? 0.5 : cpuLoad) * b);
    this.cost = raw.batchBytes() + rounding.getRoundedSize(pipeline.sampleBytes() * b) + b * PrepGroup.ROW_OVERHEAD;
  }

  private static Schema hybridSchema() {
    List<Field> fields = new ArrayList<>(RawBatches.SCHEMA.getFields());
    fields.add(new Field(PREPARED, FieldType.notNullable(ArrowType.Bool.INSTANCE), null));
    return new Schema(fields, RawBatches.SCHEMA.getCustomMetadata());
  }

  @Override
  public String mode() {
    return "hybrid";
  }

  @Override
  public Schema schema() {
    return SCHEMA;
  }

  @Override
  public long batchBytes() {
    return cost;
  }

  @Override
  public long workingBytes() {
    return rows.workingBytes() + rows.batchBytes(); // the raw batch and its prepared rows, merged into the batch
  }

  @Override
  public long slotBytes() {
    return Math.max(raw.slotBytes(), rows.slotBytes()); // each row holds the larger of its bytes and its pixels
  }

  @Override
  public boolean parallel() {
    return true;
  }

  @Override
  public void parallelism(int n) {
    rows.parallelism(n);
  }

  @Override
  public boolean tunesSplit() {
    return auto;
  }

  @Override
  public int cpuRows() {
    return cpuRows;
  }

  @Override
  public int cpuRows(int n) {
    cpuRows = Math.max(0, Math.min(order.key.batchSize(), n));
    return cpuRows;
  }

  @Override
  public int batchSize() {
    return order.key.batchSize();
  }

  @Override
  public synchronized long cpuSamples() {
    return samplesPrepared;
  }

  @Override
  public int splitStep() {
    return Math.max(1, order.key.batchSize() / 16);
  }

  @Override
  public String describeOutput() {
    return " and output " + Arrays.toString(pipeline.sampleShape()) + " " + pipeline.dtype().wire()
        + " for the samples it prepares";
  }

  @Override
  public VectorSchemaRoot prepare(long pos, Staging staging) throws Exception {
    int[] ids = order.ids(pos);
    VectorSchemaRoot in = raw.fetch(pos, ids, staging);
    try {
      int m = Math.min(ids.length, cpuRows);
      if (m == 0) {
        return merged(in, null, 0, pos, staging);
      }
      try (VectorSchemaRoot head = in.slice(0, m);
          VectorSchemaRoot prepped = rows.decode(head, pos, Arrays.copyOf(ids, m), staging, false)) {
        return merged(in, prepped, m, pos, staging);
      }
    } finally {
      in.close();
    }
  }

  /**
   * The raw batch {@code in} with its first {@code m} payloads replaced by {@code prepped}'s rows, its payloads in a
   * slot when the group stages in shared memory ({@link RawBatches#restage}), and the other rows' vouched headers.
   */
  private VectorSchemaRoot merged(VectorSchemaRoot in, VectorSchemaRoot prepped, int m, long pos, Staging staging)
      throws IOException {
    int n = in.getRowCount();
    VectorSchemaRoot out = VectorSchemaRoot.create(SCHEMA, staging.allocator());
    try {
      ArrowBuf px = prepped == null ? null : ((FixedSizeBinaryVector) prepped.getVector(PrepSchema.TENSOR))
          .getDataBuffer();
      RawBatches.restage(in, out, px, m, (int) pipeline.sampleBytes(), pos, staging);
      BitVector prepared = (BitVector) out.getVector(PREPARED);
      prepared.allocateNew(n);
      for (int i = 0; i < n; i++) {
        prepared.set(i, i < m ? 1 : 0);
      }
      VouchedHeaders.fill((VarBinaryVector) out.getVector(BatchSchema.PAYLOAD), n,
          (BigIntVector) out.getVector(VouchedHeaders.COLUMN), m);
      out.setRowCount(n);
      synchronized (this) {
        samplesPrepared += m;
        samplesEncoded += n - m;
      }
      return out;
    } catch (IOException | RuntimeException | Error e) {
      out.close();
      throw e;
    }
  }

  @Override
  public void describe(ObjectNode join) {
    ObjectNode h = join.putObject("hybrid");
    h.put("cpu_load", auto ? "auto" : String.valueOf((double) cpuRows / order.key.batchSize()));
    SidecarPrep.describeOutput(h, pipeline);
  }

  @Override
  public void stats(ObjectNode o) {
    rows.stats(o);
    ObjectNode h = o.putObject("hybrid");
    h.put("auto", auto);
    h.put("cpu_rows", cpuRows);
    h.put("batch_size", order.key.batchSize());
    synchronized (this) {
      h.put("samples_prepared", samplesPrepared);
      h.put("samples_encoded", samplesEncoded);
    }
  }
}
