package io.unstall.sidecar;

import java.util.Locale;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/** Byte sizes as users write them: {@code 1048576}, {@code 512MiB}, {@code 2G}, {@code 100MB}. */
public final class Sizes {
  private static final Pattern SIZE = Pattern.compile("\\s*(\\d+(?:\\.\\d+)?)\\s*([kmgt]?i?b?)\\s*");

  private Sizes() {}

  /**
   * Parses a size. {@code K/M/G/T} and {@code KiB/MiB/GiB/TiB} are powers of 1024; {@code KB/MB/GB/TB} are
   * powers of 1000; a bare number is bytes.
   */
  public static long parse(String text) {
    Matcher m = SIZE.matcher(text == null ? "" : text.toLowerCase(Locale.ROOT));
    if (!m.matches()) {
      throw new IllegalArgumentException(
          "'" + text + "' is not a size (examples: 1073741824, 512MiB, 2GiB, 100MB)");
    }
    String unit = m.group(2);
    int power = unit.isEmpty() || unit.equals("b") ? 0 : "kmgt".indexOf(unit.charAt(0)) + 1;
    boolean decimal = unit.length() == 2 && unit.endsWith("b");
    double value = Double.parseDouble(m.group(1)) * Math.pow(decimal ? 1000 : 1024, power);
    if (value >= Long.MAX_VALUE) {
      throw new IllegalArgumentException("'" + text + "' is too large");
    }
    return (long) value;
  }

  /** A size for people: {@code 1.5 GiB}. */
  public static String format(long bytes) {
    String[] units = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = bytes;
    int u = 0;
    while (v >= 1024 && u < units.length - 1) {
      v /= 1024;
      u++;
    }
    return u == 0 ? bytes + " B" : String.format(Locale.ROOT, "%.1f %s", v, units[u]);
  }
}
