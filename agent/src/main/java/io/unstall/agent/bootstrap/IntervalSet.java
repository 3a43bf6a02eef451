package io.unstall.agent.bootstrap;

/**
 * The byte ranges of one file that were already read, as sorted disjoint [start, end) pairs.
 * {@link #add} returns how many bytes of the new range were not covered yet, which gives the
 * re-read bytes. Sequential reads extend the last range in O(1) without allocating; the array
 * grows by doubling only when a new disjoint range appears. Not thread-safe: the owner locks.
 */
public final class IntervalSet {
  /** Past this many disjoint ranges we stop tracking and report re-reads as a lower bound. */
  static final int MAX_RANGES = 1 << 20;

  private long[] ranges = new long[8]; // start0, end0, start1, end1, ...
  private int count;
  private boolean truncated;

  /** Adds [start, end) and returns the number of bytes that were not in the set before. */
  public long add(long start, long end) {
    if (end <= start) {
      return 0;
    }
    if (count == 0) {
      insertAt(0, start, end);
      return end - start;
    }
    int last = (count - 1) * 2;
    if (start >= ranges[last]) {
      // Fast path: at or after the start of the last range (sequential reading).
      long lastEnd = ranges[last + 1];
      if (start <= lastEnd) {
        if (end <= lastEnd) {
          return 0;
        }
        ranges[last + 1] = end;
        return end - lastEnd;
      }
      if (count >= MAX_RANGES) {
        truncated = true;
        return end - start;
      }
      insertAt(count, start, end);
      return end - start;
    }
    return addSlow(start, end);
  }

  private long addSlow(long start, long end) {
    // First range whose end >= start: everything before it lies strictly to the left.
    int lo = 0;
    int hi = count;
    while (lo < hi) {
      int mid = (lo + hi) >>> 1;
      if (ranges[mid * 2 + 1] < start) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    int first = lo;
    long covered = 0;
    long newStart = start;
    long newEnd = end;
    int i = first;
    while (i < count && ranges[i * 2] <= end) {
      long s = ranges[i * 2];
      long e = ranges[i * 2 + 1];
      covered += Math.max(0, Math.min(e, end) - Math.max(s, start));
      newStart = Math.min(newStart, s);
      newEnd = Math.max(newEnd, e);
      i++;
    }
    int merged = i - first;
    if (merged == 0) {
      if (count >= MAX_RANGES) {
        truncated = true;
        return end - start;
      }
      insertAt(first, start, end);
    } else {
      ranges[first * 2] = newStart;
      ranges[first * 2 + 1] = newEnd;
      int removed = merged - 1;
      if (removed > 0) {
        System.arraycopy(ranges, i * 2, ranges, (first + 1) * 2, (count - i) * 2);
        count -= removed;
      }
    }
    return (end - start) - covered;
  }

  private void insertAt(int index, long start, long end) {
    if ((count + 1) * 2 > ranges.length) {
      long[] bigger = new long[ranges.length * 2];
      System.arraycopy(ranges, 0, bigger, 0, count * 2);
      ranges = bigger;
    }
    System.arraycopy(ranges, index * 2, ranges, (index + 1) * 2, (count - index) * 2);
    ranges[index * 2] = start;
    ranges[index * 2 + 1] = end;
    count++;
  }

  /** Number of distinct bytes in the set. */
  public long coveredBytes() {
    long sum = 0;
    for (int i = 0; i < count; i++) {
      sum += ranges[i * 2 + 1] - ranges[i * 2];
    }
    return sum;
  }

  /** A copy of the ranges: start0, end0, start1, end1, ... */
  public long[] ranges() {
    return java.util.Arrays.copyOf(ranges, count * 2);
  }

  public int rangeCount() {
    return count;
  }

  /** True when too many disjoint ranges appeared and re-reads are a lower bound. */
  public boolean truncated() {
    return truncated;
  }
}
