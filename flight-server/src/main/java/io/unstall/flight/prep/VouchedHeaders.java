package io.unstall.flight.prep;

import java.nio.ByteBuffer;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.types.pojo.ArrowType;
import org.apache.arrow.vector.types.pojo.Field;
import org.apache.arrow.vector.types.pojo.FieldType;

/**
 * The {@code header} column of a raw or hybrid prep batch (protocol/README.md, "Vouched headers"): for each row whose
 * payload is a JPEG that passes {@link ImageHeader}'s rules and that libjpeg takes, its header packed in one int64,
 * {@code width | height << 16 | standardTables << 32 | firstScan << 40}; null for any other row (another format, a
 * refused JPEG, the sidecar's prepared pixels). A member decoding on its device ({@code decode(device="mixed")})
 * skips the walk over a vouched row's bytes that python-shim's jpeg_rules would repeat on its trainer's feeding
 * thread, under the GIL, on the CPUs that mode is short of; the sidecar walks them here instead, in Java, on the prep
 * thread that assembled the batch (docs/BENCHMARKS.md, "Decode on the device, on the CPU", has both costs).
 */
final class VouchedHeaders {
  static final String COLUMN = "header";
  static final Field FIELD = new Field(COLUMN, FieldType.nullable(new ArrowType.Int(64, true)), null);
  /** A row the sidecar does not vouch for. */
  static final long NONE = -1;
  /** {@code firstScan}'s bits in the packed header: what is left of a non-negative int64. */
  private static final int FIRST_SCAN_BITS = 23;

  private VouchedHeaders() {}

  /**
   * The packed header of the JPEG {@code b} (position..limit; the buffer is not moved), or {@link #NONE}: not a JPEG,
   * refused by the header rules (any exception of the parser: a row it does not vouch for never fails its batch), left
   * to libjpeg to refuse ({@link ImageHeader#libjpegRefuses}), or a first scan beyond what the packing holds. Width and
   * height are 16-bit in the frame header, and the standard tables' slots fit 8 bits.
   */
  static long packed(ByteBuffer b) {
    if (ImageHeader.sniff(b) != ImageHeader.Format.JPEG) {
      return NONE;
    }
    ImageHeader h;
    try {
      h = ImageHeader.read(b);
    } catch (BadImageException | RuntimeException e) {
      return NONE;
    }
    if (h.libjpegRefuses() || h.firstScan() >= 1 << FIRST_SCAN_BITS) {
      return NONE;
    }
    return h.width() | (long) h.height() << 16 | (long) h.standardTables() << 32 | (long) h.firstScan() << 40;
  }

  /**
   * Fills {@code header} (allocated here) with the {@code n} rows of {@code payload}'s packed headers, read from the
   * bytes the members read; the first {@code from} rows (a hybrid batch's prepared pixels) are null.
   */
  static void fill(VarBinaryVector payload, int n, BigIntVector header, int from) {
    header.allocateNew(n);
    ArrowBuf data = payload.getDataBuffer();
    for (int i = 0; i < n; i++) {
      long start = payload.getStartOffset(i);
      long v = i < from ? NONE : packed(data.nioBuffer(start, (int) (payload.getEndOffset(i) - start)));
      if (v == NONE) {
        header.setNull(i);
      } else {
        header.set(i, v);
      }
    }
    header.setValueCount(n);
  }
}
