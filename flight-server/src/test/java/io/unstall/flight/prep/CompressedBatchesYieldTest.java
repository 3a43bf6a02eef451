package io.unstall.flight.prep;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

/** When {@link CompressedBatches} stops compressing: its codec's latest batches did not shrink. */
class CompressedBatchesYieldTest {
  private static final long RAW = 9_633_792;

  /** Compresses every position the yield allows, at {@code share} of the raw bytes; returns how many it compressed. */
  private static int run(CompressedBatches.Yield y, long from, long to, double share) {
    int compressed = 0;
    for (long pos = from; pos < to; pos++) {
      if (y.worthTrying(pos)) {
        y.judge(pos, RAW, Math.round(RAW * share));
        compressed++;
      }
    }
    return compressed;
  }

  @Test
  void batchesThatShrinkAreAlwaysCompressed() {
    CompressedBatches.Yield y = new CompressedBatches.Yield();
    assertEquals(500, run(y, 0, 500, 0.6));
    assertEquals(0, y.skipped);
    assertEquals(0, y.stops);
  }

  @Test
  void batchesThatDoNotShrinkStopItAndOneIsTriedAgainEveryProbe() {
    CompressedBatches.Yield y = new CompressedBatches.Yield();
    long n = CompressedBatches.WINDOW + 3 * (CompressedBatches.PROBE_EVERY + 1);
    // the window's batches, then one probe after each pause
    assertEquals(CompressedBatches.WINDOW + 3, run(y, 0, n, 1.0));
    assertEquals(n - CompressedBatches.WINDOW - 3, y.skipped);
    assertEquals(4, y.stops);
  }

  @Test
  void itResumesWhenTheDataStartsToShrink() {
    CompressedBatches.Yield y = new CompressedBatches.Yield();
    long paused = CompressedBatches.WINDOW + CompressedBatches.PROBE_EVERY;
    run(y, 0, paused, 1.0);
    assertEquals(1, y.stops);
    // the probe after the pause shrinks well: the window's share falls to WORTH or below, and every batch after is
    // compressed
    assertEquals(100, run(y, paused, paused + 100, 0.3));
    assertTrue(y.share() <= CompressedBatches.WORTH);
    assertEquals(1, y.stops);
  }

  @Test
  void aPositionBelowThePauseIsCompressedForAResumedMember() {
    CompressedBatches.Yield y = new CompressedBatches.Yield();
    run(y, 100, 100 + CompressedBatches.WINDOW, 1.0);
    assertFalse(y.worthTrying(100 + CompressedBatches.WINDOW));
    assertTrue(y.worthTrying(10), "below where it stopped");
  }
}
