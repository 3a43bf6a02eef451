package io.unstall.agent.bootstrap;

/**
 * Darshan-style counters for one file (by absolute path), shared by every stream and thread that
 * reads it. Updated under this object's lock; nothing is allocated per read except when the
 * re-read tracker grows.
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
  private long readNanos;
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

  public FileStats(int id, String path) {
    this.id = id;
    this.path = path;
  }

  /** One stream or channel started reading this file. */
  public synchronized void opened(long nowNanos) {
    if (opens++ == 0) {
      firstOpenNanos = nowNanos;
    }
  }

  /**
   * Records one read call that returned {@code n} bytes (n &lt;= 0 for end of file) at {@code offset}.
   */
  public synchronized void record(long offset, long n, long nanos) {
    readCalls++;
    readNanos += nanos;
    if (n <= 0) {
      return;
    }
    dataReads++;
    bytes += n;
    sizeBuckets[bucket(n)]++;
    if (n < minRequest) {
      minRequest = n;
    }
    if (n > maxRequest) {
      maxRequest = n;
    }
    if (offset == lastEnd) {
      consecutive++;
    }
    if (offset >= lastEnd) {
      sequential++;
    }
    long end = offset + n;
    lastEnd = end;
    if (end > maxEnd) {
      maxEnd = end;
    }
    reread += n - seen.add(offset, end);
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
    s.readNanos = readNanos;
    s.consecutive = consecutive;
    s.sequential = sequential;
    s.maxOffset = maxEnd;
    s.bytesReread = reread;
    s.uniqueBytes = seen.coveredBytes();
    s.rereadTruncated = seen.truncated();
    s.minRequest = dataReads == 0 ? 0 : minRequest;
    s.maxRequest = maxRequest;
    s.opens = opens;
    s.firstOpenNanos = firstOpenNanos;
    s.sizeBuckets = sizeBuckets.clone();
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
    public long readNanos;
    public long consecutive;
    public long sequential;
    public long maxOffset;
    public long bytesReread;
    public long uniqueBytes;
    public boolean rereadTruncated;
    public long minRequest;
    public long maxRequest;
    public long opens;
    public long firstOpenNanos;
    public long[] sizeBuckets;
  }
}
