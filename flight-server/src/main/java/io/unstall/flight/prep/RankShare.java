package io.unstall.flight.prep;

import java.util.Arrays;
import org.apache.arrow.flight.CallStatus;

/**
 * The batches a member that is one data-parallel rank of a job reads: rank {@code rank} of {@code world} reads the
 * epoch's remaining batches whose index in that sequence is {@code rank} modulo {@code world} (the shim's {@code
 * unstall.elastic.Share} with one batch per step). Every epoch's remaining sequence is all its batches, but for the
 * epoch a restored job continues ({@code epoch}): there it is the batches not in {@code consumed} (what the job read
 * before its checkpoint), of which this member also skips the first {@code skip} indices (those it read itself
 * before a checkpoint taken on the same ranks). Immutable.
 */
final class RankShare {
  /**
   * A {@code prep.join}'s {@code "share"}, before the group (its batches per epoch) is known: {@code consumed} and
   * {@code skip} apply to the member's {@code start_epoch}.
   */
  record Spec(int world, int rank, long[][] consumed, long skip) {
    RankShare of(long numBatches, long startEpoch) {
      return new RankShare(world, rank, numBatches, startEpoch, consumed, skip);
    }
  }

  final int world;
  final int rank;
  private final long numBatches;
  private final long epoch;
  private final long skip;
  // The restored epoch's remaining batches as gaps between consumed ranges: [gapStart[i], gapEnd[i]), whose first
  // batch has index gapIndex[i] in the remaining sequence; gapIndex[n] is the sequence's length.
  private final long[] gapStart;
  private final long[] gapEnd;
  private final long[] gapIndex;

  /**
   * {@code consumed}: sorted, disjoint {@code [start, end)} batch ranges of {@code epoch}, each within the epoch;
   * otherwise INVALID_ARGUMENT naming the range.
   */
  RankShare(int world, int rank, long numBatches, long epoch, long[][] consumed, long skip) {
    if (world < 1 || rank < 0 || rank >= world || skip < 0) {
      throw CallStatus.INVALID_ARGUMENT.withDescription("prep.join: a rank share needs world_size >= 1, 0 <= rank <"
          + " world_size and skip >= 0; got world_size " + world + ", rank " + rank + ", skip " + skip)
          .toRuntimeException();
    }
    this.world = world;
    this.rank = rank;
    this.numBatches = numBatches;
    this.epoch = epoch;
    this.skip = skip;
    long[] starts = new long[consumed.length + 1];
    long[] ends = new long[consumed.length + 1];
    long[] index = new long[consumed.length + 2];
    int n = 0;
    long at = 0;
    for (long[] r : consumed) {
      if (r[0] < at || r[1] <= r[0] || r[1] > numBatches) {
        throw CallStatus.INVALID_ARGUMENT.withDescription("prep.join: \"consumed\" range [" + r[0] + ", " + r[1]
            + ") is not a sorted, disjoint, non-empty range of batches within [0, " + numBatches + ")")
            .toRuntimeException();
      }
      if (r[0] > at) {
        starts[n] = at;
        ends[n] = r[0];
        index[n + 1] = index[n] + r[0] - at;
        n++;
      }
      at = r[1];
    }
    if (at < numBatches) {
      starts[n] = at;
      ends[n] = numBatches;
      index[n + 1] = index[n] + numBatches - at;
      n++;
    }
    this.gapStart = Arrays.copyOf(starts, n);
    this.gapEnd = Arrays.copyOf(ends, n);
    this.gapIndex = Arrays.copyOf(index, n + 1);
  }

  /** The first position at or after {@code from} that this rank reads; {@code Long.MAX_VALUE} if none. */
  long next(long from) {
    long e = from / numBatches;
    long b = from % numBatches;
    if (e == epoch) {
      long p = nextInRestored(b);
      if (p >= 0) {
        return e * numBatches + p;
      }
      e++;
      b = 0;
    }
    if (rank >= numBatches) {
      return Long.MAX_VALUE; // more ranks than batches: this one reads none of a whole epoch
    }
    long first = b + Math.floorMod(rank - b, world);
    return first < numBatches ? e * numBatches + first : next((e + 1) * numBatches);
  }

  /** The first batch at or after {@code b} of the restored epoch that this rank reads, or -1. */
  private long nextInRestored(long b) {
    int g = 0;
    while (g < gapEnd.length && gapEnd[g] <= b) {
      g++;
    }
    if (g == gapEnd.length) {
      return -1;
    }
    long idx = gapIndex[g] + Math.max(0, b - gapStart[g]);
    idx = Math.max(idx, skip * world + rank);
    idx += Math.floorMod(rank - idx, world);
    if (idx >= gapIndex[gapIndex.length - 1]) {
      return -1;
    }
    while (gapIndex[g + 1] <= idx) {
      g++;
    }
    return gapStart[g] + idx - gapIndex[g];
  }

  /** Whether this rank reads the batch at {@code pos}. */
  boolean reads(long pos) {
    return next(pos) == pos;
  }
}
