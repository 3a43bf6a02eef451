package io.unstall.flight.prep;

import io.unstall.flight.BatchAssembler;
import io.unstall.flight.protocol.BatchSchema;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.rounding.RoundingPolicy;
import org.apache.arrow.vector.BaseVariableWidthVector;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.types.pojo.Field;
import org.apache.arrow.vector.types.pojo.Schema;

/**
 * The raw-batch source (a group joined without a pipeline): each batch is the encoded samples as a DoGet of the
 * dataset would send them, assembled through the data plane's tiers (cache, peers, storage), with each row's
 * {@link VouchedHeaders vouched header}. {@link SidecarPrep} and {@link HybridPrep} fetch with it too. A group that
 * stages in shared memory gets each batch with its payloads assembled in a /dev/shm slot (a hybrid batch's copied
 * there, {@link #restage}), which members map instead of receiving the bytes over gRPC.
 */
final class RawBatches implements BatchSource {
  /** The fetched batch schema and the {@code header} column. */
  static final Schema SCHEMA = rawSchema();

  private final BatchOrder order;
  private final BatchAssembler assembler;
  private final PrepCounts counts;
  private final long cost;
  private final long payloadBytes; // at most this many payload bytes in a batch: the largest sample's per row

  RawBatches(BatchOrder order, BatchAssembler assembler, RoundingPolicy rounding, PrepCounts counts) {
    this.order = order;
    this.assembler = assembler;
    this.counts = counts;
    int maxLen = 0;
    for (int i = 0; i < order.numSamples; i++) {
      maxLen = Math.max(maxLen, order.dataset.length(i));
    }
    int b = order.key.batchSize();
    this.payloadBytes = (long) maxLen * b;
    this.cost = rounding.getRoundedSize(Math.max(1L, payloadBytes)) + b * PrepGroup.ROW_OVERHEAD
        + PrepGroup.BATCH_OVERHEAD;
  }

  private static Schema rawSchema() {
    List<Field> fields = new ArrayList<>(BatchSchema.SCHEMA.getFields());
    fields.add(VouchedHeaders.FIELD);
    return new Schema(fields, BatchSchema.SCHEMA.getCustomMetadata());
  }

  @Override
  public String mode() {
    return "none";
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
    return 0; // in shared memory, the payloads are assembled straight into their slot
  }

  @Override
  public long slotBytes() {
    return Math.max(1L, payloadBytes);
  }

  @Override
  public VectorSchemaRoot prepare(long pos, Staging staging) throws IOException {
    int[] ids = order.ids(pos);
    VectorSchemaRoot fetched = !staging.shm()
        ? fetch(pos, ids, staging, null) // staged as fetched
        : fetch(pos, ids, staging, (payload, rows, bytes) -> staging.allocatePayload(payload, pos, rows, bytes));
    return withHeaders(fetched, staging);
  }

  /** The fetched batch {@code in} (its vectors, not copied) and the {@code header} column read from its payloads. */
  private static VectorSchemaRoot withHeaders(VectorSchemaRoot in, Staging staging) {
    int n = in.getRowCount();
    BigIntVector header = (BigIntVector) VouchedHeaders.FIELD.createVector(staging.allocator());
    try {
      VouchedHeaders.fill((VarBinaryVector) in.getVector(BatchSchema.PAYLOAD), n, header, 0);
    } catch (RuntimeException | Error e) {
      header.close();
      in.close();
      throw e;
    }
    List<FieldVector> vectors = new ArrayList<>(in.getFieldVectors());
    vectors.add(header);
    return new VectorSchemaRoot(SCHEMA, vectors, n);
  }

  /** Assembles the samples {@code ids} of position {@code pos} into staging. */
  VectorSchemaRoot fetch(long pos, int[] ids, Staging staging) throws IOException {
    return fetch(pos, ids, staging, null);
  }

  /** The same, the payloads straight into {@code memory} (a shared-memory slot) unless it is null. */
  private VectorSchemaRoot fetch(long pos, int[] ids, Staging staging, BatchAssembler.PayloadMemory memory)
      throws IOException {
    long t0 = System.nanoTime();
    BatchAssembler.Requester r = new BatchAssembler.Requester("prep-" + order.group, order.dataset.stats());
    VectorSchemaRoot raw = memory == null
        ? assembler.assemble(order.dataset, r, pos / order.numBatches, ids, staging.allocator())
        : assembler.assemble(order.dataset, r, pos / order.numBatches, ids, staging.allocator(), memory);
    counts.fetchNanos.addAndGet(System.nanoTime() - t0);
    return raw;
  }

  /**
   * Moves the fetched batch {@code in} to {@code out} (a {@link BatchSchema} root, maybe with more columns, that the
   * caller sets the row count of): its id, label and key columns are moved, its payloads copied once into the
   * payload memory staging gives the batch at {@code pos} (a slot when the group stages in shared memory). The first
   * {@code m} rows' payloads are instead the {@code sb}-byte rows of {@code px} (a hybrid batch's prepared pixels).
   */
  static void restage(VectorSchemaRoot in, VectorSchemaRoot out, ArrowBuf px, int m, int sb, long pos,
      Staging staging) throws IOException {
    int n = in.getRowCount();
    for (String column : new String[] {BatchSchema.ID, BatchSchema.LABEL, BatchSchema.KEY}) {
      in.getVector(column).makeTransferPair(out.getVector(column)).transfer();
    }
    VarBinaryVector src = (VarBinaryVector) in.getVector(BatchSchema.PAYLOAD);
    VarBinaryVector dst = (VarBinaryVector) out.getVector(BatchSchema.PAYLOAD);
    long head = (long) m * sb;
    long first = m < n ? src.getStartOffset(m) : 0; // the encoded rows lie together in src, from row m on
    long encoded = m < n ? src.getEndOffset(n - 1) - first : 0;
    staging.allocatePayload(dst, pos, n, head + encoded);
    ArrowBuf offsets = dst.getOffsetBuffer();
    ArrowBuf data = dst.getDataBuffer();
    if (m > 0) {
      data.setBytes(0, px, 0, head);
    }
    if (encoded > 0) {
      data.setBytes(head, src.getDataBuffer(), first, encoded);
    }
    for (int i = 0; i <= n; i++) {
      long at = i <= m ? (long) i * sb : head + src.getStartOffset(i) - first;
      offsets.setInt((long) i * BaseVariableWidthVector.OFFSET_WIDTH, (int) at);
    }
    for (int i = 0; i < n; i++) {
      dst.setIndexDefined(i);
    }
    dst.setLastSet(n - 1);
  }
}
