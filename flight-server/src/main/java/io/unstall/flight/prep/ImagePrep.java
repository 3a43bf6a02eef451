package io.unstall.flight.prep;

import static io.unstall.flight.prep.ImageHeader.DECODED_CHANNELS;

import io.unstall.flight.prep.PrepPipeline.CenterCrop;
import io.unstall.flight.prep.PrepPipeline.DType;
import io.unstall.flight.prep.PrepPipeline.Decode;
import io.unstall.flight.prep.PrepPipeline.HFlip;
import io.unstall.flight.prep.PrepPipeline.Layout;
import io.unstall.flight.prep.PrepPipeline.Normalize;
import io.unstall.flight.prep.PrepPipeline.Op;
import io.unstall.flight.prep.PrepPipeline.RandomResizedCrop;
import io.unstall.flight.prep.PrepPipeline.Resize;
import io.unstall.flight.cache.Digest;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.SplittableRandom;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import org.bytedeco.javacpp.BytePointer;
import org.bytedeco.opencv.global.opencv_core;

/**
 * Runs a {@link PrepPipeline} on one encoded image. JPEGs go through {@link NativeJpeg} when it is loaded and the
 * pipeline's spatial ops are one it expresses (a random_resized_crop, a resize, a resize then center_crop, or a
 * center_crop, with hflips and a final normalize): only the rows and columns the crop keeps are decoded, at a
 * reduced DCT scale when the crop is at least 2, 4 or 8 times the output, and resampled with Pillow's bilinear
 * filter straight into the output tensor. Everything else (PNG, WebP, CMYK or EXIF-carrying JPEGs, other op
 * sequences, a center_crop that pads) goes through OpenCV (libjpeg-turbo inside): decode, crops and resizes on the
 * BGR image, then one pass that writes RGB into the output tensor in its layout and dtype.
 * The random choices come from a generator seeded by (seed, epoch, sample id) alone, so a sample gets the same
 * crop and flip whichever thread, group member or run prepares it.
 *
 * <p>The bytes are untrusted. Before the native decoder sees them, the header is read ({@link ImageHeader}): the
 * format must be one the pipeline names (OpenCV would pick any decoder it has by the magic bytes), the declared
 * size within the pipeline's pixel and aspect-ratio caps, and the memory the sample needs while it is decoded and
 * transformed ({@link #workingBytes}) is reserved in the {@link DecodeBudget} first, so prep threads wait for
 * each other instead of decoding several huge images at once. A Motion-JPEG frame, which leaves out the standard
 * Huffman tables it uses, is decoded from a copy that defines them ({@link StandardHuffmanTables}), reserved with
 * the working memory in one reservation. The cache forms made on the way ({@link DecodedImages},
 * {@link ReindexedJpegs}) take their working memory only if it is there now ({@link DecodeBudget#tryAcquire}).
 */
public final class ImagePrep {
  static {
    OpenCv.load();
    opencv_core.setNumThreads(0); // the prep pool parallelizes across samples; OpenCV's own threads would oversubscribe
  }

  private static final ThreadMXBean CPU = ManagementFactory.getThreadMXBean();

  /** libjpeg/libpng row buffers and tables, per image, on top of the pixels. */
  static final long DECODER_OVERHEAD = 256 << 10;

  /** Which path prepares the JPEGs the native path can take. */
  enum Decoder {
    OPENCV,
    /** The native path without its savings (every row and column, full DCT scale): the reference in tests. */
    NATIVE_FULL,
    NATIVE
  }

  private final PrepPipeline pipeline;
  private final Decode decode;
  private final DecodeBudget budget;
  private final ReindexedJpegs reindexed; // null: decode the bytes as given
  private final DecodedImages decoded; // null: no decoded form
  private final DecodedImages.Measured measured; // this pipeline's CPU per sample on each path, every group
  private final Decoder decoder;
  private final String decoderReason; // why OpenCV prepares this pipeline's JPEGs; null when the native path does
  /** The native path's output table (3 x 256 elements; null for uint8). */
  private final ByteBuffer table;
  private final OpenCvTransform openCv;

  public ImagePrep(PrepPipeline pipeline, DecodeBudget budget) {
    this(pipeline, budget, null);
  }

  /** {@code reindexed}: where the native path keeps restart-indexed copies of the JPEGs it decodes (null: none). */
  ImagePrep(PrepPipeline pipeline, DecodeBudget budget, ReindexedJpegs reindexed) {
    this(pipeline, budget, Decoder.NATIVE, reindexed, null);
  }

  ImagePrep(PrepPipeline pipeline, DecodeBudget budget, Decoder decoder, ReindexedJpegs reindexed) {
    this(pipeline, budget, decoder, reindexed, null);
  }

  /** {@code decoded}: where JPEGs may be kept as pixels (the decoded form; null: none). */
  ImagePrep(PrepPipeline pipeline, DecodeBudget budget, Decoder decoder, ReindexedJpegs reindexed,
      DecodedImages decoded) {
    this.pipeline = pipeline;
    this.decode = pipeline.decode();
    this.budget = budget;
    this.reindexed = reindexed;
    this.decoded = decoded;
    this.measured = decoded == null ? new DecodedImages.Measured() : decoded.measured(pipeline.fingerprint());
    this.decoderReason = openCvReason(pipeline, decoder);
    this.decoder = decoderReason == null ? decoder : Decoder.OPENCV;
    this.table = NativeJpeg.table(pipeline.dtype(), normalize(pipeline));
    this.openCv = new OpenCvTransform(pipeline, table);
  }

  PrepPipeline pipeline() {
    return pipeline;
  }

  /** The decoder this pipeline's JPEGs go through, as prep.stats names it. */
  public String decoderName() {
    return decoder == Decoder.OPENCV ? NativeJpeg.OPENCV : NativeJpeg.NAME;
  }

  /** Why OpenCV prepares this pipeline's JPEGs (prep.stats' decoder_reason); null when the native path does. */
  public String decoderReason() {
    return decoderReason;
  }

  /** "libjpeg-turbo-crop", or "opencv (why)": which decoder a sidecar group of {@code p} prepares with, for logs. */
  static String describeDecoder(PrepPipeline p) {
    String why = openCvReason(p, Decoder.NATIVE);
    return why == null ? NativeJpeg.NAME : NativeJpeg.OPENCV + " (" + why + ")";
  }

  /** Why {@code p}'s JPEGs go through OpenCV when {@code asked} is wanted; null when they take the native path. */
  private static String openCvReason(PrepPipeline p, Decoder asked) {
    if (!NativeJpeg.AVAILABLE) {
      return NativeJpeg.PROBLEM;
    }
    if (asked == Decoder.OPENCV) {
      return "asked for by the caller";
    }
    return nativeOps(p) ? null : "the native path lacks the pipeline's " + spatialOps(p) + "; it takes"
        + " random_resized_crop, resize, resize then center_crop, or center_crop";
  }

  /**
   * Whether the native path expresses the pipeline's spatial ops: exactly one of random_resized_crop, resize,
   * resize then center_crop, or center_crop (hflips anywhere, normalize last). Two resamplings in a row would
   * differ from one.
   */
  static boolean nativeOps(PrepPipeline p) {
    List<Class<?>> spatial = spatialOpClasses(p);
    return spatial.equals(List.of(RandomResizedCrop.class)) || spatial.equals(List.of(Resize.class))
        || spatial.equals(List.of(Resize.class, CenterCrop.class)) || spatial.equals(List.of(CenterCrop.class));
  }

  private static List<Class<?>> spatialOpClasses(PrepPipeline p) {
    List<Class<?>> spatial = new ArrayList<>();
    for (Op op : p.ops()) {
      if (op instanceof RandomResizedCrop || op instanceof Resize || op instanceof CenterCrop) {
        spatial.add(op.getClass());
      }
    }
    return spatial;
  }

  /** "resize then random_resized_crop", "no resize or crop": the spatial ops as the pipeline's document names them. */
  private static String spatialOps(PrepPipeline p) {
    List<String> names = new ArrayList<>();
    for (Class<?> c : spatialOpClasses(p)) {
      names.add(c.getSimpleName().replaceAll("([a-z])([A-Z])", "$1_$2").toLowerCase(Locale.ROOT));
    }
    return names.isEmpty() ? "no resize or crop" : String.join(" then ", names);
  }

  private static Normalize normalize(PrepPipeline p) {
    for (Op op : p.ops()) {
      if (op instanceof Normalize nz) {
        return nz;
      }
    }
    return null;
  }

  /** The generator for one sample: a SplitMix64 hash of (seed, epoch, id). */
  public static SplittableRandom rng(long seed, long epoch, long sampleId) {
    long h = mix(seed ^ 0x9E3779B97F4A7C15L);
    h = mix(h ^ epoch);
    h = mix(h ^ sampleId);
    return new SplittableRandom(h);
  }

  static long mix(long z) {
    z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
    z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
    return z ^ (z >>> 31);
  }

  /**
   * Checks the header of {@code encoded} against the pipeline's formats and caps; returns it. Nothing is decoded.
   */
  public ImageHeader check(ByteBuffer encoded) throws BadImageException {
    ImageHeader.Format f = ImageHeader.sniff(encoded);
    if (f == null || !decode.formats().contains(f)) {
      String what = ImageHeader.describe(encoded);
      throw new BadImageException(what == null ? ImageHeader.notAnImage(encoded)
          : what + ", not one of the formats the pipeline decodes: " + decode.formatNames() + " (decode \"formats\")");
    }
    ImageHeader h = ImageHeader.read(encoded);
    if (h.pixels() > decode.maxPixels()) {
      throw new BadImageException("decompression bomb? the " + f.wire() + " header declares " + h.width() + "x"
          + h.height() + " pixels (" + h.pixels() + "), above the cap of " + decode.maxPixels()
          + " (--max-decode-pixels / decode max_pixels)");
    }
    if (h.aspectRatio() > decode.maxAspectRatio()) {
      double cap = decode.maxAspectRatio();
      throw new BadImageException("the " + f.wire() + " header declares " + h.width() + "x" + h.height()
          + " pixels, an aspect ratio of " + String.format(Locale.ROOT, "%.1f", h.aspectRatio()) + ", above the cap of "
          + (cap == Math.rint(cap) ? Long.toString((long) cap) : Double.toString(cap))
          + " (--max-decode-aspect-ratio / decode max_aspect_ratio)");
    }
    return h;
  }

  /**
   * Decodes and transforms {@code encoded} (a direct buffer, position..limit) and writes the sample's tensor
   * into {@code out} at its position ({@link PrepPipeline#sampleBytes()} bytes, little-endian). Waits in the
   * decode budget for the memory the sample needs.
   */
  public void run(ByteBuffer encoded, SplittableRandom rng, ByteBuffer out)
      throws BadImageException, InterruptedException {
    run(encoded, null, rng, out);
  }

  /**
   * {@link #run(ByteBuffer, SplittableRandom, ByteBuffer)} of a sample whose bytes hash to {@code digest} (null:
   * unknown): the native path decodes its restart-indexed copy when there is one (or makes it), which gives the
   * same pixels from less work.
   */
  public void run(ByteBuffer encoded, Digest digest, SplittableRandom rng, ByteBuffer out)
      throws BadImageException, InterruptedException {
    ImageHeader h = check(encoded);
    boolean frame = h.standardTables() != 0;
    boolean nat = takesNative(h) && (frame || encoded.isDirect()) && out.isDirect(); // a frame's copy is direct
    if (!frame) {
      prepare(encoded, h, nat, false, digest, rng, out);
      return;
    }
    // A Motion-JPEG frame: every path (and cache form) decodes a copy that defines the standard Huffman tables the
    // frame relies on; the sample keeps the digest of its own bytes. The copy is native memory of the decode, live
    // with its working memory: one reservation holds both, so the thread never waits holding the copy's.
    int n = StandardHuffmanTables.copyBytes(h, encoded);
    try (DecodeBudget.Reservation r = budget.acquire(n + workingBytes(h, nat), "the Motion-JPEG frame "
        + h.describe() + " (a copy of " + n + " bytes with the standard Huffman tables, and its decode)");
        BytePointer copy = new BytePointer(n)) {
      ByteBuffer b = copy.asByteBuffer();
      StandardHuffmanTables.insert(encoded, h, b);
      prepare(b.flip(), h, nat, true, digest, rng, out);
    }
  }

  /**
   * {@link #run(ByteBuffer, Digest, SplittableRandom, ByteBuffer)} of bytes whose header {@code h} passed, on the
   * native path ({@code nat}) or OpenCV's; {@code held}: the thread already holds the sample's
   * {@link #workingBytes(ImageHeader, boolean)}.
   */
  private void prepare(ByteBuffer encoded, ImageHeader h, boolean nat, boolean held, Digest digest,
      SplittableRandom rng, ByteBuffer out) throws BadImageException, InterruptedException {
    if (nat) {
      long cpu0 = CPU.getCurrentThreadCpuTime();
      int d = decoded == null ? 0 : DecodedImages.denom(h, pipeline);
      boolean wasKept = d > 0 && decoded.has(digest, d);
      DecodedImages.Image kept = d == 0 ? null : decoded.forResample(digest, encoded, h, d, budget);
      boolean fromKept = false;
      try (DecodeBudget.Reservation r = working(h, true, held)) {
        Geometry g = geometry(h, rng);
        // The kept pixels serve the crops the encoded path decodes at their very scale (the same bytes); any other
        // crop is decoded from the encoded bytes, so a sample's tensor never depends on which form was there.
        fromKept = kept != null && NativeJpeg.scaleDenom(g.box[2] - g.box[0], g.box[3] - g.box[1], pipeline.width(),
            pipeline.height(), g.geom[11], g.box[4]) == kept.denom();
        if (fromKept) {
          NativeJpeg.resample(kept.pixels(), 0, kept.width(), kept.height(), kept.denom(), out, out.position(), table,
              g.geom, g.box);
        } else {
          ByteBuffer src = reindexed == null ? encoded : reindexed.forDecode(digest, encoded, h, budget);
          NativeJpeg.run(src, src.position(), src.remaining(), out, out.position(), table, g.geom, g.box);
        }
      }
      // A sample decoded into the store now, or whose crop the kept pixels do not serve, counts as prepared from the
      // encoded bytes (a whole-image decode: an upper bound of the crop's).
      measured.add(wasKept && fromKept, CPU.getCurrentThreadCpuTime() - cpu0, encoded.remaining(),
          d > 0 ? DecodedImages.bytes(h, d) : 0);
      NativeJpeg.NATIVE_SAMPLES.increment();
      return;
    }
    NativeJpeg.OPENCV_SAMPLES.increment();
    try (DecodeBudget.Reservation r = working(h, false, held)) {
      openCv.run(encoded, h, rng, out);
    }
  }

  /** The sample's working memory on the native path ({@code nat}) or OpenCV's, reserved now unless {@code held}. */
  private DecodeBudget.Reservation working(ImageHeader h, boolean nat, boolean held)
      throws BadImageException, InterruptedException {
    return held ? () -> { } : budget.acquire(workingBytes(h, nat), h);
  }

  /** The memory the sample holds at once on the native path ({@code nat}) or OpenCV's. */
  long workingBytes(ImageHeader h, boolean nat) {
    return nat ? nativeWorkingBytes(h) : workingBytes(h);
  }

  /**
   * An upper bound of the native memory one sample holds at once while it is decoded and transformed: the
   * decoder's (the image, a rotated copy, libjpeg's coefficients), then at each op its input and output image,
   * then the output pass's temporaries. The output tensor itself is staging memory, counted elsewhere.
   */
  long workingBytes(ImageHeader header) {
    long h = header.height();
    long w = header.width();
    long cur = h * w * DECODED_CHANNELS;
    long peak = header.decoderBytes();
    for (Op op : pipeline.ops()) {
      long extra = 0;
      if (op instanceof RandomResizedCrop c) {
        h = c.height();
        w = c.width();
      } else if (op instanceof Resize r) {
        long[] hw = SpatialOps.resizedSize(r, h, w);
        h = hw[0];
        w = hw[1];
      } else if (op instanceof CenterCrop c) {
        if (h < c.height() || w < c.width()) {
          extra = Math.max(h, c.height()) * Math.max(w, c.width()) * DECODED_CHANNELS; // the zero-padded copy
        }
        h = c.height();
        w = c.width();
      } else if (!(op instanceof HFlip)) {
        continue; // decode (counted above), normalize (in the output pass)
      }
      long next = h * w * DECODED_CHANNELS;
      peak = Math.max(peak, cur + extra + next);
      cur = next;
    }
    long px = h * w;
    long out = pipeline.layout() == Layout.NCHW
        ? px // one uint8 plane at a time
        // RGB, then float image, scale, shift
        : px * DECODED_CHANNELS * (pipeline.dtype() == DType.UINT8 ? 1 : 1 + 3 * 4);
    return Math.max(peak, cur + out) + DECODER_OVERHEAD;
  }

  /**
   * Whether this sample goes through the native path: a JPEG in YCbCr, RGB or grayscale (OpenCV converts CMYK),
   * without EXIF (OpenCV applies its orientation; the native path does not read it), and no center_crop that
   * would pad.
   */
  boolean takesNative(ImageHeader h) {
    if (decoder == Decoder.OPENCV || h.format() != ImageHeader.Format.JPEG || h.exif() || h.components() == 4) {
      return false;
    }
    long ch = h.height();
    long cw = h.width();
    for (Op op : pipeline.ops()) {
      if (op instanceof Resize r) {
        long[] hw = SpatialOps.resizedSize(r, ch, cw);
        ch = hw[0];
        cw = hw[1];
      } else if (op instanceof CenterCrop c) {
        if (ch < c.height() || cw < c.width()) {
          return false;
        }
      }
    }
    return true;
  }

  /** Every DCT coefficient of the image at once (a multi-scan decode, a lossless rewrite), at most. */
  static long coefficientBytes(ImageHeader h) {
    return h.pixels() * h.components() * 2;
  }

  /**
   * An upper bound of the native path's memory for one sample: libjpeg's whole-image coefficients (multi-scan
   * JPEGs), its row buffers (an iMCU row group with context: at most 48 rows of the image's width), the
   * horizontally resampled rows (at most every row, output width), the resampling coefficients and
   * libjpeg's tables.
   */
  long nativeWorkingBytes(ImageHeader h) {
    long w = h.width();
    long ht = h.height();
    long coefficients = h.multiScan() ? coefficientBytes(h) : 0;
    long rows = w * DECODED_CHANNELS * 49;
    long resampled = ht * pipeline.width() * DECODED_CHANNELS;
    long taps = 2 * (Math.max(w, ht) / Math.max(1, Math.min(pipeline.width(), pipeline.height())) + 2) + 1;
    long kernels = (pipeline.width() + pipeline.height()) * (taps * 12 + 8) + pipeline.width() * DECODED_CHANNELS * 5;
    return coefficients + rows + resampled + kernels + DECODER_OVERHEAD;
  }

  /** This pipeline's measured rates for the cost model ({@link DecodedImages.Measured#rates}). */
  double[] rates() {
    return measured.rates();
  }

  /**
   * The native path: walks the ops as the OpenCV path does (the same random draws in the same order) but only
   * composes the geometry (the source box, the window that bounds the filter, the flip), then decodes, resamples
   * and writes in one native call.
   */
  /** {@link NativeJpeg#run}'s geom and box arguments for one sample. */
  private record Geometry(int[] geom, double[] box) {}

  /** The sample's geometry in the image's pixels: the random draws, in the OpenCV path's order. */
  private Geometry geometry(ImageHeader h, SplittableRandom rng) {
    int width = h.width();
    int height = h.height();
    double bx0 = 0;
    double by0 = 0;
    double bx1 = width;
    double by1 = height;
    int cx0 = 0;
    int cy0 = 0;
    int cx1 = width;
    int cy1 = height;
    long curH = height;
    long curW = width;
    boolean flip = false;
    for (Op op : pipeline.ops()) {
      if (op instanceof RandomResizedCrop c) { // the only spatial op (nativeOps): cur is the image
        int[] r = SpatialOps.cropParams(height, width, c, rng);
        int left = flip ? width - r[1] - r[3] : r[1];
        cx0 = left;
        cx1 = left + r[3];
        cy0 = r[0];
        cy1 = r[0] + r[2];
        bx0 = cx0;
        bx1 = cx1;
        by0 = cy0;
        by1 = cy1;
        curH = c.height();
        curW = c.width();
      } else if (op instanceof Resize r) { // the whole image, resampled: its box stays the image
        long[] hw = SpatialOps.resizedSize(r, curH, curW);
        curH = hw[0];
        curW = hw[1];
      } else if (op instanceof CenterCrop c) { // a window of the (virtually) resized image; takesNative: no pad
        long top = (long) Math.rint((curH - c.height()) / 2.0); // Python round(): half to even, as torchvision
        long left = (long) Math.rint((curW - c.width()) / 2.0);
        if (flip) {
          left = curW - left - c.width();
        }
        double sx = (bx1 - bx0) / curW;
        double sy = (by1 - by0) / curH;
        double nx0 = bx0 + left * sx;
        double ny0 = by0 + top * sy;
        bx1 = bx0 + (left + c.width()) * sx;
        by1 = by0 + (top + c.height()) * sy;
        bx0 = nx0;
        by0 = ny0;
        curH = c.height();
        curW = c.width();
      } else if (op instanceof HFlip f) {
        if (rng.nextDouble() < f.p()) {
          flip = !flip;
        }
      }
    }
    boolean full = decoder == Decoder.NATIVE_FULL;
    int[] geom = {width, height, cx0, cy0, cx1, cy1, pipeline.height(), pipeline.width(), flip ? 1 : 0,
        pipeline.layout() == Layout.NCHW ? 1 : 0, pipeline.dtype().bytes, full ? 1 : NativeJpeg.MAX_SCALE_DENOM,
        full ? 0 : 1};
    return new Geometry(geom, new double[] {bx0, by0, bx1, by1, NativeJpeg.REDUCING_GAP});
  }
}
