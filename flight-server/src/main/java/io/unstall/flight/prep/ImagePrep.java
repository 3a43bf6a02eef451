package io.unstall.flight.prep;

import static org.bytedeco.opencv.global.opencv_core.BORDER_CONSTANT;
import static org.bytedeco.opencv.global.opencv_core.CV_32FC1;
import static org.bytedeco.opencv.global.opencv_core.CV_32FC3;
import static org.bytedeco.opencv.global.opencv_core.CV_8UC1;
import static org.bytedeco.opencv.global.opencv_core.CV_8UC3;
import static org.bytedeco.opencv.global.opencv_core.add;
import static org.bytedeco.opencv.global.opencv_core.extractChannel;
import static org.bytedeco.opencv.global.opencv_core.multiply;
import static org.bytedeco.opencv.global.opencv_core.copyMakeBorder;
import static org.bytedeco.opencv.global.opencv_core.flip;
import static org.bytedeco.opencv.global.opencv_imgcodecs.IMREAD_COLOR;
import static org.bytedeco.opencv.global.opencv_imgcodecs.imdecode;
import static org.bytedeco.opencv.global.opencv_imgproc.COLOR_BGR2RGB;
import static org.bytedeco.opencv.global.opencv_imgproc.INTER_AREA;
import static org.bytedeco.opencv.global.opencv_imgproc.cvtColor;
import static org.bytedeco.opencv.global.opencv_imgproc.INTER_LINEAR;
import static org.bytedeco.opencv.global.opencv_imgproc.resize;

import io.unstall.flight.prep.PrepPipeline.CenterCrop;
import io.unstall.flight.prep.PrepPipeline.DType;
import io.unstall.flight.prep.PrepPipeline.HFlip;
import io.unstall.flight.prep.PrepPipeline.Layout;
import io.unstall.flight.prep.PrepPipeline.Normalize;
import io.unstall.flight.prep.PrepPipeline.Op;
import io.unstall.flight.prep.PrepPipeline.RandomResizedCrop;
import io.unstall.flight.prep.PrepPipeline.Resize;
import java.nio.ByteBuffer;
import java.util.SplittableRandom;
import org.bytedeco.javacpp.BytePointer;
import org.bytedeco.opencv.global.opencv_core;
import org.bytedeco.opencv.opencv_core.Mat;
import org.bytedeco.opencv.opencv_core.Rect;
import org.bytedeco.opencv.opencv_core.Scalar;
import org.bytedeco.opencv.opencv_core.Size;

/**
 * Runs a {@link PrepPipeline} on one encoded image with OpenCV (libjpeg-turbo inside): decode, crops and
 * resizes on the BGR image, then one pass that writes RGB into the output tensor in its layout and dtype.
 * The random choices come from a generator seeded by (seed, epoch, sample id) alone, so a sample gets the same
 * crop and flip whichever thread, group member or run prepares it.
 */
public final class ImagePrep {
  static {
    opencv_core.setNumThreads(0); // the prep pool parallelizes across samples; OpenCV's own threads would oversubscribe
  }

  private final PrepPipeline pipeline;

  public ImagePrep(PrepPipeline pipeline) {
    this.pipeline = pipeline;
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

  /** Thrown for bytes that are not a JPEG/PNG (or another format OpenCV decodes). */
  public static final class UndecodableImageException extends java.io.IOException {
    public UndecodableImageException(String message) {
      super(message);
    }
  }

  /**
   * Decodes and transforms {@code encoded} (a direct buffer, position..limit) and writes the sample's tensor
   * into {@code out} at its position ({@link PrepPipeline#sampleBytes()} bytes, little-endian).
   */
  public void run(ByteBuffer encoded, SplittableRandom rng, ByteBuffer out) throws UndecodableImageException {
    Mat img;
    try (BytePointer p = new BytePointer(encoded); Mat buf = new Mat(1, encoded.remaining(), CV_8UC1, p)) {
      img = imdecode(buf, IMREAD_COLOR);
    }
    if (img == null || img.empty()) {
      throw new UndecodableImageException("not a decodable image (JPEG/PNG expected), " + encoded.remaining() + " bytes");
    }
    try {
      for (Op op : pipeline.ops()) {
        Mat next = apply(op, img, rng);
        if (next != img) {
          img.close();
          img = next;
        }
      }
      write(img, out);
    } finally {
      img.close();
    }
  }

  private Mat apply(Op op, Mat img, SplittableRandom rng) {
    if (op instanceof RandomResizedCrop c) {
      int[] r = cropParams(img.rows(), img.cols(), c, rng);
      try (Rect rect = new Rect(r[1], r[0], r[3], r[2]); Mat roi = new Mat(img, rect)) {
        return resized(roi, c.height(), c.width());
      }
    }
    if (op instanceof Resize r) {
      int h = r.height();
      int w = r.width();
      if (r.shorter() > 0) {
        int ih = img.rows();
        int iw = img.cols();
        if (ih <= iw) {
          h = r.shorter();
          w = (int) ((long) r.shorter() * iw / ih);
        } else {
          w = r.shorter();
          h = (int) ((long) r.shorter() * ih / iw);
        }
      }
      return resized(img, h, w);
    }
    if (op instanceof CenterCrop c) {
      Mat src = img;
      Mat padded = null;
      if (img.rows() < c.height() || img.cols() < c.width()) { // pad with zeros, as torchvision does
        int dh = Math.max(0, c.height() - img.rows());
        int dw = Math.max(0, c.width() - img.cols());
        padded = new Mat();
        try (Scalar black = new Scalar(0.0)) {
          copyMakeBorder(img, padded, dh / 2, dh - dh / 2, dw / 2, dw - dw / 2, BORDER_CONSTANT, black);
        }
        src = padded;
      }
      int top = (int) Math.round((src.rows() - c.height()) / 2.0);
      int left = (int) Math.round((src.cols() - c.width()) / 2.0);
      try (Rect rect = new Rect(left, top, c.width(), c.height()); Mat roi = new Mat(src, rect)) {
        return roi.clone();
      } finally {
        if (padded != null) {
          padded.close();
        }
      }
    }
    if (op instanceof HFlip f) {
      if (rng.nextDouble() < f.p()) {
        Mat dst = new Mat();
        flip(img, dst, 1);
        return dst;
      }
      return img;
    }
    return img; // decode (done before) and normalize (done in write)
  }

  private static Mat resized(Mat src, int h, int w) {
    Mat dst = new Mat();
    // INTER_AREA when shrinking: antialiased like torchvision/PIL; bilinear when enlarging.
    int interp = (h < src.rows() && w < src.cols()) ? INTER_AREA : INTER_LINEAR;
    try (Size size = new Size(w, h)) {
      resize(src, dst, size, 0, 0, interp);
    }
    return dst;
  }

  /** torchvision.transforms.RandomResizedCrop.get_params: returns {top, left, height, width}. */
  static int[] cropParams(int height, int width, RandomResizedCrop c, SplittableRandom rng) {
    double area = (double) height * width;
    double logMin = Math.log(c.ratioMin());
    double logMax = Math.log(c.ratioMax());
    for (int attempt = 0; attempt < 10; attempt++) {
      double target = area * uniform(rng, c.scaleMin(), c.scaleMax());
      double aspect = Math.exp(uniform(rng, logMin, logMax));
      int w = (int) Math.round(Math.sqrt(target * aspect));
      int h = (int) Math.round(Math.sqrt(target / aspect));
      if (w > 0 && w <= width && h > 0 && h <= height) {
        int top = rng.nextInt(height - h + 1);
        int left = rng.nextInt(width - w + 1);
        return new int[] {top, left, h, w};
      }
    }
    // Fallback: a central crop with the ratio clamped into range.
    double inRatio = (double) width / height;
    int w;
    int h;
    if (inRatio < c.ratioMin()) {
      w = width;
      h = (int) Math.round(w / c.ratioMin());
    } else if (inRatio > c.ratioMax()) {
      h = height;
      w = (int) Math.round(h * c.ratioMax());
    } else {
      w = width;
      h = height;
    }
    h = Math.max(1, Math.min(h, height));
    w = Math.max(1, Math.min(w, width));
    return new int[] {(height - h) / 2, (width - w) / 2, h, w};
  }

  private static double uniform(SplittableRandom rng, double lo, double hi) {
    return lo == hi ? lo : lo + (hi - lo) * rng.nextDouble();
  }

  /** BGR uint8 HWC (OpenCV) to the output tensor: RGB, the pipeline's layout and dtype, normalized. */
  private void write(Mat img, ByteBuffer out) {
    int h = pipeline.height();
    int w = pipeline.width();
    if (img.rows() != h || img.cols() != w || img.channels() != 3) {
      throw new IllegalStateException("prep produced " + img.rows() + "x" + img.cols() + "x" + img.channels()
          + ", expected " + h + "x" + w + "x3"); // parse() guarantees the last spatial op fixes the size
    }
    int n = h * w;
    boolean nchw = pipeline.layout() == Layout.NCHW;
    float[] scale = new float[3];
    float[] shift = new float[3];
    Normalize norm = null;
    for (Op op : pipeline.ops()) {
      if (op instanceof Normalize nz) {
        norm = nz;
      }
    }
    boolean u8 = pipeline.dtype() == DType.UINT8;
    for (int c = 0; c < 3; c++) {
      double mean = norm == null ? 0 : norm.mean()[c];
      double std = norm == null ? 1 : norm.std()[c];
      scale[c] = u8 ? 1f : (float) (1.0 / (255.0 * std));
      shift[c] = u8 ? 0f : (float) (-mean / std);
    }
    int type = u8 ? CV_8UC1 : CV_32FC1;
    int planeBytes = n * pipeline.dtype().bytes;
    // OpenCV writes straight into the output buffer through Mats that wrap it (no Java-side pixel loop).
    try (BytePointer dst = new BytePointer(out.slice())) {
      if (nchw) {
        try (Mat plane = new Mat(h, w, CV_8UC1)) {
          for (int c = 0; c < 3; c++) {
            extractChannel(img, plane, 2 - c); // BGR -> RGB
            try (BytePointer at = new BytePointer(dst).position((long) c * planeBytes);
                Mat o = new Mat(h, w, type, at)) {
              plane.convertTo(o, type, scale[c], shift[c]);
            }
          }
        }
      } else {
        try (Mat rgb = new Mat()) {
          cvtColor(img, rgb, COLOR_BGR2RGB);
          int type3 = u8 ? CV_8UC3 : CV_32FC3;
          try (Mat o = new Mat(h, w, type3, dst)) {
            if (u8) {
              rgb.copyTo(o);
            } else {
              try (Mat f = new Mat(); Scalar s = new Scalar(scale[0], scale[1], scale[2], 0);
                  Scalar b = new Scalar(shift[0], shift[1], shift[2], 0);
                  Mat sm = new Mat(h, w, CV_32FC3, s); Mat bm = new Mat(h, w, CV_32FC3, b)) {
                rgb.convertTo(f, CV_32FC3);
                multiply(f, sm, f);
                add(f, bm, o);
              }
            }
          }
        }
      }
    }
  }
}
