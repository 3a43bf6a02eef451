package io.unstall.flight.prep;

import io.unstall.flight.dataset.Dataset;
import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.Arrays;
import java.util.Base64;
import java.util.BitSet;
import java.util.HexFormat;
import java.util.SplittableRandom;
import java.util.TreeMap;
import java.util.function.Supplier;
import java.util.zip.DataFormatException;
import java.util.zip.Deflater;
import java.util.zip.Inflater;
import org.apache.arrow.flight.CallStatus;

/**
 * A group's batch positions and sample order: position {@code pos = epoch * numBatches + batch} over epochs, and
 * each epoch's order of samples (a seeded shuffle, the same on every sidecar). Immutable but for a one-epoch cache
 * under its own lock, a leaf of the group's lock order ({@link GroupLock}).
 *
 * <p>A cache-first group ({@code key.cacheWindow() > 0}) reorders each epoch's seeded order within aligned windows
 * of that many positions, cached samples first ({@link #cacheFirst}, the rule of the shim's
 * {@code cache_order.window_positions}), from one snapshot of the sidecar's cached set per epoch: taken when the
 * epoch's order is first needed, or pinned by a resumed member that carried it, and kept until every member is past
 * the epoch, so recomputing an order never changes it.
 */
final class BatchOrder {
  final String group;
  final PrepGroup.Key key;
  final Dataset dataset;
  final int numSamples;
  final int numBatches;
  private long orderEpoch = -1; // guarded by this
  private int[] order; // guarded by this; replaced, never changed, so callers may keep it
  private final Supplier<BitSet> cachedNow; // the cached set now; null where there is no cache (a replica)
  private final TreeMap<Long, BitSet> snapshots = new TreeMap<>(); // guarded by this: each epoch's, once fixed

  BatchOrder(String group, PrepGroup.Key key, Dataset dataset) {
    this(group, key, dataset, null);
  }

  /** {@code cachedNow}: which samples the sidecar holds now, for a cache-first group's snapshots. */
  BatchOrder(String group, PrepGroup.Key key, Dataset dataset, Supplier<BitSet> cachedNow) {
    if (key.cacheWindow() > 0 && cachedNow == null) {
      throw new IllegalArgumentException("prep group " + group + ": a cache_first order needs the sidecar's cache");
    }
    this.group = group;
    this.key = key;
    this.dataset = dataset;
    this.cachedNow = cachedNow;
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
      if (key.cacheWindow() > 0) {
        o = cacheFirst(o, snapshots.computeIfAbsent(epoch, e -> cachedNow.get()), key.cacheWindow());
      }
      order = o;
      orderEpoch = epoch;
    }
    return order;
  }

  /**
   * {@code order} reordered within each aligned window of {@code window} positions: the cached samples first, then
   * the others, each in their order there. A sample moves fewer than {@code window} positions, never out of its
   * window.
   */
  static int[] cacheFirst(int[] order, BitSet cached, int window) {
    int[] out = new int[order.length];
    int k = 0;
    for (int from = 0; from < order.length; from += window) {
      int to = Math.min(from + window, order.length);
      for (int i = from; i < to; i++) {
        if (cached.get(order[i])) {
          out[k++] = order[i];
        }
      }
      for (int i = from; i < to; i++) {
        if (!cached.get(order[i])) {
          out[k++] = order[i];
        }
      }
    }
    return out;
  }

  /** The snapshot {@code epoch}'s order is computed from, taking it now if it is not fixed yet (cache-first). */
  synchronized BitSet snapshot(long epoch) {
    order(epoch);
    return snapshots.get(epoch);
  }

  /**
   * Fixes {@code epoch}'s snapshot to the one a resumed member carried, so it continues the order it was reading;
   * INVALID_ARGUMENT, naming both snapshots, when the group already fixed another for that epoch.
   */
  synchronized void pin(long epoch, BitSet snapshot) {
    BitSet fixed = snapshots.putIfAbsent(epoch, snapshot);
    if (fixed != null && !fixed.equals(snapshot)) {
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep group " + group + " (dataset '" + dataset.name()
          + "') already reads epoch " + epoch + " in the cache_first order of snapshot " + digest(fixed)
          + "; the joiner's \"cache_snapshot\" is snapshot " + digest(snapshot) + ": it cannot continue its order"
          + " here (resume it where that epoch is not started, or start at the next epoch)").toRuntimeException();
    }
  }

  /** Forgets the snapshots of the epochs before {@code epoch}, which every member is past. */
  synchronized void forgetBefore(long epoch) {
    snapshots.headMap(epoch).clear();
  }

  /** A snapshot as the shim's {@code cache_order.snapshot_digest} names it: 16 hex digits. */
  String digest(BitSet snapshot) {
    try {
      MessageDigest sha = MessageDigest.getInstance("SHA-256");
      sha.update(ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN).putLong(numSamples).array());
      sha.update(packed(snapshot));
      return HexFormat.of().formatHex(sha.digest()).substring(0, 16);
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }

  /** A snapshot as the shim's {@code cache_order.encode_snapshot} writes it: base64 of the zlib-compressed bitmap. */
  String encode(BitSet snapshot) {
    Deflater z = new Deflater(9);
    try {
      z.setInput(packed(snapshot));
      z.finish();
      ByteArrayOutputStream out = new ByteArrayOutputStream();
      byte[] buf = new byte[8192];
      while (!z.finished()) {
        out.write(buf, 0, z.deflate(buf));
      }
      return Base64.getEncoder().encodeToString(out.toByteArray());
    } finally {
      z.end();
    }
  }

  /** {@link #encode}'s inverse for this dataset, or an IllegalArgumentException naming {@code what}. */
  BitSet decode(String text, String what) {
    int bytes = (numSamples + 7) / 8;
    byte[] packed = new byte[bytes + 1]; // one more: a longer bitmap shows
    int n = 0;
    boolean whole;
    Inflater z = new Inflater();
    try {
      z.setInput(Base64.getDecoder().decode(text));
      while (n < packed.length && !z.finished() && !z.needsInput() && !z.needsDictionary()) {
        n += z.inflate(packed, n, packed.length - n);
      }
      whole = z.finished();
    } catch (DataFormatException | IllegalArgumentException e) {
      throw new IllegalArgumentException(what + ": \"cache_snapshot\" is not base64 of a zlib bitmap: "
          + e.getMessage());
    } finally {
      z.end();
    }
    if (!whole || n != bytes) {
      throw new IllegalArgumentException(what + ": \"cache_snapshot\" is not the bitmap of dataset '"
          + dataset.name() + "' (" + numSamples + " samples, " + bytes + " bytes)");
    }
    return BitSet.valueOf(Arrays.copyOf(packed, bytes));
  }

  private byte[] packed(BitSet snapshot) {
    return Arrays.copyOf(snapshot.get(0, numSamples).toByteArray(), (numSamples + 7) / 8);
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
