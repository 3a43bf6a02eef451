package io.unstall.flight.prep;

import static org.awaitility.Awaitility.await;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.List;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.arrow.flight.CallStatus;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.flight.FlightStatusCode;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.types.pojo.ArrowType;
import org.apache.arrow.vector.types.pojo.Field;
import org.apache.arrow.vector.types.pojo.Schema;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** A group's staging: its size, what it holds until members are past it, and how it is freed. */
class StagingTest {
  static final Schema SCHEMA = new Schema(List.of(Field.nullable("pos", new ArrowType.Int(64, true))));

  /** A source of one-row batches (the row: their position) that says what they cost; no prep pool. */
  static class FakeSource implements BatchSource {
    final long batchBytes;
    final long workingBytes;
    final boolean parallel;
    volatile int parallelism;
    volatile int producers = Production.PRODUCERS;
    volatile long failAt = -1; // prepare throws at this position
    volatile Runnable onPrepare = () -> {};

    FakeSource(long batchBytes, long workingBytes, boolean parallel) {
      this.batchBytes = batchBytes;
      this.workingBytes = workingBytes;
      this.parallel = parallel;
    }

    @Override
    public String mode() {
      return "fake";
    }

    @Override
    public Schema schema() {
      return SCHEMA;
    }

    @Override
    public int producers() {
      return producers;
    }

    @Override
    public long batchBytes() {
      return batchBytes;
    }

    @Override
    public long workingBytes() {
      return workingBytes;
    }

    @Override
    public boolean parallel() {
      return parallel;
    }

    @Override
    public void parallelism(int n) {
      parallelism = n;
    }

    @Override
    public VectorSchemaRoot prepare(long pos, Staging staging) throws java.io.IOException {
      onPrepare.run();
      if (pos == failAt) {
        throw new java.io.IOException("cannot read batch " + pos);
      }
      return batch(pos, staging.allocator());
    }
  }

  static VectorSchemaRoot batch(long pos, BufferAllocator allocator) {
    VectorSchemaRoot r = VectorSchemaRoot.create(SCHEMA, allocator);
    BigIntVector v = (BigIntVector) r.getVector(0);
    v.allocateNew(1);
    v.set(0, pos);
    r.setRowCount(1);
    return r;
  }

  static PrepGroup.Settings settings(int window, long stagingBytes, boolean autotune) {
    return new PrepGroup.Settings(window, stagingBytes, 1_000_000_000L, 1, 0, false, autotune, false);
  }

  BufferAllocator root;
  GroupLock lock = new GroupLock();

  @BeforeEach
  void start() {
    root = new RootAllocator(1 << 20);
  }

  @AfterEach
  void stop() {
    root.close(); // throws if staging leaked memory
  }

  @Test
  void windowShrinksToWhatTheLimitHolds() {
    FakeSource s = new FakeSource(100, 50, false);
    Staging.Size size = Staging.size(s, settings(8, 400, false), 1 << 20, 4, 1);
    assertEquals(new Staging.Size(400, 3), size, "(400 - 50) / 100 batches");
    Staging.Size sized = Staging.size(s, settings(4, 0, false), 1 << 20, 4, 1);
    assertEquals(new Staging.Size(450, 4), sized, "the working bytes and four batches");
    Staging.Size tuned = Staging.size(s, settings(4, 0, true), 1 << 20, 4, 1);
    assertEquals(50 + 400 * Staging.AUTOTUNE_HEADROOM, tuned.limit(), "headroom for a tuned window");
  }

  @Test
  void stagingBeyondTheBudgetOrTooSmallForABatchIsRefused() {
    FakeSource s = new FakeSource(100, 50, false);
    FlightRuntimeException over = assertThrows(FlightRuntimeException.class,
        () -> Staging.size(s, settings(2, 2000, false), 1000, 4, 1));
    assertEquals(FlightStatusCode.RESOURCE_EXHAUSTED, over.status().code());
    assertTrue(over.getMessage().contains("exceeds the sidecar's prep staging budget of 1000"), over.getMessage());
    FlightRuntimeException small = assertThrows(FlightRuntimeException.class,
        () -> Staging.size(s, settings(2, 120, false), 1000, 4, 1));
    assertTrue(small.getMessage().contains("cannot hold one batch (150 bytes for batch_size 4"), small.getMessage());
  }

  @Test
  void uploadsGetTheirOwnDefault() {
    FakeSource uploads = new FakeSource(0, 0, false); // batch size known only as uploads arrive
    assertEquals(new Staging.Size(Staging.UPLOAD_STAGING, 3),
        Staging.size(uploads, settings(3, 0, false), 1L << 40, 4, 1));
    assertEquals(new Staging.Size(1000, 3), Staging.forUploads(settings(3, 0, false), 1000), "within the budget");
    assertEquals(new Staging.Size(700, 3), Staging.forUploads(settings(3, 700, false), 1000));
  }

  @Test
  void batchesStayUntilEveryMemberIsPastThem() {
    Staging st = new Staging("g", "prep-group-g", root, new Staging.Size(1 << 16, 4), null, lock);
    synchronized (lock) {
      st.put(0, batch(0, st.allocator()), 0, false);
      st.put(1, batch(1, st.allocator()), 0, false);
      st.put(2, batch(2, st.allocator()), 3, false); // every member is past it already: freed at once
      assertTrue(st.has(0) && st.has(1));
      assertFalse(st.has(2));
      FlightRuntimeException e = CallStatus.INTERNAL.withDescription("bad batch").toRuntimeException();
      st.fail(3, e);
      assertSame(e, st.failure(3));
      st.release(1);
      assertFalse(st.has(0), "below the slowest cursor");
      assertTrue(st.has(1));
      st.release(4);
      assertFalse(st.has(1));
      assertNull(st.failure(3), "a failure is forgotten once every member is past it");
      assertEquals(0, st.allocated());
    }
    st.free();
  }

  @Test
  void roomForAWindowIsWithinTheLimitAndTheBudget() {
    FakeSource s = new FakeSource(1000, 500, false);
    Staging st = new Staging("g", "prep-group-g", root, new Staging.Size(4500, 2), null, lock);
    assertEquals(4, st.maxWindow(s, 1), "(4500 - 500) / 1000");
    assertTrue(st.roomForWindow(4, s, 1));
    assertFalse(st.roomForWindow(5, s, 1));
    assertEquals(2, st.maxWindow(s, 2), "steps of two ranks' batches: (4500 - 500) / (2 x 1000)");
    assertTrue(st.roomForWindow(2, s, 2));
    assertFalse(st.roomForWindow(3, s, 2));
    st.free();
  }

  @Test
  void stagingHoldsAStepOfEveryRankOrIsRefusedNamingWhy() {
    FakeSource s = new FakeSource(100, 50, false);
    assertEquals(new Staging.Size(50 + 2 * 4 * 100, 2), Staging.size(s, settings(2, 0, false), 1 << 20, 4, 4),
        "default staging: two steps of four ranks' batches");
    assertEquals(new Staging.Size(500, 1), Staging.size(s, settings(2, 500, false), 1 << 20, 4, 4),
        "(500 - 50) / (4 x 100): one step");
    FlightRuntimeException small = assertThrows(FlightRuntimeException.class,
        () -> Staging.size(s, settings(2, 400, false), 1 << 20, 4, 4));
    assertEquals(FlightStatusCode.RESOURCE_EXHAUSTED, small.status().code());
    assertTrue(small.getMessage().contains("staging_bytes 400 cannot serve 4 data-parallel ranks: at each step they"
        + " read 4 batches, staged at once, of 100 bytes each (batch_size 4) beside 50 working bytes, 450 bytes in"
        + " all"), small.getMessage());

    Staging st = new Staging("g", "prep-group-g", root, new Staging.Size(500, 1), null, lock);
    st.checkHoldsStep(4, s, 4); // a later joiner of the same job size fits
    FlightRuntimeException five = assertThrows(FlightRuntimeException.class, () -> st.checkHoldsStep(5, s, 4));
    assertTrue(five.getMessage().contains("prep group g: staging_bytes 500 cannot serve 5 data-parallel ranks"),
        five.getMessage());
    st.checkHoldsStep(5, new FakeSource(0, 0, false), 4); // uploads: checked as batches arrive
    st.free();
  }

  @Test
  void freeWaitsForSendsStillHoldingBuffers() {
    AtomicBoolean kept = new AtomicBoolean(true);
    Staging st = new Staging("g", "prep-group-g", root, new Staging.Size(1 << 16, 4), null, lock,
        () -> kept.set(false));
    VectorSchemaRoot view;
    synchronized (lock) {
      st.put(0, batch(0, st.allocator()), 0, false);
      view = st.share(0);
    }
    Thread t = new Thread(st::free, "test-free");
    t.start();
    await().atMost(Duration.ofSeconds(10)).until(() -> t.getState() == Thread.State.TIMED_WAITING);
    assertTrue(kept.get(), "waiting for the send");
    view.close();
    synchronized (lock) {
      st.sent();
      lock.changed();
    }
    await().atMost(Duration.ofSeconds(10)).until(() -> !t.isAlive());
    assertFalse(kept.get(), "what was freed with staging is closed after the last send");
  }

  @Test
  void freeGivesUpOnASendThatNeverEndsAfterItsDeadline() {
    AtomicLong clock = new AtomicLong();
    AtomicBoolean kept = new AtomicBoolean(true);
    // Each look at the clock is ten seconds later: the 30 s for sends pass in a few looks.
    Staging st = new Staging("g", "prep-group-g", root, new Staging.Size(1 << 16, 4), null, lock,
        () -> clock.addAndGet(10_000_000_000L), () -> kept.set(false));
    synchronized (lock) {
      st.put(0, batch(0, st.allocator()), 0, false);
      st.share(0).close(); // a send whose end was never reported
    }
    st.free();
    assertFalse(kept.get());
    assertTrue(clock.get() >= 30_000_000_000L, "waited out the deadline on the clock");
  }
}
