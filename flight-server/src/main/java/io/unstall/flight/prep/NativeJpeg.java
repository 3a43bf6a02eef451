package io.unstall.flight.prep;

import io.unstall.flight.prep.PrepPipeline.DType;
import io.unstall.flight.prep.PrepPipeline.Normalize;
import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.concurrent.atomic.LongAdder;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The JNI library {@code libunstall_jpeg.so} (src/main/c/unstall_jpeg.c): a JPEG decode of only the rows and
 * columns a crop keeps, at a reduced DCT scale when the crop is large enough, fused with resampling (Pillow's
 * bilinear filter), flip and conversion into the output tensor. The Maven build compiles it into the jar; it is
 * copied to a private temporary file and loaded once. When it is missing or does not load, {@link #AVAILABLE} is
 * false, one line says why, and {@link ImagePrep} uses OpenCV.
 */
public final class NativeJpeg {
  private static final Logger LOG = LoggerFactory.getLogger(NativeJpeg.class);
  static final String RESOURCE = "/native/linux-x86_64/libunstall_jpeg.so";
  /** What prep.stats calls the two decoders. */
  public static final String NAME = "libjpeg-turbo-crop";
  public static final String OPENCV = "opencv";

  /** Why the library is not in use (prep.stats' decoder_reason); null when it is. */
  public static final String PROBLEM = load();
  public static final boolean AVAILABLE = PROBLEM == null;

  /** Samples prepared by each path in this process (prep.stats "decode"). */
  static final LongAdder NATIVE_SAMPLES = new LongAdder();
  static final LongAdder OPENCV_SAMPLES = new LongAdder();

  /** The largest DCT scale denominator the fast path uses (libjpeg's 1/2, 1/4, 1/8). */
  static final int MAX_SCALE_DENOM = 8;
  /**
   * A DCT scale of 1/d only when the crop is at least REDUCING_GAP * d times the output in both dimensions, so the
   * resampling filter still antialiases what the reduced IDCT leaves (Pillow's reducing_gap; its thumbnail uses
   * 2.0). Error vs the full decode, measured in NativeJpegTest: docs/PREP.md.
   */
  static final double REDUCING_GAP = Double.parseDouble(System.getProperty("unstall.prep.reducing-gap", "2.0"));

  private NativeJpeg() {}

  private static String load() {
    if (OPENCV.equals(System.getProperty("unstall.prep.decoder"))) {
      return "forced by -Dunstall.prep.decoder=opencv";
    }
    String problem;
    try (InputStream in = NativeJpeg.class.getResourceAsStream(RESOURCE)) {
      if (in == null) {
        problem = "the jar was built without " + RESOURCE + " (the Maven build's line '[unstall] native JPEG prep"
            + " not built: ...' says why)";
      } else {
        Path tmp = Files.createTempFile("unstall_jpeg", ".so",
            PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rwx------")));
        try {
          Files.copy(in, tmp, StandardCopyOption.REPLACE_EXISTING);
          System.load(tmp.toString());
          problem = null;
        } finally {
          Files.deleteIfExists(tmp); // the loaded library stays mapped
        }
      }
    } catch (IOException | UnsatisfiedLinkError | SecurityException e) {
      problem = "loading " + RESOURCE + " failed: " + e.getMessage();
    }
    if (problem != null) {
      LOG.warn("native JPEG prep unavailable, preparing JPEGs with OpenCV (slower): {}", problem);
    }
    return problem;
  }

  /**
   * Decodes the JPEG {@code src} (position..limit, a direct buffer) and writes the output tensor at {@code dst}'s
   * position. {@code geom}: width, height (the header's), the clip window x0, y0, x1, y1 that bounds the filter,
   * output height, width, flip (0/1), NCHW (0/1), bytes per element, the largest DCT scale denominator (1: none),
   * window (0: decode every row and column, the reference). {@code box}: the source box x0, y0, x1, y1 in image
   * pixels, then the reducing gap. {@code lut}: 3 x 256 output values (RGB), for dtypes other than uint8. The
   * JPEG must not be CMYK (4 components). Throws BadImageException naming libjpeg's reason.
   */
  static native int run(ByteBuffer src, int srcPos, int srcLen, ByteBuffer dst, int dstPos, ByteBuffer lut,
      int[] geom, double[] box) throws BadImageException;

  /**
   * Rewrites the JPEG {@code src} (position {@code pos}, {@code len} bytes, a direct buffer) losslessly, the same
   * DCT coefficients as one sequential scan with a restart marker at least every {@code spanPx} pixels of an MCU
   * row, into this thread's native scratch; returns its length for {@link #takeReindexed}, or 0 when it cannot be
   * rewritten (the caller decodes the original). {@link #run} decodes such a copy's crop from only the restart
   * intervals the crop covers, to the same pixels as the original's.
   */
  static native int reindex(ByteBuffer src, int pos, int len, int spanPx);

  /** Copies this thread's last {@link #reindex} result ({@code len} bytes) into {@code dst} at {@code pos}. */
  static void takeReindexed(ByteBuffer dst, int pos, int len) {
    if (takeReindexed0(dst, pos, len) != 0) {
      throw new IllegalStateException("no rewritten JPEG of " + len + " bytes on this thread");
    }
  }

  private static native int takeReindexed0(ByteBuffer dst, int pos, int len);

  /**
   * Decodes the whole JPEG {@code src} ({@code len} bytes from {@code pos}, a direct buffer; its header's size
   * {@code width} x {@code height}) at 1/{@code denom} DCT scale into {@code dst} at {@code dstPos}: RGB rows of
   * {@link #scaledSize} pixels, the pixels {@link #run} decodes at that scale. Throws BadImageException naming
   * libjpeg's reason.
   */
  static native int decodeScaled(ByteBuffer src, int pos, int len, int width, int height, int denom, ByteBuffer dst,
      int dstPos, int dstW, int dstH) throws BadImageException;

  /**
   * {@link #run}'s resampling, flip and conversion on an image {@link #decodeScaled} kept ({@code sw} x {@code sh}
   * RGB pixels at {@code pxPos}, decoded at 1/{@code denom}); {@code geom} and {@code box} as for run, in the
   * original image's pixels. A kept image at the scale run picks for the box gives run's bytes.
   */
  static native int resample(ByteBuffer px, int pxPos, int sw, int sh, int denom, ByteBuffer dst, int dstPos,
      ByteBuffer lut, int[] geom, double[] box) throws BadImageException;

  /** libjpeg's output size of an {@code n}-pixel side at 1/{@code denom}: rounded up. */
  static int scaledSize(int n, int denom) {
    return (n + denom - 1) / denom;
  }

  /** How many {@link #run} calls in this process decoded only the restart intervals their crop covers. */
  static native long splicedDecodes();

  /** The DCT scale denominator run() picks for a box of bw x bh image pixels and an out_w x out_h output. */
  static native int scaleDenom(double bw, double bh, int outW, int outH, int maxDenom, double gap);

  /**
   * The table from an 8-bit channel value to the output element, per RGB channel (3 x 256, little-endian):
   * {@code (v / 255 - mean) / std} (or {@code v / 255} without normalize) in the float dtypes; null for uint8.
   */
  static ByteBuffer table(DType dtype, Normalize norm) {
    if (dtype == DType.UINT8) {
      return null;
    }
    ByteBuffer t = ByteBuffer.allocateDirect(3 * 256 * dtype.bytes).order(ByteOrder.LITTLE_ENDIAN);
    for (int c = 0; c < 3; c++) {
      double mean = norm == null ? 0 : norm.mean()[c];
      double std = norm == null ? 1 : norm.std()[c];
      for (int v = 0; v < 256; v++) {
        float x = (float) ((float) (v / 255f) - (float) mean) / (float) std; // torchvision's float32 steps
        switch (dtype) {
          case FLOAT32 -> t.putFloat(x);
          case FLOAT16 -> t.putShort(toFloat16(x));
          case BFLOAT16 -> t.putShort(toBfloat16(x));
          default -> throw new IllegalStateException(dtype.wire());
        }
      }
    }
    return t.flip();
  }

  /** IEEE binary16, round to nearest even (Float.floatToFloat16 from Java 20). */
  static short toFloat16(float f) {
    int bits = Float.floatToRawIntBits(f);
    int sign = (bits >>> 16) & 0x8000;
    int exp = (bits >>> 23) & 0xFF;
    int mant = bits & 0x7FFFFF;
    if (exp == 0xFF) {
      return (short) (sign | 0x7C00 | (mant != 0 ? 0x200 : 0));
    }
    int e = exp - 127 + 15;
    if (e >= 0x1F) {
      return (short) (sign | 0x7C00);
    }
    if (e <= 0) {
      if (e < -10) {
        return (short) sign;
      }
      mant |= 0x800000;
      int shift = 14 - e;
      int half = mant >>> shift;
      int rem = mant & ((1 << shift) - 1);
      int mid = 1 << (shift - 1);
      if (rem > mid || (rem == mid && (half & 1) != 0)) {
        half++;
      }
      return (short) (sign | half);
    }
    int half = (e << 10) | (mant >>> 13);
    int rem = mant & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1) != 0)) {
      half++; // may carry into the exponent, which is the correct rounding
    }
    return (short) (sign | half);
  }

  /** bfloat16: the upper half of the float32, round to nearest even. */
  static short toBfloat16(float f) {
    int bits = Float.floatToRawIntBits(f);
    if (Float.isNaN(f)) {
      return (short) ((bits >>> 16) | 0x40);
    }
    return (short) ((bits + 0x7FFF + ((bits >>> 16) & 1)) >>> 16);
  }
}
