package io.unstall.flight.prep;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.unstall.flight.prep.FormPlanner.Plan;
import io.unstall.flight.prep.FormPlanner.Rates;
import org.junit.jupiter.api.Test;

/** The cost model's choices for prep-, fetch- and consumer-bound groups, a small budget, and prepared batches. */
class FormPlannerTest {
  static final double MB = 1 << 20;

  /** 10,000 samples of 100 KB encoded, 560 KB decoded; 4 ms of prep CPU from encoded, 1 ms from decoded. */
  static Rates rates(double fetchS, double consumerPerS, long budget, int laterReads) {
    return new Rates(10_000, 0.004, 0.001, fetchS, 100e3, 560e3, consumerPerS, 2, budget, laterReads);
  }

  @Test
  void aPrepBoundGroupKeepsAllItCanDecoded() {
    Plan p = FormPlanner.plan(rates(0.0001, 0, 8L << 30, 0));
    assertEquals(10_000, p.decodedSamples(), p.reason());
    assertEquals(20.0, p.encodedOnlyEpochS(), 1e-9); // 10,000 x 4 ms / 2 threads
    assertEquals(5.0, p.plannedEpochS(), 1e-9);
    assertEquals("prep", p.bound());
    assertTrue(p.decodedBytes() <= 8L << 30);
    assertTrue(p.reason().startsWith("decoded pixels for 10000 samples: 75% shorter epoch"), p.reason());
  }

  @Test
  void aSmallBudgetKeepsTheSamplesThatFitAndStaysWithinIt() {
    long budget = (long) (1000 * MB);
    Plan p = FormPlanner.plan(rates(0.0001, 0, budget, 0));
    assertEquals((long) (budget / 560e3), p.decodedSamples(), p.reason());
    assertTrue(p.decodedBytes() <= budget, p.reason());
    assertTrue(p.plannedEpochS() < p.encodedOnlyEpochS());
  }

  @Test
  void aConsumerOrFetchBoundGroupKeepsOnlyEncodedForms() {
    Plan slowTrainer = FormPlanner.plan(rates(0.0001, 100, 8L << 30, 0)); // 100 s/epoch vs 20 s of prep
    assertEquals(0, slowTrainer.decodedBytes(), slowTrainer.reason());
    assertEquals("consumer", slowTrainer.bound());
    assertTrue(slowTrainer.reason().contains("consumer-bound, not prep-bound"), slowTrainer.reason());
    Plan slowStorage = FormPlanner.plan(rates(0.01, 0, 8L << 30, 0)); // 100 s of fetch
    assertEquals(0, slowStorage.decodedBytes(), slowStorage.reason());
    assertEquals("fetch", slowStorage.bound());
  }

  @Test
  void decodedPixelsThatAreNoCheaperOrDoNotFitAreNotKept() {
    Plan same = FormPlanner.plan(new Rates(10_000, 0.004, 0.004, 0, 100e3, 560e3, 0, 2, 8L << 30, 0));
    assertEquals(0, same.decodedBytes());
    assertTrue(same.reason().contains("no cheaper"), same.reason());
    Plan none = FormPlanner.plan(rates(0, 0, 100_000, 0));
    assertEquals(0, none.decodedBytes());
    assertTrue(none.reason().contains("no decoded sample fits"), none.reason());
  }

  @Test
  void preparedBatchesAreKeptOnlyWhenReadAgain() {
    assertFalse(FormPlanner.plan(rates(0, 0, 8L << 30, 0)).keepPrepared());
    Plan echoed = FormPlanner.plan(rates(0, 0, 8L << 30, 1));
    assertTrue(echoed.keepPrepared());
    assertTrue(echoed.reason().contains("read 1 more time"), echoed.reason());
  }
}
