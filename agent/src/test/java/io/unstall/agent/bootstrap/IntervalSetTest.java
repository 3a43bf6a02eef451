package io.unstall.agent.bootstrap;

import static org.junit.jupiter.api.Assertions.assertEquals;

import org.junit.jupiter.api.Test;

class IntervalSetTest {
  @Test
  void sequentialReadsExtendOneRange() {
    IntervalSet s = new IntervalSet();
    for (long off = 0; off < 40960; off += 4096) {
      assertEquals(4096, s.add(off, off + 4096));
    }
    assertEquals(1, s.rangeCount());
    assertEquals(40960, s.coveredBytes());
    assertEquals(0, s.add(0, 40960)); // a second epoch is all re-read
  }

  @Test
  void overlapsCountOnlyNewBytes() {
    IntervalSet s = new IntervalSet();
    assertEquals(100, s.add(1000, 1100));
    assertEquals(100, s.add(0, 100));
    assertEquals(100, s.add(500, 600));
    assertEquals(3, s.rangeCount());
    // Covers 0..1200: new bytes are 100..500, 600..1000, 1100..1200.
    assertEquals(400 + 400 + 100, s.add(50, 1200));
    assertEquals(1, s.rangeCount());
    assertEquals(1200, s.coveredBytes());
  }

  @Test
  void adjacentRangesMergeAndEmptyRangesAreIgnored() {
    IntervalSet s = new IntervalSet();
    assertEquals(10, s.add(10, 20));
    assertEquals(10, s.add(0, 10));
    assertEquals(0, s.add(5, 5));
    assertEquals(1, s.rangeCount());
    assertEquals(20, s.coveredBytes());
  }

  @Test
  void growsPastItsInitialCapacity() {
    IntervalSet s = new IntervalSet();
    for (int i = 99; i >= 0; i--) {
      assertEquals(10, s.add(i * 100L, i * 100L + 10));
    }
    assertEquals(100, s.rangeCount());
    assertEquals(1000, s.coveredBytes());
  }
}
