package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.Locale;

/**
 * The cost model behind the cache forms (docs/PREP.md, "Cache forms"): from a group's measured rates it predicts an
 * epoch's time with each form and chooses how many bytes of the forms memory hold decoded pixels, and whether
 * prepared batches are kept. An epoch takes as long as its slowest stage:
 * {@code max(N * cpu / threads, N * fetch, N / consumer)}, with {@code cpu = f * decoded + (1 - f) * encoded} per
 * sample for a fraction {@code f} of the samples kept decoded; {@code f} is what the memory holds, and is chosen
 * only where it shortens the epoch (prep is the bound). A prepared batch is worth keeping only when it is read
 * again: each epoch draws new crops per (seed, epoch, sample), so that is only when a batch has later readers.
 */
final class FormPlanner {
  private FormPlanner() {}

  /** Gains below this fraction of the epoch are noise: the memory is left to the encoded forms. */
  static final double MIN_GAIN = 0.02;

  /**
   * One group's measured rates, per sample: CPU seconds of prep from the encoded bytes and from kept pixels, wall
   * seconds of fetch, bytes of each form; the members' samples per second (0: not measured), prep threads, the
   * epoch's samples, the bytes the decoded form may hold (budget) and the reads of a prepared batch after its first.
   */
  record Rates(long samples, double encodedCpuS, double decodedCpuS, double fetchS, double encodedBytes,
      double decodedBytes, double consumerPerS, int threads, long budgetBytes, int laterReads) {}

  /** The choice: bytes for decoded pixels, samples they hold, prepared batches kept or not, and why. */
  record Plan(long decodedBytes, long decodedSamples, boolean keepPrepared, double encodedOnlyEpochS,
      double plannedEpochS, String bound, String reason) {

    void stats(ObjectNode o) {
      o.put("decoded_bytes", decodedBytes);
      o.put("decoded_samples", decodedSamples);
      o.put("keep_prepared", keepPrepared);
      o.put("predicted_epoch_s_encoded_only", encodedOnlyEpochS);
      o.put("predicted_epoch_s", plannedEpochS);
      o.put("bound", bound);
      o.put("reason", reason);
    }
  }

  /** The stage that bounds an epoch, and its seconds. */
  private record Epoch(double seconds, String bound) {}

  private static Epoch epoch(Rates r, double decodedFraction) {
    double n = r.samples();
    double cpu = n * (decodedFraction * r.decodedCpuS() + (1 - decodedFraction) * r.encodedCpuS())
        / Math.max(1, r.threads());
    double fetch = n * r.fetchS();
    double consume = r.consumerPerS() > 0 ? n / r.consumerPerS() : 0;
    if (cpu >= fetch && cpu >= consume) {
      return new Epoch(cpu, "prep");
    }
    return fetch >= consume ? new Epoch(fetch, "fetch") : new Epoch(consume, "consumer");
  }

  static Plan plan(Rates r) {
    boolean keepPrepared = r.laterReads() > 0;
    String prepared = keepPrepared
        ? String.format(Locale.ROOT, "prepared batches kept: each is read %d more time(s)", r.laterReads())
        : "prepared batches not kept: no batch is read again (each epoch draws new crops)";
    Epoch encoded = epoch(r, 0);
    long fit = r.decodedBytes() <= 0 ? 0 : (long) Math.min(r.samples(), r.budgetBytes() / r.decodedBytes());
    double f = r.samples() == 0 ? 0 : (double) fit / r.samples();
    Epoch mixed = epoch(r, f);
    double gain = encoded.seconds() <= 0 ? 0 : 1 - mixed.seconds() / encoded.seconds();
    String numbers = String.format(Locale.ROOT,
        "prep %.2f ms/sample from encoded, %.2f from decoded; %d of %d samples fit in %d MB; epoch %.2f s -> %.2f s",
        r.encodedCpuS() * 1e3, r.decodedCpuS() * 1e3, fit, r.samples(), r.budgetBytes() >> 20, encoded.seconds(),
        mixed.seconds());
    if (fit == 0 || gain < MIN_GAIN) {
      String why = fit == 0 ? "no decoded sample fits the forms memory"
          : r.decodedCpuS() >= r.encodedCpuS() ? "decoded pixels are no cheaper to prepare"
          : "the epoch is " + encoded.bound() + "-bound, not prep-bound";
      return new Plan(0, 0, keepPrepared, encoded.seconds(), encoded.seconds(), encoded.bound(),
          "encoded only: " + why + " (" + numbers + "); " + prepared);
    }
    return new Plan((long) Math.ceil(fit * r.decodedBytes()), fit, keepPrepared, encoded.seconds(),
        mixed.seconds(), mixed.bound(), String.format(Locale.ROOT, "decoded pixels for %d samples: %.0f%% shorter"
        + " epoch (%s); %s", fit, gain * 100, numbers, prepared));
  }
}
