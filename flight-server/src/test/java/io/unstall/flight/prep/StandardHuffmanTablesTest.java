package io.unstall.flight.prep;

import static io.unstall.flight.prep.ImageHeaderTest.PIPELINE;
import static io.unstall.flight.prep.ImageHeaderTest.direct;
import static io.unstall.flight.prep.ImageHeaderTest.prep;
import static io.unstall.flight.prep.ImageHeaderTest.refusal;
import static io.unstall.flight.prep.ImageHeaderTest.without;
import static io.unstall.flight.prep.NativeJpegTest.BUDGET;
import static io.unstall.flight.prep.NativeJpegTest.ROOT;
import static io.unstall.flight.prep.NativeJpegTest.rrc;
import static org.bytedeco.opencv.global.opencv_core.CV_8UC1;
import static org.bytedeco.opencv.global.opencv_imgcodecs.IMREAD_COLOR;
import static org.bytedeco.opencv.global.opencv_imgcodecs.IMWRITE_JPEG_OPTIMIZE;
import static org.bytedeco.opencv.global.opencv_imgcodecs.IMWRITE_JPEG_QUALITY;
import static org.bytedeco.opencv.global.opencv_imgcodecs.imdecode;
import static org.bytedeco.opencv.global.opencv_imgcodecs.imencode;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.unstall.flight.cache.Digest;
import io.unstall.flight.prep.ImageHeader.Format;
import io.unstall.flight.prep.ImagePrep.Decoder;
import io.unstall.flight.prep.NativeJpegTest.Sampling;
import io.unstall.flight.protocol.ProtocolFixturesTest;
import java.awt.image.BufferedImage;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.List;
import javax.imageio.ImageIO;
import javax.imageio.plugins.jpeg.JPEGHuffmanTable;
import org.apache.arrow.memory.BufferAllocator;
import org.bytedeco.javacpp.BytePointer;
import org.bytedeco.javacpp.IntPointer;
import org.bytedeco.opencv.opencv_core.Mat;
import org.junit.jupiter.api.Test;

/**
 * Motion-JPEG frames (no DHT segment: the decoder supplies the JPEG standard's Huffman tables): the header names the
 * missing slots, the copy the sidecar decodes holds exactly those standard tables before the first scan (the same
 * bytes as the shim's, protocol/fixtures/mjpeg-frame-v1*.jpg), and every prep path decodes the frame to the pixels
 * of the same image with the standard tables written out, whatever its thread decoded before. No table outlives
 * its image in the native decoder, and a later scan whose table no DHT defines is refused by the header rule.
 */
class StandardHuffmanTablesTest {
  /** Where {@code jpeg}'s first scan marker (FF DA) starts. */
  static int firstScan(byte[] jpeg) {
    int i = 2;
    while ((jpeg[i + 1] & 0xFF) != 0xDA) {
      i += 2 + ((jpeg[i + 2] & 0xFF) << 8 | jpeg[i + 3] & 0xFF);
    }
    return i;
  }

  /** The copy the sidecar decodes for {@code frame} (whose header is {@code h}). */
  static byte[] withStandardTables(byte[] frame, ImageHeader h) {
    ByteBuffer dst = ByteBuffer.allocate(StandardHuffmanTables.copyBytes(h, ByteBuffer.wrap(frame)));
    StandardHuffmanTables.insert(ByteBuffer.wrap(frame), h, dst);
    assertFalse(dst.hasRemaining(), "copyBytes is the copy's size");
    return dst.array();
  }

  /** The tables of the DHT segment at {@code at}, each as its class byte, code counts and symbols. */
  static List<byte[]> tables(byte[] jpeg, int at) {
    assertEquals(0xFFC4, (jpeg[at] & 0xFF) << 8 | jpeg[at + 1] & 0xFF, "a DHT segment at " + at);
    int end = at + 2 + ((jpeg[at + 2] & 0xFF) << 8 | jpeg[at + 3] & 0xFF);
    List<byte[]> out = new ArrayList<>();
    for (int i = at + 4; i < end; ) {
      int count = 0;
      for (int k = 1; k <= 16; k++) {
        count += jpeg[i + k] & 0xFF;
      }
      out.add(Arrays.copyOfRange(jpeg, i, i + 17 + count));
      i += 17 + count;
    }
    return out;
  }

  /** {@code t} as a DHT table of class/index {@code tc}. */
  static byte[] dht(int tc, JPEGHuffmanTable t) {
    ByteArrayOutputStream b = new ByteArrayOutputStream();
    b.write(tc);
    for (short v : t.getLengths()) {
      b.write(v);
    }
    for (short v : t.getValues()) {
      b.write(v);
    }
    return b.toByteArray();
  }

  static int[] pixels(byte[] jpeg) throws Exception {
    BufferedImage img = ImageIO.read(new ByteArrayInputStream(jpeg));
    return img.getRGB(0, 0, img.getWidth(), img.getHeight(), null, 0, img.getWidth());
  }

  @Test
  void aFrameWithoutDhtIsAcceptedAndItsCopyHoldsTheStandardTablesBeforeItsFirstScan() throws Exception {
    byte[] jpeg = ImageHeaderTest.encode("jpg", 64, 48); // ImageIO writes the standard tables
    assertEquals(0, prep(PIPELINE).check(direct(jpeg)).standardTables(), "tables defined: untouched");
    byte[] frame = without(jpeg, 0xC4);
    ImageHeader h = prep(PIPELINE).check(direct(frame));
    assertEquals(0x33, h.standardTables(), "DC and AC tables 0 and 1");
    assertEquals(firstScan(frame), h.firstScan());
    byte[] copy = withStandardTables(frame, h);
    int at = h.firstScan();
    assertArrayEquals(Arrays.copyOf(frame, at), Arrays.copyOf(copy, at));
    assertArrayEquals(Arrays.copyOfRange(frame, at, frame.length), Arrays.copyOfRange(copy, copy.length
        - (frame.length - at), copy.length));
    assertEquals(frame.length + 420, copy.length);
    List<byte[]> t = tables(copy, at);
    assertEquals(4, t.size());
    assertArrayEquals(dht(0x00, JPEGHuffmanTable.StdDCLuminance), t.get(0));
    assertArrayEquals(dht(0x10, JPEGHuffmanTable.StdACLuminance), t.get(1));
    assertArrayEquals(dht(0x01, JPEGHuffmanTable.StdDCChrominance), t.get(2));
    assertArrayEquals(dht(0x11, JPEGHuffmanTable.StdACChrominance), t.get(3));
    assertEquals(0, ImageHeader.read(direct(copy)).standardTables(), "the copy defines every table");
    assertArrayEquals(pixels(jpeg), pixels(copy), "ImageIO decodes the copy as the original");
  }

  @Test
  void aFrameThatDefinesTable1GetsOnlyTable0() throws Exception {
    byte[] frame = without(ImageHeaderTest.encode("jpg", 64, 48), 0xC4);
    int at = firstScan(frame);
    byte[] table1 = withStandardTables(frame, new ImageHeader(Format.JPEG, 64, 48, 3, false, false, 0x22, at));
    ImageHeader h = ImageHeader.read(direct(table1));
    assertEquals(0x11, h.standardTables());
    byte[] copy = withStandardTables(table1, h);
    List<byte[]> t = tables(copy, h.firstScan());
    assertEquals(2, t.size());
    assertArrayEquals(dht(0x00, JPEGHuffmanTable.StdDCLuminance), t.get(0));
    assertArrayEquals(dht(0x10, JPEGHuffmanTable.StdACLuminance), t.get(1));
    assertEquals(table1.length + 4 + 2 * 17 + 12 + 162, copy.length);
  }

  @Test
  void aScanThatUsesAnUndefinedTable2IsStillRefused() throws Exception {
    byte[] jpeg = ImageHeaderTest.encode("jpg", 64, 48);
    for (byte[] b : List.of(jpeg, without(jpeg, 0xC4))) {
      byte[] dc2 = b.clone();
      dc2[firstScan(b) + 6] = 0x20; // component 1: DC table 2, AC table 0
      assertEquals("unsupported JPEG: the first scan's component 1 uses Huffman DC table 2, which no DHT segment"
          + " before it defines (only tables 0 and 1 have standard ones)", refusal(prep(PIPELINE), dc2));
      byte[] ac3 = b.clone();
      ac3[firstScan(b) + 6] = 0x03;
      assertEquals("unsupported JPEG: the first scan's component 1 uses Huffman AC table 3, which no DHT segment"
          + " before it defines (only tables 0 and 1 have standard ones)", refusal(prep(PIPELINE), ac3));
    }
    assertTrue(refusal(prep(PIPELINE), without(without(jpeg, 0xC4), 0xDB)).startsWith("corrupt JPEG: the first"
        + " scan's component 1 uses quantization table 0"), "no DQT: refused, frame or not");
  }

  @Test
  void theCopyIsTheShimsGoldenFixture() throws Exception {
    byte[] frame = Files.readAllBytes(ProtocolFixturesTest.FIXTURES.resolve("mjpeg-frame-v1.jpg"));
    byte[] golden = Files.readAllBytes(ProtocolFixturesTest.FIXTURES.resolve("mjpeg-frame-v1-standard-tables.jpg"));
    assertArrayEquals(golden, withStandardTables(frame, ImageHeader.read(direct(frame))));
  }

  /** A JPEG OpenCV writes with Huffman tables optimized for the image (so not the standard ones). */
  static ByteBuffer optimized(int w, int h) {
    ByteBuffer src = NativeJpegTest.jpeg(w, h, Sampling.S444, 77);
    try (BytePointer in = new BytePointer(src); Mat buf = new Mat(1, src.remaining(), CV_8UC1, in);
        Mat px = imdecode(buf, IMREAD_COLOR); BytePointer out = new BytePointer()) {
      assertTrue(imencode(".jpg", px, out, new IntPointer(new int[] {IMWRITE_JPEG_QUALITY, 90,
          IMWRITE_JPEG_OPTIMIZE, 1})));
      byte[] b = new byte[(int) out.limit()];
      out.get(b);
      return NativeJpegTest.direct(b);
    }
  }

  /** Every table of {@code jpeg}'s DHT segments before its first scan, in hex. */
  static List<String> allTables(byte[] jpeg) {
    List<String> out = new ArrayList<>();
    for (int i = 2; (jpeg[i + 1] & 0xFF) != 0xDA; i += 2 + ((jpeg[i + 2] & 0xFF) << 8 | jpeg[i + 3] & 0xFF)) {
      if ((jpeg[i + 1] & 0xFF) == 0xC4) {
        tables(jpeg, i).forEach(t -> out.add(HexFormat.of().formatHex(t)));
      }
    }
    return out;
  }

  static byte[] bytes(ByteBuffer b) {
    byte[] a = new byte[b.remaining()];
    b.duplicate().get(a);
    return a;
  }

  static byte[] run(ImagePrep p, ByteBuffer img, long epoch) throws Exception {
    ByteBuffer out = ByteBuffer.allocateDirect((int) p.pipeline().sampleBytes());
    p.run(img.duplicate(), Digest.of(img.duplicate()), ImagePrep.rng(7, epoch, 3), out);
    byte[] b = new byte[out.capacity()];
    out.get(b);
    return b;
  }

  /** A check of prep path number {@code path} (0: OpenCV's) in {@code epoch}. */
  interface PathCheck {
    void run(ImagePrep p, int path, int epoch) throws Exception;
  }

  /**
   * Runs {@code check} on every prep path and cache form of pipeline {@code pl}, in epochs 0 and 1 (the cache forms
   * are made, then used); whether both cache forms were made.
   */
  static boolean onEveryPath(String pl, PathCheck check) throws Exception {
    String resize = "{\"ops\":[{\"op\":\"decode\"},{\"op\":\"resize\",\"size\":80},"
        + "{\"op\":\"center_crop\",\"size\":64}]}";
    try (BufferAllocator reindexMem = ROOT.newChildAllocator("reindexed", 0, 16L << 20);
        BufferAllocator decodedMem = ROOT.newChildAllocator("decoded", 0, 16L << 20);
        ReindexedJpegs reindexed = new ReindexedJpegs(reindexMem);
        DecodedImages decoded = new DecodedImages(decodedMem)) {
      List<ImagePrep> preps = List.of(NativeJpegTest.prep(pl, Decoder.OPENCV), NativeJpegTest.prep(pl,
          Decoder.NATIVE), NativeJpegTest.prep(pl, Decoder.NATIVE_FULL), NativeJpegTest.prep(resize,
          Decoder.NATIVE), new ImagePrep(PrepPipeline.parse(pl), BUDGET, Decoder.NATIVE, reindexed),
          new ImagePrep(PrepPipeline.parse(pl), BUDGET, Decoder.NATIVE, null, decoded));
      for (int k = 0; k < preps.size(); k++) {
        for (int epoch = 0; epoch < 2; epoch++) {
          check.run(preps.get(k), k, epoch);
        }
      }
      return reindexMem.getAllocatedMemory() > 0 && decodedMem.getAllocatedMemory() > 0;
    }
  }

  @Test
  void everyPathDecodesAFrameAsItsStandardTablesWrittenOutWhateverItsThreadDecodedBefore() throws Exception {
    NativeJpegTest.loaded();
    ByteBuffer other = optimized(320, 240);
    String pl = rrc(96, "[0.08,1.0]", "[0.75,1.3333333333333333]", "uint8", "NHWC");
    for (Sampling s : List.of(Sampling.S420, Sampling.S444, Sampling.GRAY)) {
      ByteBuffer standard = NativeJpegTest.jpeg(400, 300, s, 11 + s.ordinal()); // OpenCV writes the standard tables
      byte[] frame = without(bytes(standard), 0xC4);
      assertFalse(allTables(bytes(other)).stream().anyMatch(allTables(bytes(standard))::contains),
          "the other image's tables are not the standard ones");
      assertTrue(onEveryPath(pl, (p, k, epoch) -> {
        run(p, other, epoch); // this thread has just decoded an image with other tables
        byte[] fromFrame = run(p, direct(frame), epoch);
        assertArrayEquals(run(p, standard, epoch), fromFrame, s + " prep #" + k + " epoch " + epoch);
      }), "cache forms made");
    }
    assertEquals(0, BUDGET.reservedBytes(), "the copies' memory is given back");
  }

  /** The whole of {@code jpeg} ({@code w x h}) as the native decoder alone decodes it: RGB rows. */
  static byte[] nativeDecode(ByteBuffer jpeg, int w, int h) throws Exception {
    ByteBuffer px = ByteBuffer.allocateDirect(w * h * 3);
    NativeJpeg.decodeScaled(jpeg, jpeg.position(), jpeg.remaining(), w, h, 1, px, 0, w, h);
    byte[] b = new byte[px.capacity()];
    px.get(b);
    return b;
  }

  @Test
  void theNativeDecoderFillsTheStandardTablesIntoAFrameItselfWhateverItsThreadDecodedBefore() throws Exception {
    NativeJpegTest.loaded();
    ByteBuffer standard = NativeJpegTest.jpeg(400, 300, Sampling.S420, 5); // OpenCV writes the standard tables
    ByteBuffer frame = direct(without(bytes(standard), 0xC4)); // no header check, no inserted copy: libjpeg alone
    byte[] want = nativeDecode(standard, 400, 300);
    nativeDecode(optimized(320, 240), 320, 240); // this thread first decodes other Huffman tables 0 and 1
    assertArrayEquals(want, nativeDecode(frame, 400, 300));
  }

  /** The marker (FFxx) at {@code at}. */
  static int marker(byte[] jpeg, int at) {
    return (jpeg[at] & 0xFF) << 8 | jpeg[at + 1] & 0xFF;
  }

  /** Where each of {@code jpeg}'s marker segments starts, scan by scan (the entropy-coded data skipped). */
  static List<Integer> segments(byte[] jpeg) {
    List<Integer> out = new ArrayList<>();
    for (int i = 2; marker(jpeg, i) != 0xFFD9; ) {
      out.add(i);
      boolean scan = marker(jpeg, i) == 0xFFDA;
      i += 2 + ((jpeg[i + 2] & 0xFF) << 8 | jpeg[i + 3] & 0xFF);
      while (scan && !((jpeg[i] & 0xFF) == 0xFF && jpeg[i + 1] != 0 && (jpeg[i + 1] & 0xF8) != 0xD0)) {
        i++; // scan data up to the next marker other than a stuffed byte or a restart marker
      }
    }
    return out;
  }

  @Test
  void aLaterScanWhoseHuffmanTableNoDhtDefinesIsRefusedByRuleWhateverItsThreadDecodedBefore() throws Exception {
    NativeJpegTest.loaded();
    byte[] progressive = bytes(NativeJpegTest.jpeg(400, 300, Sampling.PROGRESSIVE, 21));
    List<Integer> seg = segments(progressive);
    List<Integer> scans = seg.stream().filter(i -> marker(progressive, i) == 0xFFDA).toList();
    int second = scans.get(1);
    int dht = seg.get(seg.indexOf(second) - 1);
    assertEquals(0xFFC4, marker(progressive, dht), "the second scan's tables are defined right before it");
    assertEquals(List.of(0x10), tables(progressive, dht).stream().map(t -> t[0] & 0xFF).toList(), "AC table 0");
    assertEquals(1, progressive[second + 4], "one component");
    assertEquals(0x00, progressive[second + 6], "its DC and AC tables: 0");
    byte[] bad = progressive.clone();
    bad[dht + 4] = 0x13; // that DHT now defines AC table 3, and nothing before the scan defines AC table 0
    for (int at : seg.subList(0, seg.indexOf(second))) {
      if (marker(bad, at) == 0xFFC4) {
        assertFalse(tables(bad, at).stream().anyMatch(t -> t[0] == 0x10), "AC table 0 defined at " + at);
      }
    }
    // libjpeg-turbo's progressive decoder fills no standard table (a fresh one refuses the scan: "Huffman table 0x00
    // was not defined"); the header check refuses it before any decoder, in the words the device's check uses
    String why = "unsupported JPEG: the scan at byte " + second + "'s component 1 uses Huffman AC table 0, which no"
        + " DHT segment before it defines (only a sequential frame's tables 0 and 1 have standard ones)";
    assertEquals(why, refusal(prep(PIPELINE), bad));
    ByteBuffer other = direct(progressive);
    String pl = rrc(96, "[0.08,1.0]", "[0.75,1.3333333333333333]", "uint8", "NHWC");
    onEveryPath(pl, (p, k, epoch) -> {
      run(p, other, epoch); // this thread has just decoded the image intact, which defines AC table 0
      assertEquals(why, assertThrows(BadImageException.class, () -> run(p, direct(bad), epoch)).getMessage(),
          "prep #" + k);
    });
    assertEquals(0, BUDGET.reservedBytes(), "the decode memory is given back");
  }

}
