package io.unstall.flight.prep;

/**
 * A hybrid batch's split between the sidecar's CPUs and the members' device, from measured rates: {@code b} samples
 * a batch, {@code a} the sidecar's seconds per sample it prepares (the time in which any of its producer threads was
 * preparing a batch, over the samples they prepared: exact while they are kept busy, and no less than the truth when
 * they idle, since a batch alone may leave decode threads free), {@code d} the device's decode seconds per sample
 * (the slowest member's) and {@code s} the training step (the fastest member's, which must be fed). With {@code c}
 * samples on the CPU, the device's share must stay hidden under the step, {@code (b - c) d <= HEADROOM s}, and the
 * CPU must keep up, {@code c a <= s}. When both hold for some {@code c} it picks the most the CPU sustains
 * ({@link #MARGIN} of the step), which frees the device for training; when none does (input-bound) it picks
 * {@code c = b d / (a + d)}, where both take as long and the slower of them is fastest.
 */
final class SplitModel {
  /** The share of a step the device's decode may take: it runs beside the training step on the same device. */
  static final double HEADROOM = 0.8;
  /** The share of a step the sidecar's producers may take per batch, so that a noisy step does not starve them. */
  static final double MARGIN = 0.9;

  /** The target {@code cpuRows} and why, for the decision log. */
  record Split(int cpuRows, String why) {}

  private SplitModel() {}

  /** The split for a batch of {@code b}; every rate must be positive (measured). */
  static Split target(int b, double a, double d, double s) {
    if (b < 1 || !(a > 0) || !(d > 0) || !(s > 0)) {
      throw new IllegalArgumentException("split model: batch size " + b + " and rates a=" + a + ", d=" + d + ", s="
          + s + " must be positive");
    }
    int cpuCan = (int) Math.min(b, Math.floor(s * MARGIN / a));
    int cpuMust = (int) Math.max(0, Math.ceil(b - HEADROOM * s / d));
    if (cpuCan >= b) {
      return new Split(b, "the sidecar keeps up with whole batches");
    }
    if (cpuCan >= cpuMust) {
      return new Split(cpuCan, "the sidecar keeps up with " + cpuCan + " samples a step; the device hides the other "
          + (b - cpuCan) + " under it");
    }
    int c = (int) Math.max(0, Math.min(b, Math.round(b * d / (a + d))));
    return new Split(c, String.format("input-bound (the sidecar sustains %d samples a step, the device hides %d):"
        + " balanced at %.1f ms a batch each", cpuCan, b - cpuMust, 1e3 * Math.max(c * a, (b - c) * d)));
  }
}
