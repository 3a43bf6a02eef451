package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.shm.ShmBuffer;
import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayDeque;
import java.util.Iterator;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.ForeignAllocation;
import org.apache.arrow.memory.OutOfMemoryException;

/**
 * The sidecar's free /dev/shm slot files ({@link ShmSlots}), handed from a closing group to the next group whose
 * batches are the same size: a hyper-parameter search starts and stops a group per trial, and a fresh file costs a
 * page fault and a zeroed page per 4 KiB on every batch it holds, where a file that is already there costs
 * nothing. Only files nobody maps any more come here (a slot a member may still
 * map is retired, never pooled). A pooled file is counted in the prep allocator (the groups' parent) while it waits,
 * at most {@link #MAX_FILES} of them, each for at most {@link #IDLE_NANOS}, and only while the prep allocator stays
 * at most half full with it; a new group keeps only the files it can use ({@link #keepOnly}), and a group that
 * cannot get its memory empties the pool first ({@link #drain}). One per {@link PrepService}; thread-safe.
 */
final class SlotPool implements AutoCloseable {
  static final int MAX_FILES = 8;
  static final long IDLE_NANOS = 30_000_000_000L;

  private record Pooled(ShmBuffer shm, ArrowBuf counted, long since) {}

  private final BufferAllocator prep;
  private final ArrayDeque<Pooled> files = new ArrayDeque<>();
  private long nextId;
  private long reused;
  private long discarded;
  private boolean closed;

  SlotPool(BufferAllocator prep) {
    this.prep = prep;
  }

  /**
   * Accounts for a slot file's memory in an allocator without owning the mapping: when the last reference goes,
   * {@code onRelease} decides what becomes of the file (the next group, or unlinked).
   */
  static final class Lease extends ForeignAllocation {
    private final Runnable onRelease;

    Lease(ShmBuffer shm, Runnable onRelease) {
      super(shm.getSize(), shm.address());
      this.onRelease = onRelease;
    }

    @Override
    protected void release0() {
      onRelease.run();
    }
  }

  /** A pooled file of exactly {@code size} bytes, now the caller's (to {@link #offer} back or discard), or null. */
  synchronized ShmBuffer take(long size) {
    for (Iterator<Pooled> it = files.iterator(); it.hasNext(); ) {
      Pooled p = it.next();
      if (p.shm().getSize() == size) {
        it.remove();
        reused++;
        p.counted().close(); // its Lease does nothing: the file changes hands
        return p.shm();
      }
    }
    return null;
  }

  /** A new slot file in {@code dir}, named by a sidecar-wide counter. */
  ShmBuffer create(Path dir, long size) throws IOException {
    long id;
    synchronized (this) {
      id = nextId++;
    }
    return ShmBuffer.create(dir.resolve("slot-" + id), size, false);
  }

  /** Keeps a file that no member maps for the next group, or unlinks it (pool full or closed, no room). */
  synchronized void offer(ShmBuffer shm) {
    if (!closed && files.size() < MAX_FILES && prep.getAllocatedMemory() + shm.getSize() <= prep.getLimit() / 2) {
      try {
        files.addLast(new Pooled(shm, prep.wrapForeignAllocation(new Lease(shm, () -> { })), System.nanoTime()));
        return;
      } catch (OutOfMemoryException e) {
        // the prep budget is in use: not worth keeping
      }
    }
    discarded++;
    shm.discard();
  }

  /** Unlinks every pooled file (memory is needed, or the sidecar stops). */
  synchronized void drain() {
    while (!files.isEmpty()) {
      discard(files.pollFirst());
    }
  }

  /**
   * A group was made: keeps the files of its slot size ({@code slotBytes}; 0 for a group without shared memory, which
   * can use none) and unlinks the others, so the memory they hold is free for it.
   */
  synchronized void keepOnly(long slotBytes) {
    for (Iterator<Pooled> it = files.iterator(); it.hasNext(); ) {
      Pooled p = it.next();
      if (p.shm().getSize() != slotBytes) {
        it.remove();
        discard(p);
      }
    }
  }

  /** Unlinks files pooled for longer than {@link #IDLE_NANOS}. */
  synchronized void expire(long now) {
    while (!files.isEmpty() && now - files.peekFirst().since() > IDLE_NANOS) {
      discard(files.pollFirst());
    }
  }

  /** Bytes of pooled files (counted in the prep allocator, freed on demand). */
  synchronized long bytes() {
    long b = 0;
    for (Pooled p : files) {
      b += p.shm().getSize();
    }
    return b;
  }

  private void discard(Pooled p) {
    discarded++;
    p.counted().close();
    p.shm().discard();
  }

  @Override
  public synchronized void close() {
    closed = true;
    drain();
  }

  synchronized void stats(ObjectNode o) {
    ObjectNode n = o.putObject("shm_slot_pool");
    n.put("files", files.size());
    n.put("bytes", bytes());
    n.put("handed_to_a_new_group", reused);
    n.put("discarded", discarded);
  }
}
