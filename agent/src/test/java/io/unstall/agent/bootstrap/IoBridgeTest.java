package io.unstall.agent.bootstrap;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** The helper the advice calls, driven directly (advice is inlined and cannot be stepped into). */
class IoBridgeTest {
  final List<long[]> stalls = new ArrayList<>();
  final List<Checkpoint> checkpoints = new ArrayList<>();
  final List<String> failures = new ArrayList<>();
  final Object stream = new Object();
  final String path = "/data/io-bridge-test-" + System.nanoTime();

  @BeforeEach
  void start() {
    IoBridge.configure(new String[] {"/excluded/"}, new String[] {".jar"});
    IoBridge.start(
        new Sink() {
          @Override
          public void stall(Object it, String method, long start, long duration, ThreadState w,
              long processBytes, Throwable error) {
            stalls.add(new long[] {w.bytes(), w.readCalls(), w.files(), processBytes,
                error == null ? 0 : 1});
          }

          @Override
          public Object currentContext() {
            return "parent-" + checkpoints.size();
          }

          @Override
          public void checkpoint(Checkpoint c) {
            checkpoints.add(c);
          }
        },
        (where, t) -> failures.add(where + ": " + t.getMessage()));
  }

  void write(Object s, String p, long n) {
    IoBridge.writeExit(IoBridge.writeEnter(), s, p, n, -1);
  }

  @AfterEach
  void stop() {
    IoBridge.stop();
  }

  void read(Object s, String p, long n, long position) {
    IoBridge.readExit(IoBridge.readEnter(), s, p, n, position);
  }

  FileStats.Snapshot stats(String p) {
    IoBridge.flushThreads(false);
    for (FileStats.Snapshot s : IoBridge.fileSnapshots()) {
      if (s.path.equals(p)) {
        return s;
      }
    }
    return null;
  }

  @Test
  void aWaitAggregatesTheReadsOfItsThread() {
    ThreadState ts = IoBridge.iteratorEnter();
    assertNotNull(ts);
    read(stream, path, 4096, -1);
    read(stream, path, 4096, -1);
    read(new Object(), path + ".b", 100, -1);
    read(stream, path, -1, -1);
    IoBridge.iteratorExit(ts, this, "next", null);
    assertEquals(1, stalls.size());
    assertEquals(8292, stalls.get(0)[0]);
    assertEquals(4, stalls.get(0)[1]);
    assertEquals(2, stalls.get(0)[2]);
    assertEquals(8292, stalls.get(0)[3]);
    FileStats.Snapshot s = stats(path);
    assertEquals(8192, s.bytes);
    assertEquals(2, s.consecutive); // the stream position advanced 0 -> 4096 -> 8192
    assertEquals(1, s.opens);
  }

  @Test
  void nestedNextCallsAreOneStall() {
    ThreadState outer = IoBridge.iteratorEnter();
    ThreadState inner = IoBridge.iteratorEnter();
    read(stream, path, 10, -1);
    IoBridge.iteratorExit(inner, this, "next", null);
    assertTrue(stalls.isEmpty());
    IoBridge.iteratorExit(outer, this, "next", new IllegalStateException());
    assertEquals(1, stalls.size());
    assertEquals(10, stalls.get(0)[0]);
    assertEquals(1, stalls.get(0)[4]);
  }

  @Test
  void readsInsideAgentCodeOrAnotherReadAreNotRecorded() {
    ThreadState outer = IoBridge.readEnter();
    assertNotNull(outer);
    assertNull(IoBridge.readEnter(), "a nested read is not tracked");
    IoBridge.readExit(outer, stream, path, 5, -1);
    IoBridge.enterAgent();
    try {
      assertNull(IoBridge.readEnter());
      assertNull(IoBridge.iteratorEnter());
    } finally {
      IoBridge.exitAgent();
    }
    assertEquals(5, stats(path).bytes);
  }

  @Test
  void positionalReadsSeeksAndSkips() {
    read(stream, path, 100, 1000); // positional: does not move the stream
    read(stream, path, 100, -1); // at 0
    IoBridge.seekExit(stream, path, 5000);
    read(stream, path, 100, -1); // at 5000
    IoBridge.skipExit(stream, path, 900);
    read(stream, path, 100, -1); // at 6000
    FileStats.Snapshot s = stats(path);
    assertEquals(400, s.bytes);
    assertEquals(6100, s.maxOffset);
    assertEquals(0, s.bytesReread);
    assertEquals(3, s.sequential); // at 1000, 5000 and 6000; the read at 0 went backwards
  }

  @Test
  void excludedAndAnonymousStreamsAreIgnored() {
    read(new Object(), "/excluded/x.bin", 10, -1);
    read(new Object(), "/data/lib.jar", 10, -1);
    read(new Object(), null, 10, -1);
    assertNull(stats("/excluded/x.bin"));
    assertNull(stats("/data/lib.jar"));
  }

  @Test
  void aFailingSinkTurnsTheAgentOffAndIsReportedOnce() {
    IoBridge.start(
        (it, m, s, d, w, p, e) -> {
          throw new IllegalStateException("sink broke");
        },
        (where, t) -> failures.add(where + ": " + t.getMessage()));
    IoBridge.iteratorExit(IoBridge.iteratorEnter(), this, "next", null);
    assertFalse(IoBridge.isActive());
    assertNull(IoBridge.iteratorEnter());
    assertNull(IoBridge.readEnter());
    IoBridge.fail("again", new RuntimeException());
    assertEquals(List.of("stall: sink broke"), failures);
  }

  @Test
  void readsAreBatchedPerThreadAndFlushedExactly() {
    Object s = new Object();
    for (int i = 0; i < ThreadState.BATCH_CALLS * 3 + 5; i++) {
      read(s, path, 4096, -1);
    }
    read(s, path, -1, -1);
    IoBridge.seekExit(s, path, 0);
    read(s, path, 100, -1); // breaks the contiguous run: a batch of its own
    FileStats.Snapshot st = stats(path);
    long reads = ThreadState.BATCH_CALLS * 3 + 5;
    assertEquals(reads * 4096 + 100, st.bytes);
    assertEquals(reads + 2, st.readCalls);
    assertEquals(reads + 1, st.dataReads);
    assertEquals(reads, st.consecutive);
    assertEquals(reads, st.sequential);
    assertEquals(100, st.bytesReread);
    assertEquals(reads, st.sizeBuckets[2]);
    assertEquals(1, st.sizeBuckets[1]);
    assertEquals(100, st.minRequest);
    assertEquals(4096, st.maxRequest);
  }

  @Test
  void aBurstOfWritesBetweenWaitsIsOneCheckpointWithItsParent() {
    Object out = new Object();
    Object channel = new Object();
    String ckpt = path + ".ckpt";
    ThreadState ts = IoBridge.iteratorEnter(); // a training thread
    IoBridge.iteratorExit(ts, this, "next", null);
    for (int i = 0; i < 20; i++) {
      write(out, ckpt, 4096);
    }
    IoBridge.syncExit(IoBridge.writeEnter(), channel, ckpt);
    assertTrue(checkpoints.isEmpty(), "the burst is still open");
    IoBridge.iteratorExit(IoBridge.iteratorEnter(), this, "next", null); // the next step ends it
    assertEquals(1, checkpoints.size());
    Checkpoint c = checkpoints.get(0);
    assertEquals(ckpt, c.path);
    assertEquals(20 * 4096, c.bytes);
    assertEquals(20, c.writes);
    assertEquals(1, c.syncs);
    assertTrue(c.trainingThread);
    assertTrue(c.durationNanos >= c.writeNanos);
    assertEquals("parent-0", c.parent);
    FileStats.Snapshot st = stats(ckpt);
    assertEquals(20 * 4096, st.bytesWritten);
    assertEquals(20, st.writeCalls);
    assertEquals(1, st.syncs);
    assertEquals(20, st.writeBuckets[2]);
    assertEquals(2, st.writeOpens);
    assertEquals(0, st.bytes);
  }

  @Test
  void aFewWritesAreNotACheckpointAndAnotherFileEndsABurst() {
    String log = path + ".log";
    String ckpt = path + ".ckpt2";
    Object logStream = new Object();
    Object ckptStream = new Object();
    for (int i = 0; i < 3; i++) {
      write(logStream, log, 80);
    }
    for (int i = 0; i < 16; i++) {
      write(ckptStream, ckpt, 1000);
    }
    write(logStream, log, 80); // another file: ends the checkpoint's burst
    assertEquals(1, checkpoints.size());
    assertEquals(ckpt, checkpoints.get(0).path);
    assertEquals(16_000, checkpoints.get(0).bytes);
    read(new Object(), path, 10, -1); // a read ends the log's burst, which is too small
    IoBridge.flushThreads(true);
    assertEquals(1, checkpoints.size());
  }
}
