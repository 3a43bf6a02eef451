package io.unstall.flight.prep;

import io.unstall.flight.dataset.Dataset;
import java.util.Arrays;
import java.util.SplittableRandom;

/**
 * A group's batch positions and sample order: position {@code pos = epoch * numBatches + batch} over epochs, and
 * each epoch's order of samples (a seeded shuffle, the same on every sidecar). Immutable but for a one-epoch cache
 * under its own lock, a leaf of the group's lock order ({@link GroupLock}).
 */
final class BatchOrder {
  final String group;
  final PrepGroup.Key key;
  final Dataset dataset;
  final int numSamples;
  final int numBatches;
  private long orderEpoch = -1; // guarded by this
  private int[] order; // guarded by this; replaced, never changed, so callers may keep it

  BatchOrder(String group, PrepGroup.Key key, Dataset dataset) {
    this.group = group;
    this.key = key;
    this.dataset = dataset;
    this.numSamples = dataset.size();
    int b = key.batchSize();
    this.numBatches = key.dropLast() ? numSamples / b : (numSamples + b - 1) / b;
    if (numBatches == 0) {
      throw new IllegalArgumentException("prep group: dataset '" + dataset.name() + "' has " + numSamples
          + " samples, fewer than batch_size " + b + " with drop_last: no batch at all");
    }
  }

  /** The samples of {@code epoch}, in order. */
  synchronized int[] order(long epoch) {
    if (orderEpoch != epoch) {
      int[] o = new int[numSamples];
      for (int i = 0; i < o.length; i++) {
        o[i] = i;
      }
      if (key.shuffle()) {
        SplittableRandom r = ImagePrep.rng(key.seed() ^ 0x5EED5EEDL, epoch, Long.MIN_VALUE);
        for (int i = o.length - 1; i > 0; i--) {
          int j = r.nextInt(i + 1);
          int t = o[i];
          o[i] = o[j];
          o[j] = t;
        }
      }
      order = o;
      orderEpoch = epoch;
    }
    return order;
  }

  /** The ids of the batch at {@code pos}, in order. */
  int[] ids(long pos) {
    int from = (int) (pos % numBatches) * key.batchSize();
    int to = Math.min(from + key.batchSize(), numSamples);
    return Arrays.copyOfRange(order(pos / numBatches), from, to);
  }

  long pos(long epoch, long batch) {
    return epoch * numBatches + batch;
  }

  /** "epoch 2 batch 5": how messages name a position. */
  String at(long pos) {
    return "epoch " + pos / numBatches + " batch " + pos % numBatches;
  }

  /** "dataset 'imgs' sample 12 ('c0/x.jpg')": how errors name a sample. */
  String sample(int sampleId) {
    return "dataset '" + dataset.name() + "' sample " + sampleId + " ('" + dataset.key(sampleId) + "')";
  }
}
