package io.unstall.flight.prep;

import static org.bytedeco.opencv.global.opencv_core.CV_8UC1;
import static org.bytedeco.opencv.global.opencv_core.CV_8UC3;
import static org.bytedeco.opencv.global.opencv_imgcodecs.IMWRITE_JPEG_PROGRESSIVE;
import static org.bytedeco.opencv.global.opencv_imgcodecs.IMWRITE_JPEG_QUALITY;
import static org.bytedeco.opencv.global.opencv_imgcodecs.IMWRITE_JPEG_SAMPLING_FACTOR;
import static org.bytedeco.opencv.global.opencv_imgcodecs.IMWRITE_JPEG_SAMPLING_FACTOR_420;
import static org.bytedeco.opencv.global.opencv_imgcodecs.IMWRITE_JPEG_SAMPLING_FACTOR_444;
import static org.bytedeco.opencv.global.opencv_imgcodecs.imencode;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import io.unstall.flight.prep.ImagePrep.Decoder;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.bytedeco.javacpp.BytePointer;
import org.bytedeco.javacpp.IntPointer;
import org.bytedeco.opencv.opencv_core.Mat;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The native JPEG path (NativeJpeg) against its own full decode (every row and column at full DCT scale, same
 * resampling: isolates what the crop window and the DCT scaling change), against the OpenCV path (a different
 * resampler), its determinism across threads, and bad bytes.
 */
class NativeJpegTest {
  static {
    OpenCv.load(); // jpeg() encodes its test images with OpenCV before any ImagePrep exists
  }

  /**
   * {crop window only, DCT-scaled} vs the full decode, in uint8 units, measured on these images (2026-11-23,
   * reducing gap 2): the window alone is exact; DCT-scaled crops measured max abs 14, mean abs worst 1.40, average
   * 0.71 (a reduced-size IDCT instead of the full IDCT + the triangle filter).
   */
  static final int[] MAX_ABS = {0, 16};
  static final double[] MEAN_ABS = {0, 1.6};
  /** vs the OpenCV path (INTER_AREA / INTER_LINEAR instead of Pillow's bilinear): a looser mean bound. */
  static final double OPENCV_MEAN_ABS = 3.0;

  enum Sampling { S420, S444, GRAY, PROGRESSIVE }

  @BeforeAll
  static void loaded() {
    assumeTrue(NativeJpeg.AVAILABLE || System.getenv("CI") == null, NativeJpeg.PROBLEM);
    assertTrue(NativeJpeg.AVAILABLE, "the native JPEG library did not load: " + NativeJpeg.PROBLEM);
  }

  /** A photo-like test image: smooth gradients, edges and noise. */
  static ByteBuffer jpeg(int w, int h, Sampling s, long seed) {
    Random r = new Random(seed);
    int ch = s == Sampling.GRAY ? 1 : 3;
    byte[] px = new byte[w * h * ch];
    double fx = 0.02 + r.nextDouble() * 0.1;
    double fy = 0.02 + r.nextDouble() * 0.1;
    for (int y = 0; y < h; y++) {
      for (int x = 0; x < w; x++) {
        for (int c = 0; c < ch; c++) {
          double v = 128 + 60 * Math.sin(fx * x * (c + 1) + fy * y) + 40 * Math.cos(0.003 * x * y + c)
              + ((x / 23 + y / 17) % 2 == 0 ? 20 : -20) + r.nextGaussian() * 8;
          px[(y * w + x) * ch + c] = (byte) Math.max(0, Math.min(255, (int) v));
        }
      }
    }
    try (Mat m = new Mat(h, w, ch == 1 ? CV_8UC1 : CV_8UC3); BytePointer out = new BytePointer()) {
      m.data().put(px);
      int[] params = s == Sampling.PROGRESSIVE
          ? new int[] {IMWRITE_JPEG_QUALITY, 93, IMWRITE_JPEG_PROGRESSIVE, 1}
          : new int[] {IMWRITE_JPEG_QUALITY, 93, IMWRITE_JPEG_SAMPLING_FACTOR,
              s == Sampling.S444 ? IMWRITE_JPEG_SAMPLING_FACTOR_444 : IMWRITE_JPEG_SAMPLING_FACTOR_420};
      assertTrue(imencode(".jpg", m, out, new IntPointer(params)));
      byte[] b = new byte[(int) out.limit()];
      out.get(b);
      return direct(b);
    }
  }

  static ByteBuffer direct(byte[] b) {
    return ByteBuffer.allocateDirect(b.length).put(b).flip();
  }

  static final BufferAllocator ROOT = new RootAllocator(1L << 30);
  static final DecodeBudget BUDGET = new DecodeBudget(ROOT, 60, TimeUnit.SECONDS);

  static ImagePrep prep(String pipeline, Decoder d) {
    return new ImagePrep(PrepPipeline.parse(pipeline), BUDGET, d, null);
  }

  static String rrc(int size, String scale, String ratio, String dtype, String layout) {
    return "{\"layout\":\"" + layout + "\",\"dtype\":\"" + dtype + "\",\"ops\":[{\"op\":\"decode\"},"
        + "{\"op\":\"random_resized_crop\",\"size\":" + size + ",\"scale\":" + scale + ",\"ratio\":" + ratio + "},"
        + "{\"op\":\"hflip\"}]}";
  }

  static byte[] run(ImagePrep p, ByteBuffer img, long sample) throws Exception {
    ByteBuffer out = ByteBuffer.allocateDirect((int) p.pipeline().sampleBytes());
    p.run(img.duplicate(), ImagePrep.rng(7, 3, sample), out);
    byte[] b = new byte[out.capacity()];
    out.get(b);
    return b;
  }

  /** Max and mean absolute difference of two uint8 tensors. */
  static double[] diff(byte[] a, byte[] b) {
    int max = 0;
    long sum = 0;
    for (int i = 0; i < a.length; i++) {
      int d = Math.abs((a[i] & 0xFF) - (b[i] & 0xFF));
      max = Math.max(max, d);
      sum += d;
    }
    return new double[] {max, (double) sum / a.length};
  }

  /** The DCT scale the fast path picks for sample {@code id}'s crop (by redoing the same draws). */
  static int denom(ImageHeader h, PrepPipeline.RandomResizedCrop c, int out, long id) {
    int[] r = SpatialOps.cropParams(h.height(), h.width(), c, ImagePrep.rng(7, 3, id));
    return NativeJpeg.scaleDenom(r[3], r[2], out, out, NativeJpeg.MAX_SCALE_DENOM, NativeJpeg.REDUCING_GAP);
  }

  @Test
  void cropWindowAndDctScalingMatchTheFullDecode() throws Exception {
    int[][] sizes = {{500, 375}, {333, 257}, {1203, 901}, {64, 48}, {17, 13}, {2001, 97}};
    String[][] crops = { // scale, ratio: torchvision's default; tiny crops; near-whole (touching the edges);
        {"[0.08,1.0]", "[0.75,1.3333333333333333]"}, // fallback central crops (no attempt fits that ratio)
        {"[0.005,0.01]", "[0.75,1.3333333333333333]"}, {"[0.95,1.0]", "[0.75,1.3333333333333333]"},
        {"[0.5,1.0]", "[20,30]"}};
    int[] outs = {224, 32};
    double[] worstMax = new double[2]; // [crop window only, DCT-scaled]
    double[] worstMean = new double[2];
    double[] sumMean = new double[2];
    int[] count = new int[2];
    int n = 0;
    for (int[] sz : sizes) {
      for (Sampling s : Sampling.values()) {
        ByteBuffer img = jpeg(sz[0], sz[1], s, sz[0] * 31L + s.ordinal());
        ImageHeader h = ImageHeader.read(img);
        for (String[] crop : crops) {
          for (int out : outs) {
            String pl = rrc(out, crop[0], crop[1], "uint8", "NHWC");
            ImagePrep fast = prep(pl, Decoder.NATIVE);
            ImagePrep full = prep(pl, Decoder.NATIVE_FULL);
            PrepPipeline.RandomResizedCrop c = (PrepPipeline.RandomResizedCrop) fast.pipeline().ops().get(1);
            for (long id = 0; id < 6; id++) {
              byte[] a = run(fast, img, id);
              byte[] b = run(full, img, id);
              String where = sz[0] + "x" + sz[1] + " " + s + " crop " + crop[0] + crop[1] + " -> " + out + " #" + id;
              double[] d = diff(a, b);
              int k = denom(h, c, out, id) == 1 ? 0 : 1;
              worstMax[k] = Math.max(worstMax[k], d[0]);
              worstMean[k] = Math.max(worstMean[k], d[1]);
              sumMean[k] += d[1];
              count[k]++;
              assertTrue(d[0] <= MAX_ABS[k] && d[1] <= MEAN_ABS[k], (k == 0 ? "crop window" : "DCT-scaled")
                  + " decode vs full decode: max " + d[0] + " mean " + d[1] + " at " + where);
              n++;
            }
          }
        }
      }
    }
    for (int k = 0; k < 2; k++) {
      System.out.printf("native %s vs full decode: %d of %d crops, max abs %.0f, mean abs: worst %.3f, average %.3f%n",
          k == 0 ? "crop window" : "DCT-scaled", count[k], n, worstMax[k], worstMean[k], sumMean[k] / count[k]);
    }
    assertTrue(count[1] > 20, "few crops took the DCT-scaled path: " + count[1]);
  }

  /** The restart-indexed copy NativeJpeg.reindex makes of {@code img}. */
  static ByteBuffer reindexed(ByteBuffer img) {
    int n = NativeJpeg.reindex(img, img.position(), img.remaining(), ReindexedJpegs.SPAN_PX);
    assertTrue(n > 0, "not rewritten");
    ByteBuffer b = ByteBuffer.allocateDirect(n);
    NativeJpeg.takeReindexed(b, 0, n);
    return b;
  }

  @Test
  void restartIndexedCopiesDecodeEveryCropToTheSamePixels() throws Exception {
    int[][] sizes = {{500, 375}, {333, 257}, {1203, 901}, {64, 48}, {17, 13}, {2001, 97}};
    String[][] crops = {{"[0.08,1.0]", "[0.75,1.3333333333333333]"}, {"[0.005,0.01]", "[0.75,1.3333333333333333]"},
        {"[0.95,1.0]", "[0.75,1.3333333333333333]"}, {"[0.5,1.0]", "[20,30]"}};
    long spliced0 = NativeJpeg.splicedDecodes();
    int n = 0;
    for (int[] sz : sizes) {
      for (Sampling s : Sampling.values()) {
        ByteBuffer img = jpeg(sz[0], sz[1], s, sz[0] * 31L + s.ordinal());
        ByteBuffer copy = reindexed(img);
        assertEquals(ImageHeader.read(img).width(), ImageHeader.read(copy).width());
        assertTrue(copy.remaining() < img.remaining() * 1.2 + 1024, "copy of " + img.remaining() + " bytes: "
            + copy.remaining());
        for (String[] crop : crops) {
          for (String dtype : List.of("uint8", "float32")) {
            ImagePrep fast = prep(rrc(sz[0] > 1000 ? 64 : 224, crop[0], crop[1], dtype, "NCHW"), Decoder.NATIVE);
            for (long id = 0; id < 4; id++) {
              assertArrayEquals(run(fast, img, id), run(fast, copy, id),
                  sz[0] + "x" + sz[1] + " " + s + " crop " + crop[0] + crop[1] + " " + dtype + " #" + id);
              n++;
            }
          }
        }
      }
    }
    long spliced = NativeJpeg.splicedDecodes() - spliced0;
    System.out.println("restart-indexed copies: " + n + " crops, the same bytes as the originals'; " + spliced
        + " decoded only the intervals their crop covers");
    assertTrue(spliced > n / 2, "few crops were spliced: " + spliced + " of " + n);
  }

  @Test
  void theStoreMakesEachCopyOnceAndStopsAtItsMemory() throws Exception {
    String pl = rrc(224, "[0.08,1.0]", "[0.75,1.3333333333333333]", "uint8", "NCHW");
    List<ByteBuffer> imgs = new ArrayList<>();
    for (int i = 0; i < 6; i++) {
      imgs.add(jpeg(500, 375, Sampling.S420, 100 + i));
    }
    // Room for one slab: the copies that fit in it, then the originals.
    try (BufferAllocator mem = ROOT.newChildAllocator("reindexed-test", 0, ReindexedJpegs.SLAB);
        ReindexedJpegs store = new ReindexedJpegs(mem)) {
      ImagePrep p = new ImagePrep(PrepPipeline.parse(pl), BUDGET, Decoder.NATIVE, store);
      ImagePrep plain = prep(pl, Decoder.NATIVE);
      for (int epoch = 0; epoch < 3; epoch++) {
        for (int i = 0; i < imgs.size(); i++) {
          ByteBuffer img = imgs.get(i);
          ByteBuffer out = ByteBuffer.allocateDirect((int) p.pipeline().sampleBytes());
          p.run(img.duplicate(), io.unstall.flight.cache.Digest.of(img.duplicate()), ImagePrep.rng(7, epoch, i), out);
          ByteBuffer ref = ByteBuffer.allocateDirect(out.capacity());
          plain.run(img.duplicate(), ImagePrep.rng(7, epoch, i), ref);
          assertEquals(ref, out, "epoch " + epoch + " sample " + i);
        }
      }
      com.fasterxml.jackson.databind.node.ObjectNode st =
          com.fasterxml.jackson.databind.node.JsonNodeFactory.instance.objectNode();
      store.stats(st);
      assertEquals(6, st.get("made").asInt(), st.toString()); // each made once, on its first decode
      assertEquals(12, st.get("hits").asInt(), st.toString());
      assertTrue(mem.getAllocatedMemory() <= ReindexedJpegs.SLAB, st.toString());

      // A sample whose bytes changed under the same digest is decoded from its own bytes, never the copy.
      ByteBuffer other = imgs.get(1);
      ByteBuffer out = ByteBuffer.allocateDirect((int) p.pipeline().sampleBytes());
      p.run(other.duplicate(), io.unstall.flight.cache.Digest.of(imgs.get(0).duplicate()), ImagePrep.rng(7, 0, 1), out);
      ByteBuffer ref = ByteBuffer.allocateDirect(out.capacity());
      plain.run(other.duplicate(), ImagePrep.rng(7, 0, 1), ref);
      assertEquals(ref, out);

      // Full: no more copies, every sample still decoded from its original.
      int made = st.get("made").asInt();
      for (int i = 0; i < 60; i++) {
        ByteBuffer img = jpeg(640, 480, Sampling.S444, 1000 + i);
        p.run(img.duplicate(), io.unstall.flight.cache.Digest.of(img.duplicate()), ImagePrep.rng(7, 0, i),
            ByteBuffer.allocateDirect((int) p.pipeline().sampleBytes()));
      }
      store.stats(st);
      assertTrue(st.get("full").asBoolean(), st.toString());
      assertTrue(st.get("no_room").asInt() > 0 && st.get("made").asInt() > made, st.toString());
      assertTrue(mem.getAllocatedMemory() <= ReindexedJpegs.SLAB, st.toString());
    }
  }

  @Test
  void resizeCenterCropMatchesTheFullDecodeAndStaysNearOpenCv() throws Exception {
    String pl = "{\"layout\":\"NCHW\",\"dtype\":\"uint8\",\"ops\":[{\"op\":\"decode\"},"
        + "{\"op\":\"resize\",\"size\":256},{\"op\":\"center_crop\",\"size\":224},{\"op\":\"hflip\"}]}";
    ImagePrep fast = prep(pl, Decoder.NATIVE);
    ImagePrep full = prep(pl, Decoder.NATIVE_FULL);
    ImagePrep cv = prep(pl, Decoder.OPENCV);
    for (Sampling s : Sampling.values()) {
      ByteBuffer img = jpeg(500, 375, s, s.ordinal());
      for (long id = 0; id < 4; id++) {
        byte[] a = run(fast, img, id);
        assertArrayEquals(run(full, img, id), a, s + " #" + id);
        double[] d = diff(a, run(cv, img, id));
        assertTrue(d[1] <= OPENCV_MEAN_ABS, "vs OpenCV, mean abs " + d[1] + " at " + s + " #" + id);
      }
    }
  }

  @Test
  void staysNearTheOpenCvPathForTheSameCrops() throws Exception {
    String pl = rrc(224, "[0.08,1.0]", "[0.75,1.3333333333333333]", "uint8", "NCHW");
    ImagePrep fast = prep(pl, Decoder.NATIVE);
    ImagePrep cv = prep(pl, Decoder.OPENCV);
    double worst = 0;
    for (Sampling s : Sampling.values()) {
      ByteBuffer img = jpeg(500, 375, s, 100 + s.ordinal());
      for (long id = 0; id < 20; id++) {
        double[] d = diff(run(fast, img, id), run(cv, img, id));
        worst = Math.max(worst, d[1]);
        assertTrue(d[1] <= OPENCV_MEAN_ABS, "vs OpenCV, mean abs " + d[1] + " at " + s + " #" + id);
      }
    }
    System.out.printf("native vs OpenCV path, same crops: worst mean abs %.3f%n", worst);
  }

  @Test
  void floatOutputsAreTheTableOfTheUint8Output() throws Exception {
    String norm = ",{\"op\":\"normalize\",\"mean\":[0.485,0.456,0.406],\"std\":[0.229,0.224,0.225]}]}";
    String u8 = rrc(64, "[0.08,1.0]", "[0.75,1.3333333333333333]", "uint8", "NCHW");
    ByteBuffer img = jpeg(500, 375, Sampling.S420, 5);
    for (String dtype : List.of("float32", "float16", "bfloat16")) {
      String pl = rrc(64, "[0.08,1.0]", "[0.75,1.3333333333333333]", dtype, "NCHW");
      pl = pl.substring(0, pl.length() - 2) + norm;
      for (Decoder d : List.of(Decoder.NATIVE, Decoder.OPENCV)) {
        ImagePrep p = prep(pl, d);
        for (long id = 0; id < 4; id++) {
          byte[] ref = run(prep(u8, d), img, id);
          ByteBuffer out = ByteBuffer.wrap(run(p, img, id)).order(ByteOrder.LITTLE_ENDIAN);
          int plane = 64 * 64;
          double[] mean = {0.485, 0.456, 0.406};
          double[] std = {0.229, 0.224, 0.225};
          for (int i = 0; i < ref.length; i++) {
            int c = i / plane;
            double want = ((ref[i] & 0xFF) / 255.0 - mean[c]) / std[c];
            double got = switch (dtype) {
              case "float32" -> out.getFloat(i * 4);
              case "float16" -> halfToFloat(out.getShort(i * 2));
              default -> Float.intBitsToFloat(out.getShort(i * 2) << 16);
            };
            double tol = dtype.equals("float32") ? 1e-5 : dtype.equals("float16") ? 2e-3 : 1.6e-2;
            assertEquals(want, got, tol, dtype + " " + d + " element " + i);
          }
        }
      }
    }
  }

  static float halfToFloat(short h) {
    int e = (h >>> 10) & 0x1F;
    int m = h & 0x3FF;
    double v = e == 0 ? m * Math.pow(2, -24) : (1 + m / 1024.0) * Math.pow(2, e - 15);
    return (float) ((h & 0x8000) != 0 ? -v : v);
  }

  @Test
  void toFloat16RoundsToNearestEven() {
    for (float f : new float[] {0f, 1f, -2.5f, 65504f, 1e-5f, 6.1e-5f, 3.14159f, -0.33333f, 70000f}) {
      float back = halfToFloat(NativeJpeg.toFloat16(f));
      assertEquals(f > 65519 ? Float.POSITIVE_INFINITY : f,
          f > 65519 ? (back == 0 ? 0 : Float.POSITIVE_INFINITY) : back,
          Math.max(Math.abs(f) / 1024, 6e-8), "float16 of " + f);
    }
    assertEquals((short) 0x3C00, NativeJpeg.toFloat16(1f));
    assertEquals((short) 0x3F80, NativeJpeg.toBfloat16(1f));
    assertEquals((short) 0xC020, NativeJpeg.toBfloat16(-2.5f));
  }

  @Test
  void sameOutputFromManyThreads() throws Exception {
    String pl = rrc(96, "[0.08,1.0]", "[0.75,1.3333333333333333]", "float32", "NHWC");
    ImagePrep p = prep(pl, Decoder.NATIVE);
    List<ByteBuffer> imgs = new ArrayList<>();
    for (Sampling s : Sampling.values()) {
      imgs.add(jpeg(640, 480, s, 40 + s.ordinal()));
    }
    List<byte[]> ref = new ArrayList<>();
    for (int i = 0; i < 32; i++) {
      ref.add(run(p, imgs.get(i % imgs.size()), i));
    }
    ExecutorService pool = Executors.newFixedThreadPool(8);
    try {
      List<Future<List<byte[]>>> fs = new ArrayList<>();
      for (int t = 0; t < 8; t++) {
        int start = t;
        fs.add(pool.submit(() -> {
          List<byte[]> got = new ArrayList<>();
          for (int k = 0; k < 32; k++) {
            int i = (start + k) % 32; // each thread in its own order
            got.add(run(p, imgs.get(i % imgs.size()), i));
          }
          return got;
        }));
      }
      for (int t = 0; t < 8; t++) {
        List<byte[]> got = fs.get(t).get();
        for (int k = 0; k < 32; k++) {
          assertArrayEquals(ref.get((t + k) % 32), got.get(k), "thread " + t + " sample " + (t + k) % 32);
        }
      }
    } finally {
      pool.shutdownNow();
    }
  }

  /**
   * The header rules leave libjpeg's refusals of a scan's parameters and of a coding process to it (python-shim's
   * jpeg_rules names them in these words, protocol/fixtures/jpeg-scans-v1.json): a progressive scan's invalid Ss, Se,
   * Ah or Al, and a lossless frame; a sequential scan's odd parameters only make libjpeg warn, and it decodes them.
   */
  @Test
  void libjpegRefusesInvalidProgressiveParametersAndALosslessFrameInTheWordsTheRulesUse() throws Exception {
    ImagePrep p = nativeCrops();
    byte[] prog = StandardHuffmanTablesTest.bytes(jpeg(128, 96, Sampling.PROGRESSIVE, 4));
    int third = scans(prog).get(2);
    int params = third + 5 + 2 * prog[third + 4]; // Ss, Se, Ah << 4 | Al
    assertTrue(prog[params] > 0, "an AC scan");
    byte[] bad = prog.clone();
    bad[params + 1] = 64;
    ImageHeader.read(direct(bad)); // the header rules pass it to libjpeg
    assertEquals("libjpeg: Invalid progressive parameters Ss=" + prog[params] + " Se=64 Ah=" + (prog[params + 2] >> 4)
        + " Al=" + (prog[params + 2] & 0x0F), assertThrows(BadImageException.class, () -> run(p, direct(bad), 0))
        .getMessage());
    byte[] seq = StandardHuffmanTablesTest.bytes(jpeg(128, 96, Sampling.S420, 4));
    int sos = scans(seq).get(0);
    byte[] zeros = seq.clone();
    Arrays.fill(zeros, sos + 5 + 2 * seq[sos + 4], sos + 8 + 2 * seq[sos + 4], (byte) 0);
    assertArrayEquals(run(p, direct(seq), 1), run(p, direct(zeros), 1), "Ss=Se=Ah=Al=0: decoded as the original");
    byte[] lossless = seq.clone();
    lossless[StandardHuffmanTablesTest.segments(seq).stream()
        .filter(i -> StandardHuffmanTablesTest.marker(seq, i) == 0xFFC0).findFirst().orElseThrow() + 1] = (byte) 0xC3;
    ImageHeader.read(direct(lossless));
    assertEquals("libjpeg: Unsupported JPEG process: SOF type 0xc3",
        assertThrows(BadImageException.class, () -> run(p, direct(lossless), 0)).getMessage());
  }

  /**
   * The header rules leave libjpeg's refusals of a scan's component ids, of a marker it reads no segment of and of
   * the frame's sampling factors to it (python-shim's jpeg_rules names them in these words,
   * protocol/fixtures/jpeg-scans-v1.json): a 4:2:0 file's scan of components 2, 1, 3 (the frame lists component 1
   * before the scan's second place), a JPG0 marker before the scan, a luma sampling factor of 0, and a luma 4x4
   * (18 blocks an interleaved MCU, above libjpeg's 10); a progressive DC scan of components 3 and 2 of 1, 2, 3 is
   * decoded.
   */
  @Test
  void libjpegRefusesAScansComponentsAMarkerAndSamplingFactorsInTheWordsTheRulesUse() throws Exception {
    ImagePrep p = nativeCrops();
    byte[] seq = StandardHuffmanTablesTest.bytes(jpeg(128, 96, Sampling.S420, 4));
    int sos = scans(seq).get(0);
    int sof = StandardHuffmanTablesTest.segments(seq).stream()
        .filter(i -> StandardHuffmanTablesTest.marker(seq, i) == 0xFFC0).findFirst().orElseThrow();
    assertEquals(0x22, seq[sof + 11], "4:2:0");
    byte[] swapped = seq.clone();
    swapped[sos + 5] = seq[sos + 7];
    swapped[sos + 7] = seq[sos + 5];
    byte[] marker = new byte[seq.length + 4];
    System.arraycopy(seq, 0, marker, 0, sos);
    System.arraycopy(new byte[] {(byte) 0xFF, (byte) 0xF0, 0, 2}, 0, marker, sos, 4);
    System.arraycopy(seq, sos, marker, sos + 4, seq.length - sos);
    byte[] zero = seq.clone();
    zero[sof + 11] = 0x20;
    byte[] large = seq.clone();
    large[sof + 11] = 0x44;
    for (Object[] c : new Object[][] {{swapped, "Invalid component ID " + seq[sos + 5] + " in SOS"},
        {marker, "Unsupported marker type 0xf0"}, {zero, "Bogus sampling factors"},
        {large, "Sampling factors too large for interleaved scan"}}) {
      byte[] bad = (byte[]) c[0];
      ImageHeader.read(direct(bad)); // the header rules pass it to libjpeg
      assertEquals("libjpeg: " + c[1], assertThrows(BadImageException.class, () -> run(p, direct(bad), 0))
          .getMessage());
    }
    byte[] prog = StandardHuffmanTablesTest.bytes(jpeg(128, 96, Sampling.PROGRESSIVE, 4));
    int dc = scans(prog).get(0);
    assertEquals(3, prog[dc + 4], "a DC scan of the three components");
    byte[] two = new byte[prog.length - 2];
    System.arraycopy(prog, 0, two, 0, dc);
    byte[] header = {(byte) 0xFF, (byte) 0xDA, 0, 10, 2, prog[dc + 9], prog[dc + 10], prog[dc + 7], prog[dc + 8]};
    System.arraycopy(header, 0, two, dc, header.length);
    System.arraycopy(prog, dc + 11, two, dc + 9, prog.length - dc - 11);
    ImageHeader.read(direct(two));
    run(p, direct(two), 0); // components 3 and 2: libjpeg takes them, and decodes through the data they do not match
  }

  /** The native decoder under a 64-pixel RandomResizedCrop (torchvision's scale and ratio), uint8 NCHW. */
  private static ImagePrep nativeCrops() {
    return prep(rrc(64, "[0.08,1.0]", "[0.75,1.3333333333333333]", "uint8", "NCHW"), Decoder.NATIVE);
  }

  /** Where each of {@code jpeg}'s scan markers (FF DA) starts. */
  static List<Integer> scans(byte[] jpeg) {
    return StandardHuffmanTablesTest.segments(jpeg).stream()
        .filter(i -> StandardHuffmanTablesTest.marker(jpeg, i) == 0xFFDA).toList();
  }

  @Test
  void truncatedAndCorruptJpegsFailWithAReasonAndNeverCrash() throws Exception {
    String pl = rrc(64, "[0.08,1.0]", "[0.75,1.3333333333333333]", "uint8", "NCHW");
    ImagePrep p = prep(pl, Decoder.NATIVE);
    ImagePrep full = prep(pl, Decoder.NATIVE_FULL);
    for (ByteBuffer img : List.of(jpeg(500, 375, Sampling.S420, 9), reindexed(jpeg(500, 375, Sampling.S420, 9)))) {
      cutAndCorrupt(p, full, img); // the original, and its restart-indexed copy (cut into intervals when decoded)
    }
  }

  private static void cutAndCorrupt(ImagePrep p, ImagePrep full, ByteBuffer img) throws Exception {
    byte[] bytes = new byte[img.remaining()];
    img.duplicate().get(bytes);
    byte[] before = run(p, img, 3);
    int scan = 2;
    while (!(bytes[scan] == (byte) 0xFF && bytes[scan + 1] == (byte) 0xDA)) { // the start-of-scan marker
      scan++;
    }
    for (int len = bytes.length * 3 / 4; len > scan + 20; len -= 97) { // cuts in the entropy-coded data
      ByteBuffer cut = direct(java.util.Arrays.copyOf(bytes, len));
      BadImageException e = assertThrows(BadImageException.class, () -> run(p, cut, 0), "cut at " + len);
      assertTrue(e.getMessage().contains("truncated"), e.getMessage()); // the header check, before native code
      byte[] b = java.util.Arrays.copyOf(bytes, len + 2); // the same cut with an end-of-image marker after it
      b[len] = (byte) 0xFF;
      b[len + 1] = (byte) 0xD9;
      for (ImagePrep q : List.of(p, full)) {
        try { // libjpeg fills what is missing with grey, as PIL does; or names the reason; never crashes
          run(q, direct(b), len);
        } catch (BadImageException x) {
          assertTrue(x.getMessage().contains("truncated") || x.getMessage().startsWith("libjpeg: "), x.getMessage());
        }
      }
    }
    Random r = new Random(1);
    int rejected = 0;
    for (int k = 0; k < 200; k++) { // garbage in the entropy-coded data and in the tables
      byte[] bad = bytes.clone();
      for (int j = 0; j < 8; j++) {
        bad[20 + r.nextInt(bad.length - 22)] = (byte) r.nextInt(256);
      }
      try {
        run(p, direct(bad), k);
      } catch (BadImageException e) {
        assertTrue(!e.getMessage().isEmpty());
        rejected++;
      }
    }
    System.out.println("corrupt JPEGs rejected with a reason: " + rejected + " of 200 (the rest decode to noise)");
    assertArrayEquals(before, run(p, img, 3)); // still serving, same output as before
  }
}
