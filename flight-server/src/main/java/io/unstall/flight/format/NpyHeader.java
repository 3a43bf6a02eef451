package io.unstall.flight.format;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The header of a {@code .npy} file (numpy's format, versions 1 to 3): magic {@code \x93NUMPY}, version, header
 * length, then a Python dict literal {@code {'descr': '<f4', 'fortran_order': False, 'shape': (60000, 28, 28), }}.
 * Parsed strictly, for arrays whose rows are contiguous byte ranges: a plain dtype (bool, integers, floats,
 * complex, fixed-length bytes and unicode; not objects or structured records), C order (or one dimension), at
 * least one dimension. Anything else is an {@link IllegalArgumentException} saying what.
 */
record NpyHeader(String descr, int itemSize, List<Long> shape, int dataOffset) {
  private static final byte[] MAGIC = {(byte) 0x93, 'N', 'U', 'M', 'P', 'Y'};
  /** Bytes of the fixed part before the dict for version 1 (u16 length) and 2-3 (u32 length). */
  static final int PREFIX_V1 = 10;
  static final int PREFIX_V2 = 12;
  /** numpy refuses headers past this size unless told otherwise (max_header_size). */
  static final int MAX_HEADER = 10_000;
  private static final Pattern DICT = Pattern.compile(
      "\\{\\s*(?:'descr'\\s*:\\s*'([^']*)'|'fortran_order'\\s*:\\s*(True|False)|'shape'\\s*:\\s*\\(([^)]*)\\))"
          + "\\s*,\\s*(?:'descr'\\s*:\\s*'([^']*)'|'fortran_order'\\s*:\\s*(True|False)|'shape'\\s*:\\s*\\(([^)]*)\\))"
          + "\\s*,\\s*(?:'descr'\\s*:\\s*'([^']*)'|'fortran_order'\\s*:\\s*(True|False)|'shape'\\s*:\\s*\\(([^)]*)\\))"
          + "\\s*,?\\s*\\}\\s*");
  /** A plain dtype: byte order, kind, item size (numpy's array-protocol type strings). */
  private static final Pattern DESCR = Pattern.compile("([<>|=])([biufcSUV])(\\d{1,9})");

  /** How many bytes {@link #parse} needs to see, given the first {@link #PREFIX_V1} bytes of a file. */
  static int length(byte[] first) {
    if (first.length < PREFIX_V1) {
      throw new IllegalArgumentException("not a .npy file: " + first.length + " bytes, shorter than its header");
    }
    for (int i = 0; i < MAGIC.length; i++) {
      if (first[i] != MAGIC[i]) {
        throw new IllegalArgumentException("not a .npy file (no \\x93NUMPY magic)");
      }
    }
    ByteBuffer b = ByteBuffer.wrap(first).order(ByteOrder.LITTLE_ENDIAN);
    int major = first[6];
    long len;
    int prefix;
    if (major == 1) {
      len = b.getShort(8) & 0xffff;
      prefix = PREFIX_V1;
    } else if (major == 2 || major == 3) {
      if (first.length < PREFIX_V2) {
        return PREFIX_V2;
      }
      len = b.getInt(8) & 0xffffffffL;
      prefix = PREFIX_V2;
    } else {
      throw new IllegalArgumentException("unsupported .npy format version " + major + "." + first[7]);
    }
    if (len > MAX_HEADER) {
      throw new IllegalArgumentException(".npy header of " + len + " bytes (numpy reads at most " + MAX_HEADER + ")");
    }
    return prefix + (int) len;
  }

  /** Parses a whole header ({@link #length} bytes). */
  static NpyHeader parse(byte[] bytes) {
    int total = length(bytes);
    if (bytes.length < total) {
      throw new IllegalArgumentException("not a .npy file: " + bytes.length + " bytes, shorter than its header");
    }
    int prefix = bytes[6] == 1 ? PREFIX_V1 : PREFIX_V2;
    String dict = new String(bytes, prefix, total - prefix,
        bytes[6] == 3 ? StandardCharsets.UTF_8 : StandardCharsets.ISO_8859_1);
    Matcher m = DICT.matcher(dict);
    if (!m.matches()) {
      throw new IllegalArgumentException(".npy header is not a dict of descr, fortran_order and shape (or the dtype"
          + " is structured, which unstall does not read): " + abbreviate(dict));
    }
    String descr = null;
    String fortran = null;
    String shapeText = null;
    for (int k = 0; k < 3; k++) {
      if (m.group(1 + 3 * k) != null) {
        descr = once(descr, m.group(1 + 3 * k), "descr");
      } else if (m.group(2 + 3 * k) != null) {
        fortran = once(fortran, m.group(2 + 3 * k), "fortran_order");
      } else {
        shapeText = once(shapeText, m.group(3 + 3 * k), "shape");
      }
    }
    Matcher d = DESCR.matcher(descr);
    if (!d.matches()) {
      throw new IllegalArgumentException("dtype '" + descr + "' is not a plain numeric, bytes or unicode dtype"
          + " (objects and structured records are not read)");
    }
    long item = Long.parseLong(d.group(3));
    if (d.group(2).equals("U")) {
      item *= 4;
    }
    if (item <= 0 || item > Integer.MAX_VALUE) {
      throw new IllegalArgumentException("dtype '" + descr + "' has an item size of " + item + " bytes");
    }
    List<Long> shape = new ArrayList<>();
    String inner = shapeText.strip();
    if (!inner.isEmpty()) {
      String[] parts = inner.split(",", -1);
      for (int i = 0; i < parts.length; i++) {
        String p = parts[i].strip();
        if (p.isEmpty() && i == parts.length - 1 && i > 0) {
          break; // "(5,)"
        }
        if (p.endsWith("L")) {
          p = p.substring(0, p.length() - 1); // Python 2's long literals
        }
        if (!p.matches("\\d{1,18}")) {
          throw new IllegalArgumentException(".npy shape (" + shapeText + ") is not a tuple of sizes");
        }
        shape.add(Long.parseLong(p));
      }
    }
    if (shape.isEmpty()) {
      throw new IllegalArgumentException("a 0-d array (shape ()) has no first axis to read rows along");
    }
    if (fortran.equals("True") && shape.size() > 1) {
      throw new IllegalArgumentException("the array is in Fortran order, so its rows are not contiguous; save it"
          + " with numpy.ascontiguousarray");
    }
    return new NpyHeader(descr, (int) item, List.copyOf(shape), total);
  }

  long rows() {
    return shape.get(0);
  }

  /** Bytes of one row (an item times the sizes of the other axes); an error past 2 GiB. */
  long rowBytes() {
    long n = itemSize;
    for (int i = 1; i < shape.size(); i++) {
      if (shape.get(i) != 0 && n > (Integer.MAX_VALUE - 8) / shape.get(i)) {
        throw new IllegalArgumentException("a row of shape " + shape.subList(1, shape.size()) + " has over 2 GiB");
      }
      n *= shape.get(i);
    }
    return n;
  }

  /** The data's size in bytes: rows times row bytes; an error past what a file can hold. */
  long dataBytes() {
    long row = rowBytes();
    if (row != 0 && rows() > Long.MAX_VALUE / row) {
      throw new IllegalArgumentException("shape " + shape + " of " + itemSize + "-byte items is more bytes than a"
          + " file can hold");
    }
    return rows() * row;
  }

  private static String once(String seen, String value, String key) {
    if (seen != null) {
      throw new IllegalArgumentException(".npy header names '" + key + "' twice");
    }
    return value;
  }

  private static String abbreviate(String s) {
    return s.length() > 200 ? s.substring(0, 200) + "..." : s.strip();
  }
}
