package io.unstall.flight.prep;

import io.unstall.flight.prep.ImagePrep.Decoder;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;
import org.apache.arrow.memory.RootAllocator;
import org.bytedeco.javacpp.BytePointer;
import org.bytedeco.opencv.global.opencv_core;
import org.bytedeco.opencv.global.opencv_imgcodecs;
import org.bytedeco.opencv.opencv_core.Mat;

/**
 * Per-core rate of the sidecar's prep paths on a folder of JPEGs (benchmarks/bench_prep.py's generated images):
 * images per CPU-second of this one thread, for OpenCV's decode alone (the baseline), the OpenCV path and the
 * native path in several outputs, interleaved in rounds.
 * Usage (docs/BENCHMARKS.md):
 * {@code java -cp <test classpath> io.unstall.flight.prep.PrepDecoderBench DIR [SECONDS [PATH-DTYPE]]}.
 */
public final class PrepDecoderBench {
  private PrepDecoderBench() {}

  static String pipeline(String dtype) {
    return "{\"layout\":\"NCHW\",\"dtype\":\"" + dtype + "\",\"ops\":[{\"op\":\"decode\"},"
        + "{\"op\":\"random_resized_crop\",\"size\":224},{\"op\":\"hflip\"}"
        + (dtype.equals("uint8")
            ? ""
            : ",{\"op\":\"normalize\",\"mean\":[0.485,0.456,0.406],\"std\":[0.229,0.224,0.225]}")
        + "]}";
  }

  /** OpenCV's imdecode alone (libjpeg-turbo 3.1 with SIMD, the whole image): the in-run decode-only baseline. */
  static void decodeOnly(ByteBuffer img) {
    try (BytePointer p = new BytePointer(img.duplicate());
        Mat buf = new Mat(1, img.remaining(), opencv_core.CV_8UC1, p);
        Mat m = opencv_imgcodecs.imdecode(buf, opencv_imgcodecs.IMREAD_COLOR)) {
      if (m.empty()) {
        throw new IllegalStateException("imdecode failed");
      }
    }
  }

  public static void main(String[] args) throws Exception {
    OpenCv.load();
    Path dir = Path.of(args[0]);
    double seconds = args.length > 1 ? Double.parseDouble(args[1]) : 5;
    List<ByteBuffer> imgs = new ArrayList<>();
    try (Stream<Path> s = Files.walk(dir)) {
      for (Path p : s.filter(p -> p.toString().endsWith(".jpg")).sorted().toList()) {
        byte[] b = Files.readAllBytes(p);
        imgs.add(ByteBuffer.allocateDirect(b.length).put(b).flip());
      }
    }
    ThreadMXBean cpu = ManagementFactory.getThreadMXBean();
    try (RootAllocator root = new RootAllocator(1L << 30);
        DecodeBudget budget = new DecodeBudget(root, 60, TimeUnit.SECONDS)) {
      System.out.printf("%d images from %s, native library: %s%n", imgs.size(), dir,
          NativeJpeg.AVAILABLE ? "loaded" : NativeJpeg.PROBLEM);
      String[][] configs = {{"imdecode", "-"}, {"opencv", "float32"}, {"native", "float32"}, {"native", "uint8"},
          {"native", "float16"}};
      List<ImagePrep> preps = new ArrayList<>();
      for (String[] c : configs) {
        preps.add(c[0].equals("imdecode") ? null : new ImagePrep(PrepPipeline.parse(pipeline(c[1])), budget,
            c[0].equals("opencv") ? Decoder.OPENCV : Decoder.NATIVE, null));
      }
      ByteBuffer out = ByteBuffer.allocateDirect(3 * 224 * 224 * 4);
      long[] images = new long[configs.length];
      long[] nanos = new long[configs.length];
      int rounds = 4; // interleaved, so load from other processes falls on every configuration alike
      for (int round = 0; round <= rounds; round++) { // round 0 warms up
        for (int k = 0; k < configs.length; k++) {
          if (args.length > 2 && !args[2].equals(configs[k][0] + "-" + configs[k][1])) {
            continue; // one configuration (for a profiler)
          }
          long t0 = cpu.getCurrentThreadCpuTime();
          long n = 0;
          while (cpu.getCurrentThreadCpuTime() - t0 < seconds * 1e9 / rounds) {
            ByteBuffer img = imgs.get((int) (n % imgs.size()));
            if (preps.get(k) == null) {
              decodeOnly(img);
            } else {
              preps.get(k).run(img.duplicate(), ImagePrep.rng(0, 0, n), out.clear());
            }
            n++;
          }
          if (round > 0) {
            images[k] += n;
            nanos[k] += cpu.getCurrentThreadCpuTime() - t0;
          }
        }
      }
      double base = images[0] * 1e9 / Math.max(1, nanos[0]);
      for (int k = 0; k < configs.length; k++) {
        if (images[k] > 0) {
          double rate = images[k] * 1e9 / nanos[k];
          System.out.printf("%-8s %-8s %8.1f images per CPU-second  %.2fx imdecode-only  (%d images)%n",
              configs[k][0], configs[k][1], rate, rate / base, images[k]);
        }
      }
    }
  }
}
