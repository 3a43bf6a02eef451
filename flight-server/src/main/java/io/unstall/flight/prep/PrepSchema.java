package io.unstall.flight.prep;

import io.unstall.flight.protocol.BatchSchema;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import org.apache.arrow.vector.types.pojo.ArrowType;
import org.apache.arrow.vector.types.pojo.Field;
import org.apache.arrow.vector.types.pojo.FieldType;
import org.apache.arrow.vector.types.pojo.Schema;

/**
 * The schema of a prepared batch (protocol/README.md, "Prepared batches"): one row per sample with its id,
 * label and tensor. The tensors are one FixedSizeBinary column, so the batch's data buffer is the contiguous
 * {@code [n, *shape]} array a client views as numpy/torch without copying; shape, dtype and layout are in the
 * schema metadata.
 */
public final class PrepSchema {
  public static final String ID = "id";
  public static final String LABEL = "label";
  public static final String TENSOR = "tensor";
  public static final String SHAPE = "unstall.prep.shape";
  public static final String DTYPE = "unstall.prep.dtype";
  public static final String LAYOUT = "unstall.prep.layout";
  public static final String FINGERPRINT = "unstall.prep.fingerprint";
  /**
   * On a batch that left samples out (decode on_error "skip"): a JSON list of {@code {"id","key","reason"}}, one
   * per sample skipped; the batch's rows are the other samples, in order.
   */
  public static final String SKIPPED = "unstall.prep.skipped";

  private PrepSchema() {}

  public static Schema of(PrepPipeline p) {
    String shape = Arrays.toString(p.sampleShape()).replace(" ", "");
    return new Schema(
        List.of(
            new Field(ID, FieldType.notNullable(new ArrowType.Int(64, true)), null),
            new Field(LABEL, FieldType.nullable(new ArrowType.Int(64, true)), null),
            new Field(
                TENSOR,
                FieldType.notNullable(new ArrowType.FixedSizeBinary(Math.toIntExact(p.sampleBytes()))),
                null)),
        Map.of(
            "unstall.schema", "1",
            SHAPE, shape,
            DTYPE, p.dtype().wire(),
            LAYOUT, p.layout().name(),
            FINGERPRINT, p.fingerprint()));
  }

  static {
    if (!BatchSchema.ID.equals(ID) || !BatchSchema.LABEL.equals(LABEL)) {
      throw new AssertionError("id/label column names must match the FETCH batch schema");
    }
  }
}
