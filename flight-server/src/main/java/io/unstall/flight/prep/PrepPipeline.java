package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import io.unstall.flight.prep.ImageHeader.Format;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.HexFormat;
import java.util.Iterator;
import java.util.List;
import java.util.Locale;
import java.util.Set;
import java.util.stream.Collectors;

/**
 * A declarative image pipeline (protocol/README.md, "Prep pipelines"): decode, then spatial ops, then the
 * output tensor's normalization, layout and dtype. Parsing checks everything up front and every error names
 * the op and field. The fingerprint is a hash of the canonical form, so equal pipelines written differently
 * (key order, defaults spelled out or not) share a group.
 */
public final class PrepPipeline {
  private static final ObjectMapper JSON = new ObjectMapper();

  /** One op, already validated. */
  public sealed interface Op permits Decode, RandomResizedCrop, Resize, CenterCrop, HFlip, Normalize {}

  /**
   * Decode (always the first op): only the named {@code formats} (by magic bytes), at most {@code maxPixels}
   * pixels and an aspect ratio of {@code maxAspectRatio}, both read from the header before decoding; a sample
   * that breaks a rule or does not decode fails its batch ({@code RAISE}) or is left out of it ({@code SKIP}).
   */
  public record Decode(Set<Format> formats, long maxPixels, double maxAspectRatio, OnError onError) implements Op {
    public Decode {
      formats = Set.copyOf(formats);
    }

    /** The accepted formats, in a fixed order, as the pipeline names them. */
    public String formatNames() {
      return formats.stream().sorted().map(Format::wire).collect(Collectors.joining(", "));
    }
  }

  /** What a sample that cannot be decoded does to its batch. */
  public enum OnError {
    RAISE, SKIP;

    public String wire() {
      return name().toLowerCase(Locale.ROOT);
    }
  }

  /**
   * The sidecar's defaults for a decode op that does not name its caps ({@code --max-decode-pixels},
   * {@code --max-decode-aspect-ratio}). {@link #DEFAULT}: PIL's {@code Image.MAX_IMAGE_PIXELS} (89,478,485
   * pixels, a 0.25 GiB RGBA image) and an aspect ratio of 100.
   */
  public record DecodeLimits(long maxPixels, double maxAspectRatio) {
    public static final DecodeLimits DEFAULT = new DecodeLimits(89_478_485L, 100);
    /** OpenCV refuses larger images itself (CV_IO_MAX_IMAGE_PIXELS). */
    public static final long MAX_PIXELS = 1L << 30;

    public DecodeLimits {
      if (maxPixels < 1 || maxPixels > MAX_PIXELS) {
        throw new IllegalArgumentException("max-decode-pixels must be in 1.." + MAX_PIXELS + ", got " + maxPixels);
      }
      if (!(maxAspectRatio >= 1)) {
        throw new IllegalArgumentException("max-decode-aspect-ratio must be >= 1, got " + maxAspectRatio);
      }
    }

    /** Writes {@code max_pixels} and {@code max_aspect_ratio} ({@code prep.stats}' decode, {@code prep.join}). */
    void putTo(ObjectNode o) {
      o.put("max_pixels", maxPixels);
      o.put("max_aspect_ratio", maxAspectRatio);
    }
  }

  /** An output tensor is one Arrow FixedSizeBinary value, whose width is an int. */
  static final long MAX_SAMPLE_BYTES = Integer.MAX_VALUE;

  /** torchvision's RandomResizedCrop: area fraction in scale, aspect ratio in ratio (log-uniform). */
  public record RandomResizedCrop(int height, int width, double scaleMin, double scaleMax, double ratioMin,
      double ratioMax) implements Op {}

  /** Resize: with one size the shorter side becomes it (aspect kept); with two, exactly height x width. */
  public record Resize(int height, int width, int shorter) implements Op {}

  public record CenterCrop(int height, int width) implements Op {}

  public record HFlip(double p) implements Op {}

  /** (x / 255 - mean) / std per RGB channel; applies to float outputs (float32, float16, bfloat16). */
  public record Normalize(double[] mean, double[] std) implements Op {}

  public enum Layout { NCHW, NHWC }

  public enum DType {
    UINT8(1), FLOAT32(4), FLOAT16(2), BFLOAT16(2);

    public final int bytes;

    DType(int bytes) {
      this.bytes = bytes;
    }

    public String wire() {
      return name().toLowerCase();
    }
  }

  private final List<Op> ops;
  private final Layout layout;
  private final DType dtype;
  private final int height;
  private final int width;
  private final ObjectNode canonical;
  private final String fingerprint;

  private PrepPipeline(List<Op> ops, Layout layout, DType dtype, int height, int width, ObjectNode canonical) {
    this.ops = List.copyOf(ops);
    this.layout = layout;
    this.dtype = dtype;
    this.height = height;
    this.width = width;
    this.canonical = canonical;
    this.fingerprint = sha256(canonical.toString());
  }

  public List<Op> ops() {
    return ops;
  }

  public Layout layout() {
    return layout;
  }

  public DType dtype() {
    return dtype;
  }

  public int height() {
    return height;
  }

  public int width() {
    return width;
  }

  public static final int CHANNELS = 3;

  /** The per-sample tensor shape in the output layout. */
  public int[] sampleShape() {
    return layout == Layout.NCHW ? new int[] {CHANNELS, height, width} : new int[] {height, width, CHANNELS};
  }

  /** Bytes of one output tensor (at most {@link #MAX_SAMPLE_BYTES}, checked by parse). */
  public long sampleBytes() {
    return (long) CHANNELS * height * width * dtype.bytes;
  }

  /** The decode op (always the first). */
  public Decode decode() {
    return (Decode) ops.get(0);
  }

  public String fingerprint() {
    return fingerprint;
  }

  public ObjectNode canonical() {
    return canonical.deepCopy();
  }

  public static PrepPipeline parse(String json) {
    return parse(json, DecodeLimits.DEFAULT);
  }

  public static PrepPipeline parse(String json, DecodeLimits limits) {
    JsonNode root;
    try {
      root = JSON.readTree(json);
    } catch (Exception e) {
      throw new IllegalArgumentException("prep pipeline: not valid JSON (" + e.getMessage() + ")");
    }
    return parse(root, limits);
  }

  public static PrepPipeline parse(JsonNode root) {
    return parse(root, DecodeLimits.DEFAULT);
  }

  /**
   * Validates a pipeline document; every problem is an IllegalArgumentException naming the op and field. A decode
   * op without caps gets {@code limits}, the sidecar's defaults (they are part of the fingerprint).
   */
  public static PrepPipeline parse(JsonNode root, DecodeLimits limits) {
    if (root == null || !root.isObject()) {
      throw new IllegalArgumentException("prep pipeline: expected a JSON object with \"ops\", got " + root);
    }
    checkKeys(root, "prep pipeline", Set.of("ops", "layout", "dtype"));
    JsonNode opsNode = root.get("ops");
    if (opsNode == null || !opsNode.isArray() || opsNode.isEmpty()) {
      throw new IllegalArgumentException(
          "prep pipeline: \"ops\" must be a non-empty array starting with {\"op\":\"decode\"}");
    }
    Layout layout = parseEnum(Layout.class, text(root, "layout", "NCHW"), "prep pipeline: \"layout\"");
    DType dtype = parseEnum(DType.class, text(root, "dtype", "float32"), "prep pipeline: \"dtype\"");
    List<Op> ops = new ArrayList<>();
    ArrayNode canonOps = JsonNodeFactory.instance.arrayNode();
    int h = -1;
    int w = -1;
    boolean normalized = false;
    for (int i = 0; i < opsNode.size(); i++) {
      JsonNode o = opsNode.get(i);
      String name = o.isObject() && o.has("op") ? o.get("op").asText() : null;
      String where = "prep op #" + i + (name == null ? "" : " '" + name + "'");
      if (name == null) {
        throw new IllegalArgumentException(where + ": each op is an object with an \"op\" name, got " + o);
      }
      if (i == 0 && !name.equals("decode")) {
        throw new IllegalArgumentException(where + ": the first op must be 'decode' (image bytes to RGB)");
      }
      if (normalized) {
        throw new IllegalArgumentException(where + ": 'normalize' must be the last op");
      }
      ObjectNode c = canonOps.addObject();
      c.put("op", name);
      switch (name) {
        case "decode" -> {
          checkKeys(o, where, Set.of("op", "formats", "max_pixels", "max_aspect_ratio", "on_error"));
          if (i != 0) {
            throw new IllegalArgumentException(where + ": 'decode' may only be the first op");
          }
          Decode d = decodeOp(o, where, limits);
          ops.add(d);
          ArrayNode f = c.putArray("formats");
          d.formats().stream().sorted().forEach(x -> f.add(x.wire()));
          c.put("max_pixels", d.maxPixels());
          c.put("max_aspect_ratio", d.maxAspectRatio());
          c.put("on_error", d.onError().wire());
        }
        case "random_resized_crop" -> {
          checkKeys(o, where, Set.of("op", "size", "scale", "ratio"));
          int[] size = size(o, where, true);
          double[] scale = pair(o, "scale", where, 0.08, 1.0);
          double[] ratio = pair(o, "ratio", where, 3.0 / 4.0, 4.0 / 3.0);
          if (!(scale[0] > 0 && scale[0] <= scale[1] && scale[1] <= 1)) {
            throw new IllegalArgumentException(where + ": \"scale\" must satisfy 0 < min <= max <= 1, got "
                + scale[0] + ", " + scale[1]);
          }
          if (!(ratio[0] > 0 && ratio[0] <= ratio[1])) {
            throw new IllegalArgumentException(where + ": \"ratio\" must satisfy 0 < min <= max, got "
                + ratio[0] + ", " + ratio[1]);
          }
          ops.add(new RandomResizedCrop(size[0], size[1], scale[0], scale[1], ratio[0], ratio[1]));
          h = size[0];
          w = size[1];
          c.putArray("size").add(h).add(w);
          c.putArray("scale").add(scale[0]).add(scale[1]);
          c.putArray("ratio").add(ratio[0]).add(ratio[1]);
        }
        case "resize" -> {
          checkKeys(o, where, Set.of("op", "size"));
          int[] size = size(o, where, false);
          if (size.length == 1) {
            ops.add(new Resize(-1, -1, size[0]));
            h = -1; // depends on the image's aspect
            w = -1;
            c.putArray("size").add(size[0]);
          } else {
            ops.add(new Resize(size[0], size[1], -1));
            h = size[0];
            w = size[1];
            c.putArray("size").add(h).add(w);
          }
        }
        case "center_crop" -> {
          checkKeys(o, where, Set.of("op", "size"));
          int[] size = size(o, where, true);
          ops.add(new CenterCrop(size[0], size[1]));
          h = size[0];
          w = size[1];
          c.putArray("size").add(h).add(w);
        }
        case "hflip" -> {
          checkKeys(o, where, Set.of("op", "p"));
          double p = o.has("p") ? number(o.get("p"), where + ": \"p\"") : 0.5;
          if (!(p >= 0 && p <= 1)) {
            throw new IllegalArgumentException(where + ": \"p\" must be in [0, 1], got " + p);
          }
          ops.add(new HFlip(p));
          c.put("p", p);
        }
        case "normalize" -> {
          checkKeys(o, where, Set.of("op", "mean", "std"));
          double[] mean = triple(o, "mean", where);
          double[] std = triple(o, "std", where);
          for (double s : std) {
            if (!(s > 0)) {
              throw new IllegalArgumentException(where + ": \"std\" values must be > 0, got " + s);
            }
          }
          if (dtype == DType.UINT8) {
            throw new IllegalArgumentException(where + ": 'normalize' needs a float \"dtype\" (float32, float16 or"
                + " bfloat16), not " + dtype.wire());
          }
          ops.add(new Normalize(mean, std));
          normalized = true;
          ArrayNode m = c.putArray("mean");
          ArrayNode s = c.putArray("std");
          for (int k = 0; k < 3; k++) {
            m.add(mean[k]);
            s.add(std[k]);
          }
        }
        default -> throw new IllegalArgumentException(
            where + ": unknown op; supported: decode, random_resized_crop, resize, center_crop, hflip, normalize");
      }
    }
    if (h <= 0 || w <= 0) {
      throw new IllegalArgumentException(
          "prep pipeline: the output size is not fixed; end the spatial ops with random_resized_crop, center_crop"
              + " or resize to [height, width] so that every sample has the same shape");
    }
    long sampleBytes = (long) CHANNELS * h * w * dtype.bytes;
    if (sampleBytes > MAX_SAMPLE_BYTES) {
      throw new IllegalArgumentException("prep pipeline: an output of " + h + "x" + w + "x" + CHANNELS + " "
          + dtype.wire() + " is " + sampleBytes + " bytes per sample, above the " + MAX_SAMPLE_BYTES
          + " bytes a prepared sample may hold");
    }
    ObjectNode canonical = JsonNodeFactory.instance.objectNode();
    canonical.set("ops", canonOps);
    canonical.put("layout", layout.name());
    canonical.put("dtype", dtype.wire());
    return new PrepPipeline(ops, layout, dtype, h, w, canonical);
  }

  private static Decode decodeOp(JsonNode o, String where, DecodeLimits limits) {
    Set<Format> formats = EnumSet.noneOf(Format.class);
    JsonNode f = o.get("formats");
    if (f == null) {
      formats.add(Format.JPEG);
      formats.add(Format.PNG);
    } else {
      if (!f.isArray() || f.isEmpty()) {
        throw new IllegalArgumentException(where + ": \"formats\" must be a non-empty list of format names, got " + f);
      }
      for (JsonNode n : f) {
        Format x = n.isTextual() ? Format.of(n.asText()) : null;
        if (x == null) {
          throw new IllegalArgumentException(where + ": \"formats\" may name jpeg, png and webp (the formats whose"
              + " header the sidecar reads to check the caps before decoding), got " + n);
        }
        formats.add(x);
      }
    }
    long maxPixels = limits.maxPixels();
    JsonNode mp = o.get("max_pixels");
    if (mp != null) {
      if (!mp.isIntegralNumber() || mp.asLong() < 1 || mp.asLong() > DecodeLimits.MAX_PIXELS) {
        throw new IllegalArgumentException(where + ": \"max_pixels\" must be an integer in 1.."
            + DecodeLimits.MAX_PIXELS + " (OpenCV's own limit), got " + mp);
      }
      maxPixels = mp.asLong();
    }
    double maxAspect = limits.maxAspectRatio();
    JsonNode ma = o.get("max_aspect_ratio");
    if (ma != null) {
      maxAspect = number(ma, where + ": \"max_aspect_ratio\"");
      if (!(maxAspect >= 1) || Double.isInfinite(maxAspect)) {
        throw new IllegalArgumentException(where + ": \"max_aspect_ratio\" (longer side / shorter side) must be a"
            + " number >= 1, got " + ma);
      }
    }
    OnError onError = parseEnum(OnError.class, text(o, "on_error", "raise"), where + ": \"on_error\"");
    return new Decode(formats, maxPixels, maxAspect, onError);
  }

  private static void checkKeys(JsonNode o, String where, Set<String> allowed) {
    for (Iterator<String> it = o.fieldNames(); it.hasNext(); ) {
      String k = it.next();
      if (!allowed.contains(k)) {
        throw new IllegalArgumentException(where + ": unknown field \"" + k + "\"; allowed: " + allowed);
      }
    }
  }

  private static String text(JsonNode o, String key, String dflt) {
    JsonNode v = o.get(key);
    return v == null ? dflt : v.asText();
  }

  private static <E extends Enum<E>> E parseEnum(Class<E> type, String value, String where) {
    for (E e : type.getEnumConstants()) {
      if (e.name().equalsIgnoreCase(value)) {
        return e;
      }
    }
    List<String> names = new ArrayList<>();
    for (E e : type.getEnumConstants()) {
      names.add(type == DType.class ? ((DType) e).wire() : type == OnError.class ? ((OnError) e).wire() : e.name());
    }
    throw new IllegalArgumentException(where + " must be one of " + names + ", got '" + value + "'");
  }

  private static double number(JsonNode v, String where) {
    if (v == null || !v.isNumber()) {
      throw new IllegalArgumentException(where + " must be a number, got " + v);
    }
    return v.asDouble();
  }

  private static int positive(JsonNode v, String where) {
    if (v == null || !v.isIntegralNumber() || v.asLong() < 1 || v.asLong() > 16384) {
      throw new IllegalArgumentException(where + " must be an integer in 1..16384, got " + v);
    }
    return v.asInt();
  }

  /** "size": n or [h, w]; {@code square} turns n into [n, n]. */
  private static int[] size(JsonNode o, String where, boolean square) {
    JsonNode s = o.get("size");
    if (s == null) {
      throw new IllegalArgumentException(where + ": \"size\" is required (an integer or [height, width])");
    }
    if (s.isArray()) {
      if (s.size() != 2) {
        throw new IllegalArgumentException(where + ": \"size\" as a list is [height, width], got " + s);
      }
      return new int[] {positive(s.get(0), where + ": \"size\"[0]"), positive(s.get(1), where + ": \"size\"[1]")};
    }
    int n = positive(s, where + ": \"size\"");
    return square ? new int[] {n, n} : new int[] {n};
  }

  private static double[] pair(JsonNode o, String key, String where, double a, double b) {
    JsonNode v = o.get(key);
    if (v == null) {
      return new double[] {a, b};
    }
    if (!v.isArray() || v.size() != 2) {
      throw new IllegalArgumentException(where + ": \"" + key + "\" must be [min, max], got " + v);
    }
    return new double[] {
      number(v.get(0), where + ": \"" + key + "\"[0]"), number(v.get(1), where + ": \"" + key + "\"[1]")
    };
  }

  private static double[] triple(JsonNode o, String key, String where) {
    JsonNode v = o.get(key);
    if (v == null || !v.isArray() || v.size() != 3) {
      throw new IllegalArgumentException(where + ": \"" + key + "\" must be 3 numbers (R, G, B), got " + v);
    }
    return new double[] {
      number(v.get(0), where + ": \"" + key + "\"[0]"),
      number(v.get(1), where + ": \"" + key + "\"[1]"),
      number(v.get(2), where + ": \"" + key + "\"[2]")
    };
  }

  static String sha256(String s) {
    try {
      byte[] d = MessageDigest.getInstance("SHA-256").digest(s.getBytes(StandardCharsets.UTF_8));
      return HexFormat.of().formatHex(d);
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }
}
