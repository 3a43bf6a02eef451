package io.unstall.flight.prep;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.unstall.flight.prep.ImageHeader.Format;
import io.unstall.flight.protocol.ProtocolFixturesTest;
import java.awt.Color;
import java.awt.Graphics2D;
import java.awt.image.BufferedImage;
import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.Random;
import javax.imageio.IIOImage;
import javax.imageio.ImageIO;
import javax.imageio.ImageTypeSpecifier;
import javax.imageio.ImageWriteParam;
import javax.imageio.ImageWriter;
import javax.imageio.metadata.IIOMetadata;
import javax.imageio.stream.MemoryCacheImageOutputStream;
import org.w3c.dom.Element;
import org.junit.jupiter.api.Test;

/** The header checks that run before any native decode: real JPEG/PNG/TIFF bytes from ImageIO, patched or cut. */
class ImageHeaderTest {
  static final String PIPELINE = "{\"ops\":[{\"op\":\"decode\"},{\"op\":\"random_resized_crop\",\"size\":32}]}";

  static byte[] encode(String format, int w, int h) throws Exception {
    BufferedImage img = new BufferedImage(w, h, BufferedImage.TYPE_INT_RGB);
    Graphics2D g = img.createGraphics();
    g.setColor(Color.ORANGE);
    g.fillRect(w / 4, h / 4, w / 2, h / 2);
    g.dispose();
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    assertTrue(ImageIO.write(img, format, out), "ImageIO writes " + format);
    return out.toByteArray();
  }

  /** A decompression bomb: a small real JPEG whose frame header (SOF0) now declares {@code w x h}. */
  static byte[] bomb(byte[] jpeg, int w, int h) {
    byte[] b = jpeg.clone();
    for (int i = 2; i + 9 < b.length; i++) {
      if ((b[i] & 0xFF) == 0xFF && (b[i + 1] & 0xFF) == 0xC0) {
        b[i + 5] = (byte) (h >> 8);
        b[i + 6] = (byte) h;
        b[i + 7] = (byte) (w >> 8);
        b[i + 8] = (byte) w;
        return b;
      }
    }
    throw new AssertionError("no SOF0 marker");
  }

  static ByteBuffer direct(byte[] b) {
    return ByteBuffer.allocateDirect(b.length).put(b).flip();
  }

  static ImagePrep prep(String pipeline) {
    return new ImagePrep(PrepPipeline.parse(pipeline), null); // check() and workingBytes() need no budget
  }

  static String refusal(ImagePrep p, byte[] bytes) {
    return assertThrows(BadImageException.class, () -> p.check(direct(bytes))).getMessage();
  }

  @Test
  void realJpegAndPngHeadersGiveTheirSize() throws Exception {
    ImageHeader j = ImageHeader.read(direct(encode("jpg", 123, 45)));
    assertEquals(new ImageHeader(Format.JPEG, 123, 45, 3, false, false), j);
    ImageHeader p = ImageHeader.read(direct(encode("png", 67, 89)));
    assertEquals(Format.PNG, p.format());
    assertEquals(67, p.width());
    assertEquals(89, p.height());
    ByteBuffer b = direct(encode("jpg", 10, 10));
    int pos = b.position();
    ImageHeader.read(b);
    assertEquals(pos, b.position(), "reading the header does not move the buffer");
  }

  @Test
  void aDecompressionBombIsRefusedFromItsHeader() throws Exception {
    byte[] bomb = bomb(encode("jpg", 40, 30), 65535, 65535);
    assertTrue(bomb.length < 4096, "a tiny file: " + bomb.length);
    ImageHeader h = ImageHeader.read(direct(bomb));
    assertEquals(65535, h.width());
    assertEquals(4294836225L, h.pixels(), "long arithmetic: above 2^31");
    String m = refusal(prep(PIPELINE), bomb);
    assertTrue(m.contains("decompression bomb? the jpeg header declares 65535x65535 pixels (4294836225), "
        + "above the cap of 89478485"
        + " (--max-decode-pixels / decode max_pixels)"), m);
    // The case: 30000x30000 (9e8 pixels, below OpenCV's own 2^30 limit) is refused too.
    assertTrue(refusal(prep(PIPELINE), bomb(encode("jpg", 40, 30), 30000, 30000)).contains("30000x30000"));
    // A pipeline may lower (or raise) the cap.
    String low = PIPELINE.replace("{\"op\":\"decode\"}", "{\"op\":\"decode\",\"max_pixels\":1000}");
    assertTrue(refusal(prep(low), encode("jpg", 40, 30)).contains("above the cap of 1000"));
    prep(low).check(direct(encode("jpg", 40, 25)));
  }

  @Test
  void anExtremeAspectRatioIsRefused() throws Exception {
    String m = refusal(prep(PIPELINE), encode("png", 5000, 10));
    assertTrue(m.contains("the png header declares 5000x10 pixels, an aspect ratio of 500.0, above the cap of 100"
        + " (--max-decode-aspect-ratio / decode max_aspect_ratio)"), m);  // the words of the device path's check
    String low = PIPELINE.replace("{\"op\":\"decode\"}", "{\"op\":\"decode\",\"max_aspect_ratio\":1.5}");
    assertTrue(refusal(prep(low), encode("png", 30, 16)).contains("an aspect ratio of 1.9, above the cap of 1.5 "),
        refusal(prep(low), encode("png", 30, 16)));
    prep(PIPELINE.replace("{\"op\":\"decode\"}", "{\"op\":\"decode\",\"max_aspect_ratio\":600}"))
        .check(direct(encode("png", 5000, 10)));
  }

  @Test
  void otherFormatsAreNamedAndRefusedUnlessThePipelineAcceptsThem() throws Exception {
    byte[] tiff = encode("tiff", 20, 20); // a TIFF renamed .jpg is still a TIFF
    String m = refusal(prep(PIPELINE), tiff);
    assertTrue(m.startsWith("a TIFF file (first bytes 4d 4d 00 2a")
        || m.startsWith("a TIFF file (first bytes 49 49 2a 00"), m);
    assertTrue(m.endsWith("not one of the formats the pipeline decodes: jpeg, png (decode \"formats\")"), m);
    assertTrue(refusal(prep(PIPELINE), encode("bmp", 8, 8)).startsWith("a BMP file"));
    assertTrue(refusal(prep(PIPELINE), encode("gif", 8, 8)).startsWith("a GIF file"));
    String pngOnly = PIPELINE.replace("{\"op\":\"decode\"}", "{\"op\":\"decode\",\"formats\":[\"png\"]}");
    assertTrue(refusal(prep(pngOnly), encode("jpg", 8, 8)).startsWith("a JPEG file"));
    // WebP (a VP8L header: signature 0x2f, then 14 bits width-1 and 14 bits height-1)
    byte[] webp = webpLossless(300, 200);
    assertTrue(refusal(prep(PIPELINE), webp).startsWith("a WebP file"));
    ImageHeader h = prep(PIPELINE.replace("{\"op\":\"decode\"}", "{\"op\":\"decode\",\"formats\":[\"webp\",\"jpg\"]}"))
        .check(direct(webp));
    assertEquals(300, h.width());
    assertEquals(200, h.height());
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> PrepPipeline.parse(
            PIPELINE.replace("{\"op\":\"decode\"}", "{\"op\":\"decode\",\"formats\":[\"tiff\"]}")));
    assertTrue(e.getMessage().contains("prep op #0 'decode': \"formats\" may name jpeg, png and webp"), e.getMessage());
  }

  static byte[] webpLossless(int w, int h) {
    ByteBuffer b = ByteBuffer.allocate(40).order(java.nio.ByteOrder.LITTLE_ENDIAN);
    b.put("RIFF".getBytes()).putInt(32).put("WEBP".getBytes()).put("VP8L".getBytes()).putInt(20);
    b.put((byte) 0x2F).putInt((w - 1) | (h - 1) << 14);
    return b.array();
  }

  @Test
  void truncatedAndGarbageFilesSayWhatIsWrong() throws Exception {
    byte[] jpeg = encode("jpg", 64, 48);
    String half = refusal(prep(PIPELINE), Arrays.copyOf(jpeg, jpeg.length - 10));
    assertTrue(half.startsWith("truncated JPEG: no end-of-image marker (FF D9) after the scan data"), half);
    assertTrue(refusal(prep(PIPELINE), Arrays.copyOf(jpeg, 30)).startsWith("truncated JPEG: "),
        "cut inside the header");
    byte[] png = encode("png", 64, 48);
    assertTrue(refusal(prep(PIPELINE), Arrays.copyOf(png, png.length - 20)).startsWith("truncated PNG: no IEND chunk"));
    assertTrue(refusal(prep(PIPELINE), Arrays.copyOf(png, 20)).startsWith("truncated PNG"));
    String garbage = refusal(prep(PIPELINE), "hello, not an image".getBytes());
    assertEquals("not an image: no image format starts with the bytes 68 65 6c 6c 6f 2c 20 6e (19 bytes in all)",
        garbage);
    assertEquals("an empty file (0 bytes)", refusal(prep(PIPELINE), new byte[0]));
    byte[] magicThenNoise = new byte[200];
    new java.util.Random(1).nextBytes(magicThenNoise);
    magicThenNoise[0] = (byte) 0xFF;
    magicThenNoise[1] = (byte) 0xD8;
    magicThenNoise[2] = (byte) 0xFF;
    String noise = refusal(prep(PIPELINE), magicThenNoise);
    assertTrue(noise.startsWith("corrupt JPEG") || noise.startsWith("truncated JPEG"), noise);
    // Trailing bytes after the end marker are tolerated (some cameras append data).
    byte[] padded = Arrays.copyOf(jpeg, jpeg.length + 64);
    assertEquals(64, prep(PIPELINE).check(direct(padded)).width());
  }

  /** {@code png} (from ImageIO: signature, IHDR, IDAT..., IEND) with {@code bytes} written at {@code at}. */
  static byte[] pngPatched(byte[] png, int at, int... bytes) {
    byte[] b = png.clone();
    for (int k = 0; k < bytes.length; k++) {
      b[at + k] = (byte) bytes[k];
    }
    return b;
  }

  /** The words python-shim's png_rules gives the device's share of a batch for the same bytes. */
  @Test
  void aMalformedPngIsRefusedByItsStructureInTheDevicesWords() throws Exception {
    byte[] png = encode("png", 64, 48);
    ImagePrep p = prep(PIPELINE);
    assertEquals("truncated PNG: 20 bytes, shorter than a PNG header (33)", refusal(p, Arrays.copyOf(png, 20)));
    assertEquals("corrupt PNG: the first chunk is not a 13-byte IHDR", refusal(p, pngPatched(png, 11, 14)));
    assertEquals("corrupt PNG: the first chunk is not a 13-byte IHDR",
        refusal(p, pngPatched(png, 12, 'I', 'H', 'D', 'X')));
    assertEquals("corrupt PNG: IHDR declares 0x48 pixels", refusal(p, pngPatched(png, 16, 0, 0, 0, 0)));
    assertEquals("corrupt PNG: IHDR declares 64x2147483648 pixels", refusal(p, pngPatched(png, 20, 0x80, 0, 0, 0)));
    assertEquals("corrupt PNG: IHDR declares color type 9", refusal(p, pngPatched(png, 25, 9)));
    byte[] iend = Arrays.copyOfRange(png, png.length - 12, png.length);
    byte[] noIdat = Arrays.copyOf(png, 33 + 12);
    System.arraycopy(iend, 0, noIdat, 33, 12);
    assertEquals("truncated PNG: the file ends at byte 45 before any image data (IDAT)", refusal(p, noIdat));
    assertEquals("truncated PNG: no IEND chunk after the image data, " + (png.length - 12) + " bytes in all",
        refusal(p, Arrays.copyOf(png, png.length - 12)));
    assertEquals(48, p.check(direct(Arrays.copyOf(png, png.length + 30))).height()); // bytes after IEND
  }

  /** {@code jpeg} without its segments of {@code marker} before the first scan (DQT, DHT). */
  static byte[] without(byte[] jpeg, int marker) {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    out.write(jpeg, 0, 2);
    int i = 2;
    while ((jpeg[i + 1] & 0xFF) != 0xDA) {
      int end = i + 2 + ((jpeg[i + 2] & 0xFF) << 8 | jpeg[i + 3] & 0xFF);
      if ((jpeg[i + 1] & 0xFF) != marker) {
        out.write(jpeg, i, end - i);
      }
      i = end;
    }
    out.write(jpeg, i, jpeg.length - i);
    return out.toByteArray();
  }

  @Test
  void aScanWhoseQuantizationTableIsNotDefinedIsRefusedNotDecodedWithTheLastImagesTables() throws Exception {
    byte[] jpeg = encode("jpg", 64, 48);
    assertEquals("corrupt JPEG: the first scan's component 1 uses quantization table 0, which no DQT segment before"
        + " it defines", refusal(prep(PIPELINE), without(jpeg, 0xDB)));
    assertEquals(48, prep(PIPELINE).check(direct(jpeg)).height());
    // Huffman tables 0 and 1 left out (a Motion-JPEG frame): StandardHuffmanTablesTest.
  }

  /**
   * A noisy {@code w x h} JPEG from ImageIO (4:2:0 color, or gray): with a restart interval of {@code interval} MCUs
   * (a DRI segment; 0: none), or progressive.
   */
  static byte[] jpeg(int w, int h, boolean gray, int interval, boolean progressive) throws Exception {
    BufferedImage img = new BufferedImage(w, h, gray ? BufferedImage.TYPE_BYTE_GRAY : BufferedImage.TYPE_INT_RGB);
    Random r = new Random(5);
    for (int y = 0; y < h; y++) {
      for (int x = 0; x < w; x++) {
        img.setRGB(x, y, r.nextInt(0x1000000));
      }
    }
    ImageWriter writer = ImageIO.getImageWritersByFormatName("jpeg").next();
    ImageWriteParam param = writer.getDefaultWriteParam();
    if (progressive) {
      param.setProgressiveMode(ImageWriteParam.MODE_DEFAULT);
    }
    IIOMetadata meta = writer.getDefaultImageMetadata(ImageTypeSpecifier.createFromRenderedImage(img), param);
    if (interval > 0) {
      String format = "javax_imageio_jpeg_image_1.0";
      Element root = (Element) meta.getAsTree(format);
      Element dri = new javax.imageio.metadata.IIOMetadataNode("dri");
      dri.setAttribute("interval", Integer.toString(interval));
      Element markers = (Element) root.getElementsByTagName("markerSequence").item(0);
      markers.insertBefore(dri, markers.getFirstChild());
      meta.setFromTree(format, root);
    }
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    try (MemoryCacheImageOutputStream ios = new MemoryCacheImageOutputStream(out)) {
      writer.setOutput(ios);
      writer.write(null, new IIOImage(img, null, meta), param);
    } finally {
      writer.dispose();
    }
    return out.toByteArray();
  }

  /** Where the first scan's data starts: after the SOS segment. */
  static int scanData(byte[] jpeg) {
    int i = 2;
    while ((jpeg[i + 1] & 0xFF) != 0xDA) {
      i += 2 + ((jpeg[i + 2] & 0xFF) << 8 | jpeg[i + 3] & 0xFF);
    }
    return i + 2 + ((jpeg[i + 2] & 0xFF) << 8 | jpeg[i + 3] & 0xFF);
  }

  static byte[] patched(byte[] jpeg, int at, int... bytes) {
    byte[] b = jpeg.clone();
    for (int k = 0; k < bytes.length; k++) {
      b[at + k] = (byte) bytes[k];
    }
    return b;
  }

  @Test
  void aMarkerInsideASingleScansDataIsRefusedWhateverTheCropWithTheDevicesWords() throws Exception {
    byte[] jpeg = jpeg(128, 96, false, 0, false);
    assertEquals(96, prep(PIPELINE).check(direct(jpeg)).height(), "intact");
    int mid = (scanData(jpeg) + jpeg.length) / 2;
    assertEquals("corrupt JPEG: marker 0xFFC4 at byte " + mid + " cuts the scan data",
        refusal(prep(PIPELINE), patched(jpeg, mid, 0xFF, 0xC4)));
    assertEquals("corrupt JPEG: marker 0xFFD3 at byte " + mid + " cuts the scan data (no restart interval is declared)",
        refusal(prep(PIPELINE), patched(jpeg, mid, 0xFF, 0xD3)));
    // A stuffed 0xFF (FF 00) and fill bytes (FF FF) are scan data.
    ImageHeader.read(direct(patched(jpeg, mid, 0xFF, 0x00, 0xFF, 0xFF, 0x00)));
    // libjpeg refuses a malformed table before it reads any scan data, in its words: the rule leaves it to libjpeg.
    int dqt = 2;
    while ((jpeg[dqt + 1] & 0xFF) != 0xDB) {
      dqt += 2 + ((jpeg[dqt + 2] & 0xFF) << 8 | jpeg[dqt + 3] & 0xFF);
    }
    ImageHeader.read(direct(patched(patched(jpeg, mid, 0xFF, 0xC4), dqt + 4, 0x07))); // libjpeg: Bogus DQT index 7
  }

  @Test
  void aMarkerIsFoundAtEveryOffsetOfTheScanData() throws Exception {
    // The walk reads the scan data eight bytes at a time: a marker at any offset of a word, or in the bytes after the
    // last whole word, is the one reported.
    byte[] jpeg = jpeg(128, 96, false, 0, false);
    for (int at = scanData(jpeg); at + 2 < jpeg.length - 2; at++) { // up to the end-of-image marker
      byte[] cut = patched(jpeg, at, 0xFF, 0xC4);
      assertEquals("corrupt JPEG: marker 0xFFC4 at byte " + at + " cuts the scan data",
          assertThrows(BadImageException.class, () -> ImageHeader.read(direct(cut))).getMessage());
    }
  }

  @Test
  void restartMarkersPassWithARestartIntervalAndTooFewOfThemAreATruncatedFile() throws Exception {
    // 128x96 at 4:2:0: 8 x 6 MCUs of 16x16 pixels; 5 a restart interval: 10 intervals, 9 restart markers.
    byte[] rst = jpeg(128, 96, false, 5, false);
    assertEquals(128, prep(PIPELINE).check(direct(rst)).width(), "a restart-marked JPEG");
    // gray: one 8x8 block an MCU, 16 x 12 = 192 of them, 3 an interval (64 intervals)
    assertEquals(128, prep(PIPELINE).check(direct(jpeg(128, 96, true, 3, false))).width(), "gray, restart-marked");
    int sixth = -1; // the sixth restart marker
    for (int i = scanData(rst), seen = 0; seen < 6; i++) {
      if ((rst[i] & 0xFF) == 0xFF && (rst[i + 1] & 0xF8) == 0xD0) {
        assertEquals(0xD0 + seen, rst[i + 1] & 0xFF, "RSTn in order");
        sixth = i;
        seen++;
      }
    }
    byte[] cut = Arrays.copyOf(rst, sixth + 4);
    cut[sixth + 2] = (byte) 0xFF;
    cut[sixth + 3] = (byte) 0xD9;
    assertEquals("truncated JPEG: the scan data ends after 7 of its 10 restart intervals",
        refusal(prep(PIPELINE), cut));
    // The same bytes without the DRI segment: restart markers with no interval declared.
    assertEquals("corrupt JPEG: marker 0xFFD0 at byte " + (firstRestart(rst) - 6)
        + " cuts the scan data (no restart interval is declared)", refusal(prep(PIPELINE), without(rst, 0xDD)));
  }

  @Test
  void oneRestartMarkerTooManyCutsAnIntervalUnlessTheEndFollowsIt() throws Exception {
    byte[] rst = jpeg(128, 96, false, 5, false); // 10 intervals, 9 restart markers
    int at = rst.length - 10; // inside the last interval's data
    assertNotEquals(0xFF, rst[at - 1] & 0xFF, "not after an 0xFF");
    assertEquals("corrupt JPEG: marker 0xFFD1 at byte " + at + " cuts the scan data (its 10 restart intervals need 9"
        + " restart markers)", refusal(prep(PIPELINE), inserted(rst, at, 0xFF, 0xD1)));
    // libjpeg has read every interval before it: decoded
    assertEquals(128, prep(PIPELINE).check(direct(inserted(rst, rst.length - 2, 0xFF, 0xD1))).width());
  }

  static byte[] inserted(byte[] jpeg, int at, int... bytes) {
    byte[] b = new byte[jpeg.length + bytes.length];
    System.arraycopy(jpeg, 0, b, 0, at);
    for (int k = 0; k < bytes.length; k++) {
      b[at + k] = (byte) bytes[k];
    }
    System.arraycopy(jpeg, at, b, at + bytes.length, jpeg.length - at);
    return b;
  }

  static int firstRestart(byte[] jpeg) {
    for (int i = scanData(jpeg); ; i++) {
      if ((jpeg[i] & 0xFF) == 0xFF && (jpeg[i + 1] & 0xF8) == 0xD0) {
        return i;
      }
    }
  }

  @Test
  void everyScanOfAProgressiveJpegIsWalkedRestartIntervalsIncluded() throws Exception {
    for (boolean gray : new boolean[] {false, true}) {
      for (int interval : new int[] {0, 1, 5}) {
        byte[] prog = jpeg(128, 96, gray, interval, true);
        ImageHeader h = prep(PIPELINE).check(direct(prog));
        assertTrue(h.multiScan(), "progressive");
        assertEquals(96, h.height());
        assertEquals(0, h.standardTables());
      }
    }
    byte[] prog = jpeg(128, 96, false, 0, true);
    int third = StandardHuffmanTablesTest.segments(prog).stream()
        .filter(i -> StandardHuffmanTablesTest.marker(prog, i) == 0xFFDA).skip(2).findFirst().orElseThrow();
    int mid = third + 2 + ((prog[third + 2] & 0xFF) << 8 | prog[third + 3] & 0xFF) + 5; // in the third scan's data
    assertNotEquals(0xFF, prog[mid - 1] & 0xFF, "not after an 0xFF");
    assertEquals("corrupt JPEG: marker 0xFFC0 at byte " + mid + " cuts the scan data",
        refusal(prep(PIPELINE), inserted(prog, mid, 0xFF, 0xC0)));
    assertEquals("corrupt JPEG: marker 0xFFD5 at byte " + mid + " cuts the scan data (no restart interval is declared)",
        refusal(prep(PIPELINE), inserted(prog, mid, 0xFF, 0xD5)));
  }

  /**
   * The golden pair of the rules on every scan: python-shim's jpeg_rules gives the same verdicts on these bytes. The
   * sidecar vouches for exactly the JPEGs the device's rules pass (no reason), with the fixture's standard tables and
   * first scan in the packed header ({@link VouchedHeaders}).
   */
  @Test
  void theRulesOnEveryScanGiveTheGoldenVerdicts() throws Exception {
    JsonNode cases = new ObjectMapper().readTree(ProtocolFixturesTest.FIXTURES.resolve("jpeg-scans-v1.json").toFile())
        .get("cases");
    assertEquals(62, cases.size());
    int vouched = 0;
    for (JsonNode c : cases) {
      byte[] b = HexFormat.of().parseHex(c.get("hex").asText());
      String name = c.get("name").asText();
      boolean passes = c.get("reason").isNull();
      if (passes || c.get("reason").asText().startsWith("libjpeg: ")) {
        ImageHeader h = ImageHeader.read(direct(b)); // a libjpeg reason: left to libjpeg, which refuses it so
        assertEquals(!passes, h.libjpegRefuses(), name);
        if (passes) {
          assertEquals(c.get("standard_tables").asInt(), h.standardTables(), name);
          assertEquals(c.get("first_scan").asInt(), h.firstScan(), name);
        }
      } else {
        assertEquals(c.get("reason").asText(),
            assertThrows(BadImageException.class, () -> ImageHeader.read(direct(b)), name).getMessage(), name);
      }
      long packed = VouchedHeaders.packed(direct(b));
      assertEquals(passes, packed != VouchedHeaders.NONE, name);
      if (passes) {
        vouched++;
        ImageHeader h = ImageHeader.read(direct(b));
        assertEquals(h.width() | (long) h.height() << 16, packed & 0xFFFFFFFFL, name);
        assertEquals(c.get("standard_tables").asLong(), packed >>> 32 & 0xFF, name);
        assertEquals(c.get("first_scan").asLong(), packed >>> 40, name);
      }
    }
    assertEquals(11, vouched);
  }

  @Test
  void workingBytesBoundTheDecodeAndTheOps() throws Exception {
    ImagePrep p = prep(PIPELINE);
    ImageHeader small = new ImageHeader(Format.JPEG, 1000, 1000, 3, false, false);
    long decoded = 1000L * 1000 * 3;
    long w = p.workingBytes(small);
    assertTrue(w >= decoded && w <= decoded + 32 * 32 * 3 * 2 + ImagePrep.DECODER_OVERHEAD, "w=" + w);
    ImageHeader progressive = new ImageHeader(Format.JPEG, 1000, 1000, 3, true, true);
    assertEquals(decoded * 2 + 1000L * 1000 * 3 * 2 + ImagePrep.DECODER_OVERHEAD, p.workingBytes(progressive),
        "rotated copy and coefficients");
    // resize(256) of a 100:1 image makes a 256 x 25600 intermediate, counted
    ImagePrep resize = prep("{\"ops\":[{\"op\":\"decode\"},{\"op\":\"resize\",\"size\":256},"
        + "{\"op\":\"center_crop\",\"size\":224}]}");
    ImageHeader wide = new ImageHeader(Format.PNG, 10000, 100, 3, false, false);
    assertTrue(resize.workingBytes(wide) >= 10000L * 100 * 3 + 256L * 25600 * 3, "" + resize.workingBytes(wide));
    assertFalse(resize.workingBytes(wide) < 0);
  }
}
