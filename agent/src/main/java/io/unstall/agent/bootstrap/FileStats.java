package io.unstall.agent.bootstrap;

/**
 * Darshan-style counters for one file (by absolute path), shared by every stream and thread that
 * uses it. Updated under this object's lock, by batches of contiguous reads that a thread
 * collected ({@link ThreadState}), by single writes and by syncs; nothing is allocated per call
 * except when the re-read tracker grows.
 */
public final class FileStats {
  /**
   * Request-size bucket upper bounds (exclusive), as in Darshan's POSIX_SIZE_READ_* counters:
   * 0-100, 100-1K, 1K-10K, 10K-100K, 100K-1M, 1M-4M, 4M-10M, 10M-100M, 100M-1G, 1G+.
   */
  public static final long[] BUCKET_LIMITS = {
    100, 1_024, 10_240, 102_400, 1_048_576, 4_194_304, 10_485_760, 104_857_600, 1_073_741_824
  };

  public static final String[] BUCKET_NAMES = {
    "0_100", "100_1K", "1K_10K", "10K_100K", "100K_1M", "1M_4M", "4M_10M", "10M_100M", "100M_1G",
    "1G_PLUS"
  };

  public final int id;
  public final String path;

  private long bytes;
  private long readCalls;
  private long dataReads;
  private long timedReadNanos;
  private long timedReadCalls;
  private long consecutive;
  private long sequential;
  private long lastEnd = 0;
  private long maxEnd;
  private long reread;
  private long minRequest = Long.MAX_VALUE;
  private long maxRequest;
  private long opens;
  private long firstOpenNanos;
  private final long[] sizeBuckets = new long[BUCKET_NAMES.length];
  private final IntervalSet seen = new IntervalSet();

  private long bytesWritten;
  private long writeCalls;
  private long writeNanos;
  private long minWrite = Long.MAX_VALUE;
  private long maxWrite;
  private long writeOpens;
  private long syncs;
  private long syncNanos;
  private final long[] writeBuckets = new long[BUCKET_NAMES.length];

  public FileStats(int id, String path) {
    this.id = id;
    this.path = path;
  }

  /** One stream or channel started reading ({@code write} false) or writing this file. */
  public synchronized void opened(long nowNanos, boolean write) {
    if (write) {
      writeOpens++;
      return;
    }
    if (opens++ == 0) {
      firstOpenNanos = nowNanos;
    }
  }

  /**
   * Records one read call that returned {@code n} bytes (n &lt;= 0 for end of file) at {@code offset},
   * which took {@code nanos}.
   */
  public void record(long offset, long n, long nanos) {
    long[] bucket = new long[BUCKET_NAMES.length];
    if (n > 0) {
      bucket[bucket(n)] = 1;
    }
    recordReads(offset, offset + Math.max(0, n), 1, n > 0 ? 1 : 0, nanos, 1, n, n, bucket);
  }

  /**
   * Records a batch of read calls whose data reads covered [start, end) contiguously, in order.
   * {@code timedNanos} is the time of the {@code timedCalls} calls that were timed.
   */
  synchronized void recordReads(long start, long end, long calls, long batchDataReads,
      long timedNanos, long timedCalls, long min, long max, long[] buckets) {
    readCalls += calls;
    timedReadNanos += timedNanos;
    timedReadCalls += timedCalls;
    if (batchDataReads <= 0) {
      return;
    }
    dataReads += batchDataReads;
    long n = end - start;
    bytes += n;
    for (int i = 0; i < buckets.length; i++) {
      sizeBuckets[i] += buckets[i];
    }
    if (min < minRequest) {
      minRequest = min;
    }
    if (max > maxRequest) {
      maxRequest = max;
    }
    // The first read of the batch against the file's previous read; the others follow it.
    if (start == lastEnd) {
      consecutive++;
    }
    if (start >= lastEnd) {
      sequential++;
    }
    consecutive += batchDataReads - 1;
    sequential += batchDataReads - 1;
    lastEnd = end;
    if (end > maxEnd) {
      maxEnd = end;
    }
    reread += n - seen.add(start, end);
  }

  /** Records one write call of {@code n} bytes (0 when it threw). */
  public synchronized void recordWrite(long n, long nanos) {
    writeCalls++;
    writeNanos += nanos;
    if (n <= 0) {
      return;
    }
    bytesWritten += n;
    writeBuckets[bucket(n)]++;
    if (n < minWrite) {
      minWrite = n;
    }
    if (n > maxWrite) {
      maxWrite = n;
    }
  }

  /** Records one force/fsync of this file. */
  public synchronized void recordSync(long nanos) {
    syncs++;
    syncNanos += nanos;
  }

  public static int bucket(long n) {
    for (int i = 0; i < BUCKET_LIMITS.length; i++) {
      if (n < BUCKET_LIMITS[i]) {
        return i;
      }
    }
    return BUCKET_LIMITS.length;
  }

  /** A consistent copy of the counters, for the profile. */
  public synchronized Snapshot snapshot() {
    Snapshot s = new Snapshot();
    s.path = path;
    s.bytes = bytes;
    s.readCalls = readCalls;
    s.dataReads = dataReads;
    s.readNanos = timedReadCalls == 0 ? 0 : timedReadNanos * readCalls / timedReadCalls;
    s.consecutive = consecutive;
    s.sequential = sequential;
    s.maxOffset = maxEnd;
    s.bytesReread = reread;
    s.uniqueBytes = seen.coveredBytes();
    s.rereadTruncated = seen.truncated();
    s.readRanges = seen.ranges();
    s.minRequest = dataReads == 0 ? 0 : minRequest;
    s.maxRequest = maxRequest;
    s.opens = opens;
    s.firstOpenNanos = firstOpenNanos;
    s.sizeBuckets = sizeBuckets.clone();
    s.bytesWritten = bytesWritten;
    s.writeCalls = writeCalls;
    s.writeNanos = writeNanos;
    s.minWrite = bytesWritten == 0 ? 0 : minWrite;
    s.maxWrite = maxWrite;
    s.writeOpens = writeOpens;
    s.syncs = syncs;
    s.syncNanos = syncNanos;
    s.writeBuckets = writeBuckets.clone();
    return s;
  }

  /** Plain copy of one file's counters. */
  public static final class Snapshot {
    public String path;
    public long bytes;
    /** Every read call, including those that returned end of file. */
    public long readCalls;
    /** Read calls that returned at least one byte; the request-size histogram counts these. */
    public long dataReads;
    /** Time inside read calls, estimated from the timed calls (all of them in unit tests). */
    public long readNanos;
    public long consecutive;
    public long sequential;
    public long maxOffset;
    public long bytesReread;
    public long uniqueBytes;
    public boolean rereadTruncated;
    /** The distinct byte ranges read, as start0, end0, start1, end1, ... (sorted, disjoint). */
    public long[] readRanges;
    public long minRequest;
    public long maxRequest;
    public long opens;
    public long firstOpenNanos;
    public long[] sizeBuckets;
    public long bytesWritten;
    public long writeCalls;
    public long writeNanos;
    public long minWrite;
    public long maxWrite;
    public long writeOpens;
    public long syncs;
    public long syncNanos;
    public long[] writeBuckets;
  }
}
