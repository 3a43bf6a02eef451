package io.unstall.flight.protocol;

/**
 * A hybrid member's measured rates, for its group's split (docs/PREP.md, "Decoding on the GPU"): its device's
 * decode seconds per sample it decodes and its training step in seconds. Sent with {@code prep.next} ({@code
 * "rates"}) or in a PREP ticket's optional tail; both carriers check them with {@link #isSeconds} and word a
 * defect with {@link #required}.
 */
public record PrepRates(double decodePerSample, double step) {
  public static final String DECODE = "decode_s_per_sample";
  public static final String STEP = "step_s";

  public PrepRates {
    if (!isSeconds(decodePerSample)) {
      throw new IllegalArgumentException("rates." + required(DECODE, decodePerSample));
    }
    if (!isSeconds(step)) {
      throw new IllegalArgumentException("rates." + required(STEP, step));
    }
  }

  /** A rate the split can use: finite and positive seconds. */
  public static boolean isSeconds(double v) {
    return Double.isFinite(v) && v > 0;
  }

  /** What a defective {@code field} is told: {@code "<field> (seconds, a positive number) is required, got <v>"}. */
  public static String required(String field, Object got) {
    return field + " (seconds, a positive number) is required, got " + got;
  }
}
