package io.unstall.flight.prep;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Random;
import org.junit.jupiter.api.Test;

/** The split's target from the rates: b samples a batch, a and d seconds per sample, s the step. */
class SplitModelTest {
  static final int B = 64;

  @Test
  void theSidecarTakesWholeBatchesWhenItKeepsUp() {
    SplitModel.Split s = SplitModel.target(B, 0.001, 0.0005, 0.1); // 64 ms of a 100 ms step
    assertEquals(B, s.cpuRows());
    assertTrue(s.why().contains("whole batches"), s.why());
  }

  @Test
  void theDeviceTakesWhatTheSidecarCannot() {
    // the sidecar sustains floor(0.9 * 100 / 2.5) = 36 samples a step; the device hides 0.8 * 100 / 0.5 = 160
    SplitModel.Split s = SplitModel.target(B, 0.0025, 0.0005, 0.1);
    assertEquals(36, s.cpuRows());
    assertTrue(s.why().contains("keeps up with 36 samples a step; the device hides the other 28"), s.why());
  }

  @Test
  void inputBoundBalancesTheTwo() {
    // the sidecar sustains 11 samples of a 50 ms step, the device hides 20: together short of 64
    SplitModel.Split s = SplitModel.target(B, 0.004, 0.002, 0.05);
    assertEquals(21, s.cpuRows()); // 64 * 2 / 6: 84 ms on the sidecar, 86 ms on the device
    assertTrue(s.why().startsWith("input-bound (the sidecar sustains 11 samples a step, the device hides 20)"),
        s.why());
  }

  @Test
  void withoutMeasuredRatesThereIsNoTarget() {
    assertThrows(IllegalArgumentException.class, () -> SplitModel.target(B, 0, 0.001, 0.1));
    assertThrows(IllegalArgumentException.class, () -> SplitModel.target(B, 0.001, Double.NaN, 0.1));
    assertThrows(IllegalArgumentException.class, () -> SplitModel.target(B, 0.001, 0.001, 0));
  }

  @Test
  void theTargetMeetsBothBoundsWheneverSomeSplitDoes() {
    Random r = new Random(31);
    for (int i = 0; i < 10_000; i++) {
      int b = 1 + r.nextInt(512);
      double a = Math.exp(-9 + 6 * r.nextDouble());
      double d = Math.exp(-9 + 6 * r.nextDouble());
      double s = Math.exp(-5 + 5 * r.nextDouble());
      int c = SplitModel.target(b, a, d, s).cpuRows();
      assertTrue(c >= 0 && c <= b, "within the batch: " + c + " of " + b);
      boolean feasible = false;
      for (int k = 0; k <= b && !feasible; k++) {
        feasible = k * a <= SplitModel.MARGIN * s && (b - k) * d <= SplitModel.HEADROOM * s;
      }
      if (feasible) {
        assertTrue(c * a <= SplitModel.MARGIN * s + 1e-12 && (b - c) * d <= SplitModel.HEADROOM * s + 1e-12,
            "b=" + b + " a=" + a + " d=" + d + " s=" + s + ": " + c);
      }
    }
  }
}
