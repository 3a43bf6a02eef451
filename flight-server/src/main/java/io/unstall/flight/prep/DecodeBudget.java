package io.unstall.flight.prep;

import io.unstall.flight.MemoryWait;
import java.util.ArrayDeque;
import java.util.concurrent.TimeUnit;
import org.apache.arrow.memory.AllocationReservation;
import org.apache.arrow.memory.BufferAllocator;

/**
 * The native memory of decodes in progress, counted in the sidecar's memory budget: a "decode" child of the
 * streams allocator ({@code --decode-memory}) in which every decode reserves its working bytes before OpenCV
 * allocates them (an Arrow reservation: accounted up the allocator tree, nothing allocated). When the reservation
 * does not fit (other decodes, or batches in flight, hold the memory) the prep thread waits, first come first
 * served, so N prep threads never decode N huge images at once beyond the budget. A sample that could never fit is
 * refused at once; one that waits longer than the timeout fails its batch with RESOURCE_EXHAUSTED.
 *
 * <p>A thread holds at most one reservation it waited for ({@link #acquire}), and waits holding none: a thread that
 * held part of the budget while waiting for more that only the others can give back would, with several threads
 * doing the same, wait until the timeout although each sample alone fits (hold-and-wait). So memory that lives
 * together is reserved in one {@link #acquire} (a Motion-JPEG frame's copy and its decode), {@link #acquire} on a
 * thread that holds a reservation is a programming error ({@link IllegalStateException}), and what a thread may
 * add while it holds one (the cache forms' working memory) only tries ({@link #tryAcquire}): taken if it fits now
 * and nobody waits, else done without.
 */
public final class DecodeBudget implements AutoCloseable {
  /** Reservations are made in whole pages. */
  private static final long PAGE = 4096;

  private final BufferAllocator alloc;
  private final long timeoutNanos;
  private final ArrayDeque<Object> queue = new ArrayDeque<>(); // guarded by this: waiters, first come first served
  private long waits; // guarded by this: decodes that had to wait
  private long maxRequest; // guarded by this
  /** Reservations the current thread holds (each closed on the thread that took it). */
  private final ThreadLocal<int[]> held = ThreadLocal.withInitial(() -> new int[1]);

  /** Reserves in {@code decode} (the data plane's "decode" child of streams; its limit is the budget). */
  public DecodeBudget(BufferAllocator decode, long timeout, TimeUnit unit) {
    this.alloc = decode;
    this.timeoutNanos = unit.toNanos(timeout);
  }

  public long limit() {
    return alloc.getLimit();
  }

  /** A decode's memory, given back on close. */
  public interface Reservation extends AutoCloseable {
    @Override
    void close();
  }

  /** Waited longer than the timeout for decode memory that other decodes or batches hold. */
  public static final class ExhaustedException extends RuntimeException {
    ExhaustedException(String message) {
      super(message);
    }
  }

  /**
   * Reserves {@code bytes} for the decode of the image {@code h} declares, waiting while other decodes or batches
   * in flight hold the memory. The thread must hold no reservation of this budget.
   */
  public Reservation acquire(long bytes, ImageHeader h) throws BadImageException, InterruptedException {
    return acquire(bytes, "the " + h.describe() + " image");
  }

  /**
   * {@link #acquire(long, ImageHeader)} for decoding {@code what} ("the JPEG 640x480 image"), the words of its
   * refusal and timeout.
   */
  public Reservation acquire(long bytes, String what) throws BadImageException, InterruptedException {
    if (held.get()[0] > 0) {
      throw new IllegalStateException("a thread that holds decode memory would wait for " + bytes + " bytes more to"
          + " decode " + what + ": hold-and-wait (prep threads could each hold part of the budget and wait for the"
          + " rest until the timeout); reserve what lives together in one acquire, and only tryAcquire while holding"
          + " one");
    }
    long need = pages(bytes);
    if (need > alloc.getLimit()) {
      throw new BadImageException("decoding " + what + " takes about " + need
          + " bytes of native memory, more than the sidecar's decode memory of " + alloc.getLimit()
          + " bytes (--decode-memory)");
    }
    long deadline = System.nanoTime() + timeoutNanos;
    Object me = new Object();
    synchronized (this) {
      maxRequest = Math.max(maxRequest, need);
      queue.addLast(me);
      AllocationReservation[] got = new AllocationReservation[1];
      boolean[] waited = new boolean[1];
      try {
        boolean fits = MemoryWait.until(this, deadline,
            () -> queue.peekFirst() == me && (got[0] = tryReserve(need)) != null, () -> {
              if (!waited[0]) {
                waited[0] = true;
                waits++;
              }
            });
        if (!fits) {
          throw new ExhaustedException("timed out after " + TimeUnit.NANOSECONDS.toSeconds(timeoutNanos)
              + " s waiting for " + need + " bytes of decode memory (" + alloc.getLimit() + " bytes,"
              + " --decode-memory) to decode " + what + " while other decodes or batches hold it");
        }
        return held(got[0]);
      } finally {
        queue.remove(me);
        notifyAll(); // the next in line may try
      }
    }
  }

  /**
   * Reserves {@code bytes} if they fit now and no decode waits (never ahead of the queue); null otherwise. Never
   * waits, so a thread may call it while it holds reservations: for memory a decode can do without.
   */
  public synchronized Reservation tryAcquire(long bytes) {
    long need = pages(bytes);
    maxRequest = Math.max(maxRequest, need);
    AllocationReservation r = queue.isEmpty() ? tryReserve(need) : null;
    return r == null ? null : held(r);
  }

  /** {@code bytes} in whole pages. */
  private static long pages(long bytes) {
    return (bytes + PAGE - 1) / PAGE * PAGE;
  }

  /** {@code r} as a reservation the current thread holds until it closes it. */
  private Reservation held(AllocationReservation r) {
    int[] count = held.get();
    count[0]++;
    return () -> {
      count[0]--;
      release(r);
    };
  }

  /**
   * A reservation of exactly {@code need} bytes, or null if it does not fit now. Arrow rounds each addition up to
   * a power of two, so the bytes are added one set bit at a time.
   */
  private AllocationReservation tryReserve(long need) {
    if (alloc.getHeadroom() < need) {
      return null; // (up the tree too) no partial reservation that others would see for a moment
    }
    AllocationReservation r = alloc.newReservation();
    for (long rest = need; rest != 0; rest &= rest - 1) {
      if (!r.add(Long.lowestOneBit(rest))) {
        r.close();
        return null;
      }
    }
    return r;
  }

  private synchronized void release(AllocationReservation r) {
    r.close();
    notifyAll();
  }

  /** Bytes reserved by decodes in progress. */
  public long reservedBytes() {
    return alloc.getAllocatedMemory();
  }

  public long peakBytes() {
    return alloc.getPeakMemoryAllocation();
  }

  public synchronized long waits() {
    return waits;
  }

  public synchronized long largestRequest() {
    return maxRequest;
  }

  /** Throws if a decode still holds memory (a leak). */
  @Override
  public void close() {
    // the "decode" allocator is the data plane's to close
  }
}
