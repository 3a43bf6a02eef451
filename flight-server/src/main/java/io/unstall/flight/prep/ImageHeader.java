package io.unstall.flight.prep;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Arrays;
import java.util.Locale;

/**
 * What an encoded image declares before any pixel is decoded: its format (from the magic bytes), size and color
 * components, read from the JPEG frame header (SOF), the PNG IHDR chunk or the WebP VP8/VP8L/VP8X header. The
 * sidecar checks these against the pipeline's formats and caps, and reserves the decode memory they imply, before
 * it hands the bytes to the native decoder. A header that is cut short, malformed, or followed by no end marker
 * (a truncated file, which libjpeg would otherwise decode with a gray bottom), a JPEG whose scan data a marker cuts,
 * or one of whose scans (each scan of a multi-scan JPEG, up to its end-of-image marker) uses a table that no segment
 * before it defines, is a {@link BadImageException}.
 *
 * @param exif the file carries EXIF metadata, so the decoder may rotate the image (one more copy of it)
 * @param multiScan a progressive, lossless or non-interleaved JPEG: libjpeg keeps every coefficient of the image
 * @param standardTables a sequential JPEG a scan of which uses a Huffman table 0 or 1 that no DHT segment before it
 *     defines (a Motion-JPEG frame): the slots still empty at its first scan, which libjpeg-turbo fills with the
 *     standard tables, bit t for DC table t and 4 + t for AC table t ({@link StandardHuffmanTables}); 0: none
 * @param firstScan where the first scan's marker (FF DA) starts, when {@code standardTables} is not 0
 * @param libjpegRefuses a JPEG whose structure passes the rules but whose header libjpeg-turbo 2.1 refuses (a
 *     malformed table or segment, a marker, coding process, frame or scan it does not take): left to the native
 *     decoder, which refuses it in libjpeg's words once the caps passed; python-shim's jpeg_rules gives the same
 *     words
 */
public record ImageHeader(Format format, int width, int height, int components, boolean exif, boolean multiScan,
    int standardTables, int firstScan, boolean libjpegRefuses) {
  /** The decoder's output is 8-bit BGR (OpenCV's IMREAD_COLOR). */
  static final int DECODED_CHANNELS = 3;

  /** A header whose Huffman tables are all defined (or that has none). */
  public ImageHeader(Format format, int width, int height, int components, boolean exif, boolean multiScan) {
    this(format, width, height, components, exif, multiScan, 0, 0);
  }

  /** A header libjpeg takes. */
  public ImageHeader(Format format, int width, int height, int components, boolean exif, boolean multiScan,
      int standardTables, int firstScan) {
    this(format, width, height, components, exif, multiScan, standardTables, firstScan, false);
  }

  /** The formats whose header the sidecar parses; a pipeline accepts a subset ({@code "formats"} of decode). */
  public enum Format {
    JPEG, PNG, WEBP;

    public String wire() {
      return name().toLowerCase(Locale.ROOT);
    }

    /** A format by its pipeline name ({@code jpg} is {@code jpeg}); null if unknown. */
    static Format of(String name) {
      String n = name.toLowerCase(Locale.ROOT);
      for (Format f : values()) {
        if (f.wire().equals(n)) {
          return f;
        }
      }
      return n.equals("jpg") ? JPEG : null;
    }
  }

  public long pixels() {
    return (long) width * height;
  }

  /** max(w, h) / min(w, h). */
  public double aspectRatio() {
    return (double) Math.max(width, height) / Math.min(width, height);
  }

  /**
   * An upper bound of the decoder's native memory, the decoded 8-bit BGR image included: the image, a rotated
   * copy when EXIF may ask for one, and libjpeg's whole-image coefficient buffer (2 bytes per pixel and
   * component) for multi-scan JPEGs.
   */
  public long decoderBytes() {
    long image = pixels() * DECODED_CHANNELS;
    long bytes = image * (exif ? 2 : 1);
    if (format == Format.JPEG && multiScan) {
      bytes += pixels() * components * 2;
    }
    if (format == Format.WEBP) {
      bytes += pixels(); // the decoder may produce BGRA before dropping alpha
    }
    return bytes;
  }

  public String describe() {
    return format.name() + " " + width + "x" + height;
  }

  /** The format {@code b} starts like, from its magic bytes; null for any other. */
  public static Format sniff(ByteBuffer b) {
    Bytes in = new Bytes(b);
    if (in.startsWith(0xFF, 0xD8, 0xFF)) {
      return Format.JPEG;
    }
    if (in.startsWith(0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A)) {
      return Format.PNG;
    }
    if (in.startsWith('R', 'I', 'F', 'F') && in.at(8, 'W', 'E', 'B', 'P')) {
      return Format.WEBP;
    }
    return null;
  }

  /**
   * Names what {@code b} is by its magic bytes, with its first bytes ("a TIFF file (first bytes 49 49 2a 00 ...)"),
   * so that a TIFF renamed .jpg says it is a TIFF; null when no image format starts so.
   */
  public static String describe(ByteBuffer b) {
    Bytes in = new Bytes(b);
    String kind = kind(in);
    return kind == null ? null : kind + " (first bytes " + in.hex(8) + ")";
  }

  /** Bytes no image format starts with. */
  static String notAnImage(ByteBuffer b) {
    Bytes in = new Bytes(b);
    return in.n == 0 ? "an empty file (0 bytes)"
        : "not an image: no image format starts with the bytes " + in.hex(8) + " (" + in.n + " bytes in all)";
  }

  /** Reads the header of {@code b} (position..limit; the buffer is not moved). */
  public static ImageHeader read(ByteBuffer b) throws BadImageException {
    Bytes in = new Bytes(b);
    Format f = sniff(b);
    if (f == null) {
      String what = describe(b);
      throw new BadImageException(what == null ? notAnImage(b) : what + ", not JPEG, PNG or WebP");
    }
    return switch (f) {
      case JPEG -> jpeg(in);
      case PNG -> png(in);
      case WEBP -> webp(in);
    };
  }

  private static String kind(Bytes in) {
    if (in.startsWith('I', 'I', 0x2A, 0x00) || in.startsWith('M', 'M', 0x00, 0x2A)
        || in.startsWith('I', 'I', 0x2B, 0x00) || in.startsWith('M', 'M', 0x00, 0x2B)) {
      return "a TIFF file";
    } else if (in.startsWith(0xFF, 0x4F, 0xFF, 0x51)
        || in.startsWith(0x00, 0x00, 0x00, 0x0C, 'j', 'P', 0x20, 0x20)) {
      return "a JPEG 2000 file";
    } else if (in.startsWith('G', 'I', 'F', '8')) {
      return "a GIF file";
    } else if (in.startsWith('B', 'M')) {
      return "a BMP file";
    } else if (in.startsWith(0x76, 0x2F, 0x31, 0x01)) {
      return "an OpenEXR file";
    } else if (in.startsWith('#', '?')) {
      return "a Radiance HDR file";
    } else if (in.startsWith(0x59, 0xA6, 0x6A, 0x95)) {
      return "a Sun raster file";
    } else if (in.n >= 12 && in.at(4, 'f', 't', 'y', 'p')) {
      return "an ISO media file (HEIF/AVIF)";
    } else if (in.n >= 2 && in.u8(0) == 'P'
        && (in.u8(1) >= '1' && in.u8(1) <= '7' || in.u8(1) == 'F' || in.u8(1) == 'f')) {
      return "a PNM/PFM file";
    } else if (in.startsWith('R', 'I', 'F', 'F') && in.at(8, 'W', 'E', 'B', 'P')) {
      return "a WebP file";
    } else if (in.startsWith(0xFF, 0xD8, 0xFF)) {
      return "a JPEG file";
    } else if (in.startsWith(0x89, 'P', 'N', 'G')) {
      return "a PNG file";
    }
    return null;
  }

  // -- JPEG ----------------------------------------------------------------------------------------------

  private static ImageHeader jpeg(Bytes in) throws BadImageException {
    int i = 2;
    Frame frame = null;
    boolean exif = false;
    int quant = 0; // bit t: quantization table t defined
    int huff = 0; // bit t: Huffman DC table t defined; bit 4 + t: AC table t
    boolean libjpegRefuses = false; // a malformed table or segment, which libjpeg refuses in its words
    int interval = 0; // MCUs per restart interval (DRI); 0: none
    int firstScan = -1; // where the first scan's marker starts; -1: no scan yet
    boolean multiScan = false;
    int empty = 0; // the Huffman slots 0 and 1 still empty at the first scan (bits as huff's)
    boolean standard = false; // a scan relies on the standard tables of those slots
    while (true) {
      if (i >= in.n) {
        if (firstScan >= 0) {
          throw noEndMarker(in);
        }
        throw new BadImageException("truncated JPEG: the file ends at byte " + in.n + ", inside its header"
            + (frame == null ? " (no frame header yet)" : " (no scan yet)"));
      }
      if (in.u8(i) != 0xFF) {
        throw new BadImageException("corrupt JPEG: byte " + i + " should start a marker (0xFF), it is 0x"
            + hex2(in.u8(i)));
      }
      while (i < in.n && in.u8(i) == 0xFF) {
        i++; // fill bytes
      }
      if (i >= in.n) {
        continue; // truncated, reported above
      }
      int marker = in.u8(i++);
      if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) {
        continue; // TEM, RSTn: no length
      }
      if (firstScan >= 0 && marker == 0xD9) {
        break; // the end of the image
      }
      if (firstScan >= 0 && !followsScan(marker)) {
        throw new BadImageException("corrupt JPEG: marker 0xFF" + hex2(marker) + " at byte " + (i - 2)
            + " between scans");
      }
      if (marker == 0xD8 || marker == 0xD9 || marker == 0x00) {
        throw new BadImageException("corrupt JPEG: marker 0xFF" + hex2(marker) + " at byte " + (i - 2)
            + (frame == null ? " before the frame header" : " before the first scan"));
      }
      if (i + 2 > in.n) {
        throw new BadImageException("truncated JPEG: the file ends at byte " + in.n + ", inside the length of"
            + " marker 0xFF" + hex2(marker));
      }
      int len = in.u16be(i);
      if (len < 2) {
        throw new BadImageException("corrupt JPEG: marker 0xFF" + hex2(marker) + " at byte " + (i - 2)
            + " has length " + len);
      }
      int end = i + len;
      if (end > in.n) {
        throw new BadImageException("truncated JPEG: the 0xFF" + hex2(marker) + " segment at byte " + (i - 2)
            + " needs " + len + " bytes, the file ends at byte " + in.n);
      }
      if (isSof(marker)) {
        if (frame != null) {
          throw new BadImageException("corrupt JPEG: a second frame header (0xFF" + hex2(marker) + ") at byte "
              + (i - 2));
        }
        frame = Frame.read(in, marker, i, end);
        libjpegRefuses |= unsupported(marker) || len != 8 + 3 * frame.components;
      } else if (marker == 0xC8) {
        libjpegRefuses = true; // libjpeg: Unsupported JPEG process: SOF type 0xc8
      } else if (marker == 0xDB || marker == 0xC4) {
        int t = marker == 0xDB ? quantTables(in, i + 2, end) : huffmanTables(in, i + 2, end);
        libjpegRefuses |= t < 0;
        if (t < 0 && firstScan >= 0) {
          break; // libjpeg refuses it after the scans before it, in its words
        }
        quant |= marker == 0xDB && t > 0 ? t : 0;
        huff |= marker == 0xC4 && t > 0 ? t : 0;
      } else if (marker == 0xE1 && len >= 8 && in.at(i + 2, 'E', 'x', 'i', 'f', 0, 0)) {
        exif = true;
      } else if (marker == 0xDD && len >= 4) {
        interval = in.u16be(i + 2);
      } else if (unknown(marker)) {
        libjpegRefuses = true; // libjpeg: Unsupported marker type 0x%02x
      } else if (marker == 0xDA) {
        if (frame == null) {
          throw new BadImageException("corrupt JPEG: a scan (0xFFDA) at byte " + (i - 2) + " before any frame header");
        }
        String scan = firstScan < 0 ? "the first scan" : "the scan at byte " + (i - 2);
        int tables = libjpegRefuses ? 0 : scanTables(in, i + 2, end, frame, quant, huff, scan, firstScan < 0);
        libjpegRefuses |= tables < 0;
        if (firstScan < 0) {
          firstScan = i - 2;
          empty = ~huff & 0x33;
          int inScan = len >= 3 ? in.u8(i + 2) : 0;
          multiScan = frame.sof != 0xC0 && frame.sof != 0xC1 && frame.sof != 0xC9 || inScan < frame.components;
          // The entropy-coded data never holds FF D9: it is the end-of-image marker, last but for trailing padding.
          if (!in.hasFromEnd(end, 0xFF, 0xD9)) {
            throw noEndMarker(in);
          }
        }
        if (libjpegRefuses) {
          break;
        }
        standard |= tables > 0;
        long mcus = frame.mcus(in, i + 2);
        i = scanEnd(in, end, interval > 0 ? (mcus + interval - 1) / interval : 0, multiScan);
        continue;
      }
      i = end;
    }
    return new ImageHeader(Format.JPEG, frame.width, frame.height, frame.components, exif, multiScan,
        standard ? empty : 0, standard ? firstScan : 0, libjpegRefuses);
  }

  private static BadImageException noEndMarker(Bytes in) {
    return new BadImageException("truncated JPEG: no end-of-image marker (FF D9) after the scan data, " + in.n
        + " bytes in all");
  }

  /**
   * A JPEG's frame header (SOF): its coding process (the SOF marker), sample precision, size, by component id its
   * quantization table (-1: not in the frame) and sampling factors (h << 4 | v), and its component ids in order.
   */
  private static final class Frame {
    final int sof;
    final int precision;
    final int width;
    final int height;
    final int components;
    final int[] quantOf = new int[256];
    final int[] samplingOf = new int[256];
    final int[] ids;
    int hMax = 1;
    int vMax = 1;
    boolean bogusSampling; // a component's sampling factor outside 1..4

    private Frame(int sof, int precision, int width, int height, int components, int entries) {
      this.sof = sof;
      this.precision = precision;
      this.width = width;
      this.height = height;
      this.components = components;
      this.ids = new int[entries];
      Arrays.fill(quantOf, -1);
    }

    /** The frame header {@code marker} whose length starts at {@code i} (the segment ends at {@code end}). */
    static Frame read(Bytes in, int marker, int i, int end) throws BadImageException {
      int len = end - i;
      if (len < 8) {
        throw new BadImageException("corrupt JPEG: a frame header of " + len + " bytes");
      }
      int count = in.u8(i + 7);
      int entries = Math.max(0, Math.min(count, (end - i - 8) / 3)); // a segment too short: the entries it holds
      Frame f = new Frame(marker, in.u8(i + 2), in.u16be(i + 5), in.u16be(i + 3), count, entries);
      if (f.width == 0 || f.height == 0) {
        throw new BadImageException("unsupported JPEG: the frame header declares " + f.width + "x" + f.height
            + " pixels (a height of 0 defers it to a DNL marker, which the decoder does not support)");
      }
      if (f.components != 1 && f.components != 3 && f.components != 4) {
        throw new BadImageException("unsupported JPEG: " + f.components + " color components (1, 3 or 4 expected)");
      }
      for (int c = 0; c < entries; c++) {
        int id = in.u8(i + 8 + 3 * c);
        int h = in.u8(i + 9 + 3 * c) >> 4;
        int v = in.u8(i + 9 + 3 * c) & 0x0F;
        f.ids[c] = id;
        f.samplingOf[id] = in.u8(i + 9 + 3 * c);
        f.quantOf[id] = in.u8(i + 10 + 3 * c);
        f.hMax = Math.max(f.hMax, h);
        f.vMax = Math.max(f.vMax, v);
        f.bogusSampling |= h < 1 || h > 4 || v < 1 || v > 4;
      }
      return f;
    }

    /**
     * Whether libjpeg-turbo 2.1 refuses the frame once it reaches the first scan, after that scan's component ids
     * (jdinput.c's initial_setup, in its order): "Maximum supported image dimension is 65500 pixels", "Unsupported
     * JPEG data precision %d" (8 bits only), "Bogus sampling factors" (each factor 1..4).
     */
    boolean libjpegRefuses() {
      return width > 65500 || height > 65500 || precision != 8 || bogusSampling;
    }

    /**
     * The MCUs of the scan whose header's data starts at {@code from} (its component count, then their ids and
     * tables): a scan of one component has one block an MCU, a scan of several the frame's interleaved MCUs.
     */
    long mcus(Bytes in, int from) {
      if (in.u8(from) > 1) {
        return ceilDiv(width, 8 * hMax) * ceilDiv(height, 8 * vMax);
      }
      int s = samplingOf[in.u8(from + 1)];
      return ceilDiv((long) width * (s >> 4), 8 * hMax) * ceilDiv((long) height * (s & 0x0F), 8 * vMax);
    }

    private static long ceilDiv(long a, long b) {
      return (a + b - 1) / b;
    }
  }

  /**
   * The quantization tables a DQT segment (its data: from..end) defines, bit t for table t; -1 when it is malformed,
   * which libjpeg reports in its words.
   */
  private static int quantTables(Bytes in, int from, int end) {
    int defined = 0;
    int at = from;
    while (at < end) {
      int index = in.u8(at);
      if ((index & 0x0F) > 3) {
        return -1;
      }
      defined |= 1 << (index & 0x0F);
      at += 1 + 64 * ((index >> 4) != 0 ? 2 : 1);
    }
    return at == end ? defined : -1;
  }

  /** The Huffman tables a DHT segment defines: bit t for DC table t, 4 + t for AC table t; -1 when malformed. */
  private static int huffmanTables(Bytes in, int from, int end) {
    int defined = 0;
    int at = from;
    while (at < end) {
      int index = in.u8(at);
      int kind = (index & 0x10) != 0 ? 1 : 0;
      index -= 0x10 * kind;
      if (index > 3 || at + 17 > end) {
        return -1;
      }
      int count = 0;
      for (int k = 1; k <= 16; k++) {
        count += in.u8(at + k);
      }
      if (count > 256 || at + 17 + count > end) {
        return -1;
      }
      defined |= 1 << (4 * kind + index);
      at += 17 + count;
    }
    return defined;
  }

  /**
   * A scan's header (from..end) as libjpeg checks it, in its order: its length and component ids (the scan marker,
   * {@link #scanComponents}), at the {@code first} scan the frame ({@link Frame#libjpegRefuses}), an interleaved
   * scan's blocks an MCU (at most 10: "Sampling factors too large for interleaved scan"), each component's
   * quantization table (the sidecar's rule, in its words), a progressive scan's parameters
   * ({@link #progression}), then the sidecar's rule on the Huffman tables (not for arithmetic coding, SOF9 and
   * SOF10): the tables the scan decodes with defined before it, a sequential scan's DC and AC tables whatever its
   * parameters (libjpeg only warns on a sequential scan's odd ones, and decodes it), a progressive scan's DC table
   * when it is a first DC scan, its AC table when it is an AC scan. A decoder that keeps its tables from one image to
   * the next (libjpeg's abbreviated streams) would otherwise decode with the last image's (the native decoder makes
   * a fresh decompressor per image; the device's decoders are not held to that), and decoders differ on a missing
   * Huffman table. But a sequential frame's (SOF0, SOF1) Huffman table 0 or 1 may be missing (a Motion-JPEG frame):
   * libjpeg-turbo fills a fresh decompressor's slots 0 and 1 still empty at the first scan with the standard tables
   * (jdhuff.c; its progressive decoder fills none), so the answer is 1 when the scan relies on them, whose standard
   * tables the sidecar inserts before the first scan ({@link StandardHuffmanTables}); 0 when the scan's tables are
   * defined. {@code scan} names the scan in the refusals. python-shim's jpeg_rules applies the same rules. -1 when
   * libjpeg refuses the scan header itself (in its words).
   */
  private static int scanTables(Bytes in, int from, int end, Frame frame, int quant, int huff, String scan,
      boolean first) throws BadImageException {
    int count = from < end ? in.u8(from) : 0;
    if (end - from != 2 * count + 4 || count < 1 || count > 4) {
      return -1; // libjpeg: Bogus marker length
    }
    if (!scanComponents(in, from, count, frame.ids) || first && frame.libjpegRefuses()) {
      return -1; // libjpeg: Invalid component ID %d in SOS; the frame's refusal
    }
    int blocks = 0; // an interleaved scan's blocks an MCU
    for (int c = 0; c < count && count > 1; c++) {
      int s = frame.samplingOf[in.u8(from + 1 + 2 * c)];
      blocks += (s >> 4) * (s & 0x0F);
    }
    if (blocks > 10) {
      return -1; // libjpeg: Sampling factors too large for interleaved scan
    }
    for (int c = 0; c < count; c++) {
      int id = in.u8(from + 1 + 2 * c);
      int q = frame.quantOf[id];
      if (q > 3 || (quant & 1 << q) == 0) {
        throw new BadImageException("corrupt JPEG: " + scan + "'s component " + id + " uses quantization table " + q
            + ", which no DQT segment before it defines");
      }
    }
    int ss = in.u8(from + 1 + 2 * count);
    int se = in.u8(from + 2 + 2 * count);
    int ah = in.u8(from + 3 + 2 * count) >> 4;
    int al = in.u8(from + 3 + 2 * count) & 0x0F;
    boolean progressive = frame.sof == 0xC2 || frame.sof == 0xCA;
    if (progressive && !progression(ss, se, ah, al, count)) {
      return -1; // libjpeg: Invalid progressive parameters Ss=%d Se=%d Ah=%d Al=%d
    }
    boolean standard = false;
    for (int c = 0; c < count && frame.sof < 0xC9; c++) { // arithmetic coding: no Huffman tables
      int id = in.u8(from + 1 + 2 * c);
      int sel = in.u8(from + 2 + 2 * c);
      if (!progressive || ss == 0 && ah == 0) {
        standard |= undefinedHuffman(scan, id, "DC", sel >> 4, huff, progressive);
      }
      if (!progressive || ss > 0) {
        standard |= undefinedHuffman(scan, id, "AC", sel & 0x0F, huff >> 4, progressive);
      }
    }
    return standard ? 1 : 0;
  }

  /**
   * Whether libjpeg-turbo 2.1 takes the component ids of the scan whose header's data starts at {@code from}
   * (jdmarker.c's get_sos; "Invalid component ID %d in SOS" when not): the scan's c-th component is the frame's
   * ({@code ids}) first one from the c-th on with its id, and no scan component repeats one before it; so a component
   * out of the frame's order is refused when the frame lists it before its place in the scan (a scan of components
   * 3 and 2 of 1, 2, 3 is taken, one of 2 and 1 is not).
   */
  private static boolean scanComponents(Bytes in, int from, int count, int[] ids) {
    int picked = 0; // bit k: the frame's k-th component
    for (int c = 0; c < count; c++) {
      int id = in.u8(from + 1 + 2 * c);
      int k = c;
      while (k < ids.length && ids[k] != id) {
        k++;
      }
      if (k == ids.length || (picked & 1 << k) != 0) {
        return false;
      }
      picked |= 1 << k;
    }
    return true;
  }

  /**
   * Whether libjpeg decodes a progressive scan of {@code count} components with these parameters (jdphuff.c's
   * start_pass_phuff_decoder, jdarith.c's start_pass): a DC scan (Ss 0) codes no AC coefficient, an AC scan one
   * component's coefficients Ss..Se of the 64, a refinement scan (Ah not 0) one bit more (Al = Ah - 1), and the point
   * transform Al is at most 13.
   */
  private static boolean progression(int ss, int se, int ah, int al, int count) {
    boolean band = ss == 0 ? se == 0 : ss <= se && se <= 63 && count == 1;
    return band && (ah == 0 || al == ah - 1) && al <= 13;
  }

  /**
   * Whether {@code scan}'s component {@code id}'s Huffman {@code kind} table {@code index} is missing from
   * {@code defined} (bit t: table t of that kind) and has a standard table; a missing table 2 or 3, or any missing
   * table of a progressive frame, has none and is refused.
   */
  private static boolean undefinedHuffman(String scan, int id, String kind, int index, int defined,
      boolean progressive) throws BadImageException {
    if (index <= 3 && (defined & 1 << index) != 0) {
      return false;
    }
    if (index > 1 || progressive) {
      throw new BadImageException("unsupported JPEG: " + scan + "'s component " + id + " uses Huffman " + kind
          + " table " + index + ", which no DHT segment before it defines (only "
          + (index > 1 ? "tables 0 and 1 have" : "a sequential frame's tables 0 and 1 have") + " standard ones)");
    }
    return true;
  }

  /**
   * Where the data of a scan (from {@code from}) ends: its first marker but a stuffed 0xFF, fill and the restart
   * markers of its {@code intervals} restart intervals (0: no restart interval declared, none), which must come after
   * some data (every scan codes at least one Huffman symbol) and be one that may follow a scan: the end-of-image
   * marker after a single scan, and after each scan of a multi-scan JPEG also a table, restart interval, DNL, APPn or
   * comment segment or the next scan ({@link #followsScan}). Returns where that marker's last 0xFF byte is.
   * libjpeg-turbo stops at any other marker, at the end of data short of its restart intervals, or at one restart
   * marker too many (it cuts an interval's data, unless the scan's data ends right after it), and fills the rest of
   * the image with gray: the native decoder refuses that only when the rows it decodes reach it (every row of a
   * multi-scan JPEG, whose scans it reads first), so the answer would depend on the crop and on whether the image is
   * kept in a cache form (every row decoded). The rule decides it from the bytes, whatever the crop, and python-shim's
   * jpeg_rules applies it (the same words) to the device's share of a batch.
   */
  private static int scanEnd(Bytes in, int from, long intervals, boolean multiScan) throws BadImageException {
    int last = in.n - 1; // a marker's first byte
    long restarts = 0;
    for (int at = in.indexOfFf(from, last); at < last; at = in.indexOfFf(at + 1, last)) {
      int next = in.u8(at + 1);
      if (next == 0x00 || next == 0xFF) {
        continue; // a stuffed 0xFF, fill
      }
      boolean rst = (next & 0xF8) == 0xD0;
      if (rst && intervals > 0) {
        if (restarts == intervals - 1 && !(in.at(at + 2, 0xFF) && at + 3 < in.n
            && endsScan(in.u8(at + 3), multiScan))) {
          throw new BadImageException("corrupt JPEG: marker 0xFF" + hex2(next) + " at byte " + at + " cuts the scan"
              + " data (its " + intervals + " restart intervals need " + (intervals - 1) + " restart markers)");
        }
        restarts++;
        continue;
      }
      if (rst || !endsScan(next, multiScan) || at == from) { // a scan has data: at least one Huffman code
        throw new BadImageException("corrupt JPEG: marker 0xFF" + hex2(next) + " at byte " + at + " cuts the scan data"
            + (rst ? " (no restart interval is declared)" : ""));
      }
      if (intervals > 0 && restarts < intervals - 1) {
        throw new BadImageException("truncated JPEG: the scan data ends after " + (restarts + 1) + " of its "
            + intervals + " restart intervals");
      }
      return at;
    }
    throw noEndMarker(in);
  }

  /** Whether marker {@code m} may end a scan's data: EOI, and between the scans of a multi-scan JPEG others too. */
  private static boolean endsScan(int m, boolean multiScan) {
    return m == 0xD9 || multiScan && followsScan(m);
  }

  /**
   * The markers libjpeg reads between scans: DHT, DAC, SOS, EOI, DQT, DNL (which it skips: the frame header declared
   * the height), DRI, APPn and COM; not SOI, SOFn or the reserved ones, which it refuses there.
   */
  private static boolean followsScan(int m) {
    return m == 0xC4 || m == 0xCC || m >= 0xD9 && m <= 0xDD || m >= 0xE0 && m <= 0xEF || m == 0xFE;
  }

  /**
   * The markers libjpeg-turbo 2.1 reads no segment of, which it refuses wherever it meets them ("Unsupported marker
   * type 0x%02x"): the reserved ones (0x02..0xBF), DHP, EXP and JPG0..JPG13 (hierarchical coding and extensions).
   */
  private static boolean unknown(int m) {
    return m >= 0x02 && m <= 0xBF || m == 0xDE || m == 0xDF || m >= 0xF0 && m <= 0xFD;
  }

  /** SOF0..SOF15 except DHT (C4), JPG (C8) and DAC (CC). */
  private static boolean isSof(int m) {
    return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
  }

  /**
   * The coding processes libjpeg-turbo 2.1 refuses at their frame header ("Unsupported JPEG process: SOF type
   * 0xc3"): lossless and differential ones. It decodes sequential and progressive frames only, Huffman (SOF0, SOF1,
   * SOF2) or arithmetic coded (SOF9, SOF10).
   */
  private static boolean unsupported(int sof) {
    return sof == 0xC3 || sof >= 0xC5 && sof <= 0xC7 || sof == 0xCB || sof >= 0xCD;
  }

  // -- PNG -----------------------------------------------------------------------------------------------

  /**
   * A PNG's header rules: 33 bytes or more, a 13-byte IHDR first, with a size and a color type PNG defines, chunks
   * that lead to the image data (IDAT), and the bytes of an IEND chunk's type after it. python-shim's png_rules
   * applies the same rules, in the same words, to the device's share of a batch (png_check), and what OpenCV's
   * libpng then refuses (png_data_check), before its host decoder sees the bytes.
   */
  private static ImageHeader png(Bytes in) throws BadImageException {
    if (in.n < 33) {
      throw new BadImageException("truncated PNG: " + in.n + " bytes, shorter than a PNG header (33)");
    }
    if (in.u32be(8) != 13 || !in.at(12, 'I', 'H', 'D', 'R')) {
      throw new BadImageException("corrupt PNG: the first chunk is not a 13-byte IHDR");
    }
    long w = in.u32be(16);
    long h = in.u32be(20);
    int colorType = in.u8(25);
    if (w == 0 || h == 0 || w > Integer.MAX_VALUE || h > Integer.MAX_VALUE) {
      throw new BadImageException("corrupt PNG: IHDR declares " + w + "x" + h + " pixels");
    }
    int components = switch (colorType) {
      case 0 -> 1;
      case 2, 3 -> 3;
      case 4 -> 2;
      case 6 -> 4;
      default -> throw new BadImageException("corrupt PNG: IHDR declares color type " + colorType);
    };
    boolean exif = false;
    long i = 33;
    while (true) { // walk the chunks up to the image data, for an eXIf chunk (the decoder may rotate)
      if (i + 8 > in.n) {
        throw new BadImageException("truncated PNG: the file ends at byte " + in.n + " before any image data (IDAT)");
      }
      long len = in.u32be((int) i);
      if (in.at((int) i + 4, 'I', 'D', 'A', 'T')) {
        break;
      }
      exif |= in.at((int) i + 4, 'e', 'X', 'I', 'f');
      i += 12 + len;
    }
    if (!in.hasFromEnd((int) i, 'I', 'E', 'N', 'D')) {
      throw new BadImageException("truncated PNG: no IEND chunk after the image data, " + in.n + " bytes in all");
    }
    return new ImageHeader(Format.PNG, (int) w, (int) h, components, exif, false);
  }

  // -- WebP ----------------------------------------------------------------------------------------------

  private static ImageHeader webp(Bytes in) throws BadImageException {
    long riff = in.u32le(4) + 8;
    if (riff > in.n) {
      throw new BadImageException("truncated WebP: the RIFF header declares " + riff + " bytes, the file has " + in.n);
    }
    if (in.n < 30) {
      throw new BadImageException("truncated WebP: " + in.n + " bytes, shorter than a WebP header (30)");
    }
    int d = 20; // the first chunk's data
    int w;
    int h;
    boolean exif = false;
    if (in.at(12, 'V', 'P', '8', ' ')) {
      if (!in.at(d + 3, 0x9D, 0x01, 0x2A)) {
        throw new BadImageException("corrupt WebP: no VP8 start code");
      }
      w = in.u16le(d + 6) & 0x3FFF;
      h = in.u16le(d + 8) & 0x3FFF;
    } else if (in.at(12, 'V', 'P', '8', 'L')) {
      if (in.u8(d) != 0x2F) {
        throw new BadImageException("corrupt WebP: no VP8L signature");
      }
      long bits = in.u32le(d + 1);
      w = (int) (bits & 0x3FFF) + 1;
      h = (int) ((bits >>> 14) & 0x3FFF) + 1;
    } else if (in.at(12, 'V', 'P', '8', 'X')) {
      exif = (in.u8(d) & 0x08) != 0;
      w = in.u24le(d + 4) + 1;
      h = in.u24le(d + 7) + 1;
    } else {
      throw new BadImageException("corrupt WebP: the first chunk is " + in.hex4(12) + ", not VP8, VP8L or VP8X");
    }
    if (w == 0 || h == 0) {
      throw new BadImageException("corrupt WebP: the header declares " + w + "x" + h + " pixels");
    }
    return new ImageHeader(Format.WEBP, w, h, 4, exif, false);
  }

  private static String hex2(int v) {
    return String.format("%02X", v);
  }

  /** Absolute reads relative to the buffer's position. */
  private static final class Bytes {
    /** Eight bytes of a buffer in one read, whatever its byte order (the scan only asks whether one is 0xFF). */
    static final VarHandle LONGS = MethodHandles.byteBufferViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
    final ByteBuffer b;
    final int base;
    final int n;

    Bytes(ByteBuffer b) {
      this.b = b;
      this.base = b.position();
      this.n = b.remaining();
    }

    int u8(int i) {
      return b.get(base + i) & 0xFF;
    }

    int u16be(int i) {
      return u8(i) << 8 | u8(i + 1);
    }

    int u16le(int i) {
      return u8(i) | u8(i + 1) << 8;
    }

    int u24le(int i) {
      return u8(i) | u8(i + 1) << 8 | u8(i + 2) << 16;
    }

    long u32be(int i) {
      return (long) u16be(i) << 16 | u16be(i + 2);
    }

    long u32le(int i) {
      return (long) u16le(i + 2) << 16 | u16le(i);
    }

    boolean startsWith(int... magic) {
      return at(0, magic);
    }

    boolean at(int i, int... bytes) {
      if (i < 0 || i + bytes.length > n) {
        return false;
      }
      for (int k = 0; k < bytes.length; k++) {
        if (u8(i + k) != bytes[k]) {
          return false;
        }
      }
      return true;
    }

    /** The first 0xFF byte at or after {@code from} and before {@code to}; {@code to} when none. */
    int indexOfFf(int from, int to) {
      int i = from;
      for (; i + 32 <= to; i += 32) { // four words a step until one holds an 0xFF byte, then the first such byte
        long z0 = ffBytes(i);
        long z1 = ffBytes(i + 8);
        long z2 = ffBytes(i + 16);
        long z3 = ffBytes(i + 24);
        if ((z0 | z1 | z2 | z3) != 0) {
          return z0 != 0 ? i + first(z0) : z1 != 0 ? i + 8 + first(z1) : z2 != 0 ? i + 16 + first(z2)
              : i + 24 + first(z3);
        }
      }
      for (; i + 8 <= to; i += 8) {
        long z = ffBytes(i);
        if (z != 0) {
          return i + first(z);
        }
      }
      for (; i < to; i++) {
        if (u8(i) == 0xFF) {
          return i;
        }
      }
      return to;
    }

    /**
     * The eight bytes at {@code i} (the first the lowest, little-endian) with the high bit of each 0xFF byte set: the
     * lowest set bit marks the first 0xFF byte exactly (a borrow can mark a byte only above a true one).
     */
    private long ffBytes(int i) {
      long t = ~(long) LONGS.get(b, base + i); // an 0xFF byte is now 0x00
      return (t - 0x0101010101010101L) & ~t & 0x8080808080808080L;
    }

    /** The index in its word of the byte {@link #ffBytes} marks first. */
    private static int first(long marks) {
      return Long.numberOfTrailingZeros(marks) >>> 3;
    }

    /** Whether {@code bytes} occur at or after {@code from}, searching from the end (where they usually are). */
    boolean hasFromEnd(int from, int... bytes) {
      for (int i = n - bytes.length; i >= from; i--) {
        if (at(i, bytes)) {
          return true;
        }
      }
      return false;
    }

    String hex(int max) {
      StringBuilder s = new StringBuilder();
      for (int i = 0; i < Math.min(max, n); i++) {
        s.append(i == 0 ? "" : " ").append(String.format("%02x", u8(i)));
      }
      return s.toString();
    }

    String hex4(int i) {
      StringBuilder s = new StringBuilder("'");
      for (int k = i; k < Math.min(i + 4, n); k++) {
        int c = u8(k);
        s.append(c >= 0x20 && c < 0x7F ? (char) c : '?');
      }
      return s.append('\'').toString();
    }
  }
}
