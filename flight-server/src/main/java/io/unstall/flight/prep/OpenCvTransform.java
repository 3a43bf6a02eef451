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
import org.bytedeco.opencv.opencv_core.Mat;
import org.bytedeco.opencv.opencv_core.Rect;
import org.bytedeco.opencv.opencv_core.Scalar;
import org.bytedeco.opencv.opencv_core.Size;

/**
 * The OpenCV path of {@link ImagePrep} (libjpeg-turbo inside; PNG, WebP and whatever the native path does not
 * take): decode, crops and resizes on the BGR image, then one pass that writes RGB into the output tensor in the
 * pipeline's layout and dtype. Made only by {@link ImagePrep}, whose initialiser loads OpenCV first.
 */
final class OpenCvTransform {
  private final PrepPipeline pipeline;
  /** The native path's output table (3 x 256 elements; null for uint8), used here for float16/bfloat16. */
  private final ByteBuffer table;

  OpenCvTransform(PrepPipeline pipeline, ByteBuffer table) {
    this.pipeline = pipeline;
    this.table = table;
  }

  /**
   * Decodes {@code encoded} (its header {@code h} already checked), applies the pipeline's ops and writes the
   * sample's tensor into {@code out} at its position.
   */
  void run(ByteBuffer encoded, ImageHeader h, SplittableRandom rng, ByteBuffer out) throws BadImageException {
    Mat img;
    try (BytePointer p = new BytePointer(encoded); Mat buf = new Mat(1, encoded.remaining(), CV_8UC1, p)) {
      img = imdecode(buf, IMREAD_COLOR);
    }
    if (img == null || img.empty()) {
      throw new BadImageException("the " + h.format().name() + " decoder rejected it (corrupt data), "
          + encoded.remaining() + " bytes declaring " + h.width() + "x" + h.height() + " pixels");
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
      int[] r = SpatialOps.cropParams(img.rows(), img.cols(), c, rng);
      try (Rect rect = new Rect(r[1], r[0], r[3], r[2]); Mat roi = new Mat(img, rect)) {
        return resized(roi, c.height(), c.width());
      }
    }
    if (op instanceof Resize r) {
      long[] hw = SpatialOps.resizedSize(r, img.rows(), img.cols()); // within int: workingBytes was reserved for it
      return resized(img, Math.toIntExact(hw[0]), Math.toIntExact(hw[1]));
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
      int top = (int) Math.rint((src.rows() - c.height()) / 2.0); // Python round(): half to even, as torchvision
      int left = (int) Math.rint((src.cols() - c.width()) / 2.0);
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

  /** BGR uint8 HWC (OpenCV) to the output tensor: RGB, the pipeline's layout and dtype, normalized. */
  private void write(Mat img, ByteBuffer out) {
    int h = pipeline.height();
    int w = pipeline.width();
    if (img.rows() != h || img.cols() != w || img.channels() != 3) {
      throw new IllegalStateException("prep produced " + img.rows() + "x" + img.cols() + "x" + img.channels()
          + ", expected " + h + "x" + w + "x3"); // parse() guarantees the last spatial op fixes the size
    }
    if (pipeline.dtype().bytes == 2) {
      writeHalf(img, out);
      return;
    }
    long n = (long) h * w;
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
    long planeBytes = n * pipeline.dtype().bytes;
    // OpenCV writes straight into the output buffer through Mats that wrap it (no Java-side pixel loop).
    try (BytePointer dst = new BytePointer(out.slice())) {
      if (nchw) {
        try (Mat plane = new Mat(h, w, CV_8UC1)) {
          for (int c = 0; c < 3; c++) {
            extractChannel(img, plane, 2 - c); // BGR -> RGB
            try (BytePointer at = new BytePointer(dst).position(c * planeBytes);
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

  /** float16/bfloat16 (OpenCV has no bfloat16): RGB bytes, then the same table as the native path, in Java. */
  private void writeHalf(Mat img, ByteBuffer out) {
    int n = pipeline.height() * pipeline.width();
    byte[] px = new byte[n * 3];
    try (Mat rgb = new Mat()) {
      cvtColor(img, rgb, COLOR_BGR2RGB);
      rgb.data().get(px); // a fresh Mat is continuous
    }
    ByteBuffer o = out.slice().order(java.nio.ByteOrder.LITTLE_ENDIAN);
    boolean nchw = pipeline.layout() == Layout.NCHW;
    for (int i = 0; i < n; i++) {
      for (int c = 0; c < 3; c++) {
        short v = table.getShort((c * 256 + (px[i * 3 + c] & 0xFF)) * 2);
        o.putShort((nchw ? c * n + i : i * 3 + c) * 2, v);
      }
    }
  }
}
