package io.unstall.agent.bootstrap;

import static org.junit.jupiter.api.Assertions.assertEquals;

import org.junit.jupiter.api.Test;

class FileStatsTest {
  @Test
  void bucketsFollowDarshanBoundaries() {
    assertEquals(0, FileStats.bucket(1));
    assertEquals(0, FileStats.bucket(99));
    assertEquals(1, FileStats.bucket(100));
    assertEquals(2, FileStats.bucket(4096));
    assertEquals(3, FileStats.bucket(65536));
    assertEquals(4, FileStats.bucket((1 << 20) - 1));
    assertEquals(5, FileStats.bucket(1 << 20));
    assertEquals(9, FileStats.bucket(2L << 30));
    assertEquals(FileStats.BUCKET_NAMES.length, FileStats.BUCKET_LIMITS.length + 1);
  }

  @Test
  void countsSequentialConsecutiveAndRereads() {
    FileStats f = new FileStats(1, "/data/a");
    f.record(0, 4096, 10); // consecutive (starts the file)
    f.record(4096, 4096, 10); // consecutive
    f.record(16384, 4096, 10); // sequential, not consecutive
    f.record(0, 4096, 10); // neither; re-read
    f.record(4096, -1, 5); // end of file: a call, no data
    FileStats.Snapshot s = f.snapshot();
    assertEquals(16384, s.bytes);
    assertEquals(5, s.readCalls);
    assertEquals(4, s.dataReads);
    assertEquals(45, s.readNanos);
    assertEquals(2, s.consecutive);
    assertEquals(3, s.sequential);
    assertEquals(4096, s.bytesReread);
    assertEquals(12288, s.uniqueBytes);
    assertEquals(4, s.sizeBuckets[2]);
    assertEquals(4096, s.minRequest);
    assertEquals(4096, s.maxRequest);
    assertEquals(20480, s.maxOffset);
  }
}
