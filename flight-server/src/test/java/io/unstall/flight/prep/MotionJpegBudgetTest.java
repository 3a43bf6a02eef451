package io.unstall.flight.prep;

import static io.unstall.flight.prep.NativeJpegTest.BUDGET;
import static io.unstall.flight.prep.NativeJpegTest.ROOT;
import static io.unstall.flight.prep.NativeJpegTest.direct;
import static io.unstall.flight.prep.NativeJpegTest.rrc;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.unstall.flight.cache.Digest;
import io.unstall.flight.prep.ImagePrep.Decoder;
import io.unstall.flight.protocol.ProtocolFixturesTest;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.apache.arrow.memory.BufferAllocator;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Motion-JPEG frames in a decode memory that holds one frame's copy and decode but not two: prep threads take
 * turns (the copy and the decode are one reservation, the cache forms only try), so every frame is prepared as it
 * is alone, where holding the copy while waiting for the decode would have every thread wait out the timeout.
 */
class MotionJpegBudgetTest {
  static final String PIPELINE = rrc(16, "[0.08,1.0]", "[0.75,1.3333333333333333]", "uint8", "NHWC");
  static final int THREADS = 4;
  static final int SAMPLES = 24; // per thread
  static final long PAGE = 4096;

  static ByteBuffer frame;
  static ImageHeader header;

  @BeforeAll
  static void read() throws Exception {
    NativeJpegTest.loaded();
    frame = direct(Files.readAllBytes(ProtocolFixturesTest.FIXTURES.resolve("mjpeg-frame-v1.jpg")));
    header = ImageHeader.read(frame.duplicate());
    assertTrue(header.standardTables() != 0, "a frame without Huffman tables");
  }

  /** The copy's and the decode's bytes of the frame on {@code d}'s path, in whole pages: what one sample holds. */
  static long oneSample(Decoder d) {
    ImagePrep p = new ImagePrep(PrepPipeline.parse(PIPELINE), null, d, null);
    long working = d == Decoder.OPENCV ? p.workingBytes(header) : p.nativeWorkingBytes(header);
    long bytes = StandardHuffmanTables.copyBytes(header, frame.duplicate()) + working;
    return (bytes + PAGE - 1) / PAGE * PAGE;
  }

  static byte[] run(ImagePrep p, long sample) throws Exception {
    ByteBuffer out = ByteBuffer.allocateDirect((int) p.pipeline().sampleBytes());
    p.run(frame.duplicate(), Digest.of(frame.duplicate()), ImagePrep.rng(7, 0, sample), out);
    byte[] b = new byte[out.capacity()];
    out.get(b);
    return b;
  }

  /** The frame prepared on {@code d}'s path as sample {@code id}, alone in a roomy budget. */
  static byte[] alone(Decoder d, long id) throws Exception {
    return run(new ImagePrep(PrepPipeline.parse(PIPELINE), BUDGET, d, null), id);
  }

  /** Every thread prepares its samples with {@code p} at once; each sample's tensor by id. */
  static byte[][] concurrently(ImagePrep p) throws Exception {
    byte[][] got = new byte[THREADS * SAMPLES][];
    CyclicBarrier start = new CyclicBarrier(THREADS);
    ExecutorService pool = Executors.newFixedThreadPool(THREADS);
    try {
      List<Future<?>> fs = new ArrayList<>();
      for (int t = 0; t < THREADS; t++) {
        int first = t * SAMPLES;
        fs.add(pool.submit(() -> {
          start.await();
          for (int id = first; id < first + SAMPLES; id++) {
            got[id] = run(p, id);
          }
          return null;
        }));
      }
      for (Future<?> f : fs) {
        f.get(60, TimeUnit.SECONDS); // an ExhaustedException (the budget's timeout is 5 s) fails here
      }
    } finally {
      pool.shutdownNow();
    }
    return got;
  }

  /** Prepares the frames on {@code d}'s path (with the cache forms: {@code forms}) in a budget of one sample. */
  static void everyFrameIsPreparedAsAlone(Decoder d, boolean forms) throws Exception {
    long limit = oneSample(d);
    try (BufferAllocator decode = ROOT.newChildAllocator("decode-mjpeg", 0, limit);
        BufferAllocator reindexMem = ROOT.newChildAllocator("reindexed-mjpeg", 0, 16L << 20);
        BufferAllocator decodedMem = ROOT.newChildAllocator("decoded-mjpeg", 0, 16L << 20);
        ReindexedJpegs reindexed = new ReindexedJpegs(reindexMem);
        DecodedImages decoded = new DecodedImages(decodedMem)) {
      DecodeBudget budget = new DecodeBudget(decode, 5, TimeUnit.SECONDS);
      ImagePrep p = new ImagePrep(PrepPipeline.parse(PIPELINE), budget, d, forms ? reindexed : null,
          forms ? decoded : null);
      byte[][] got = concurrently(p);
      for (int id = 0; id < got.length; id++) {
        assertArrayEquals(alone(d, id), got[id], d + " sample " + id);
      }
      assertEquals(0, budget.reservedBytes(), "every reservation given back");
      assertTrue(budget.peakBytes() <= limit, "peak " + budget.peakBytes() + " of " + limit);
      assertEquals(limit, budget.largestRequest(), "the copy and the decode in one reservation");
    }
  }

  @Test
  void framesOnTheNativePathTakeTurnsInABudgetOfOne() throws Exception {
    everyFrameIsPreparedAsAlone(Decoder.NATIVE, false);
  }

  @Test
  void framesOnTheOpenCvPathTakeTurnsInABudgetOfOne() throws Exception {
    everyFrameIsPreparedAsAlone(Decoder.OPENCV, false);
  }

  @Test
  void framesWithTheCacheFormsTakeTurnsInABudgetOfOne() throws Exception {
    everyFrameIsPreparedAsAlone(Decoder.NATIVE, true);
  }

  @Test
  void aFrameWhoseCopyAndDecodeCouldNeverFitIsRefusedAtOnceNamingTheTotal() throws Exception {
    long total = oneSample(Decoder.NATIVE);
    try (BufferAllocator decode = ROOT.newChildAllocator("decode-mjpeg-small", 0, total - PAGE)) {
      DecodeBudget budget = new DecodeBudget(decode, 5, TimeUnit.SECONDS);
      ImagePrep p = new ImagePrep(PrepPipeline.parse(PIPELINE), budget, Decoder.NATIVE, null);
      BadImageException e = assertThrows(BadImageException.class, () -> run(p, 0));
      assertEquals("decoding the Motion-JPEG frame JPEG 32x24 (a copy of " + StandardHuffmanTables.copyBytes(header,
          frame.duplicate()) + " bytes with the standard Huffman tables, and its decode) takes about " + total
          + " bytes of native memory, more than the sidecar's decode memory of " + (total - PAGE)
          + " bytes (--decode-memory)", e.getMessage());
      assertEquals(0, budget.reservedBytes());
    }
  }
}
