package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.shm.ShmBuffer;
import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayDeque;
import java.util.HashMap;
import java.util.Iterator;
import java.util.Map;
import java.util.TreeMap;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.OutOfMemoryException;

/**
 * The /dev/shm files that hold a shared-memory group's batch tensors, reused batch after batch. A fresh tmpfs file
 * costs a page fault, a zeroed page and, on the member's side, another fault per 4 KiB page, every batch: more CPU
 * than resampling the batch. A slot is written again only once the batch in it is no longer staged <em>and</em>
 * every member that mapped it said it let go of it ({@code prep.next}'s {@code "released"}: the shim reports a
 * batch when its last array or tensor view is gone). A slot that a member may still map and will not report
 * (a member that left or was dropped, a shim that does not report) is never written again: it is retired (its
 * file unlinked; the member keeps its pages until it unmaps, as with a file per batch). So a member never sees a
 * batch change under a tensor it holds. Slots count against the staging allocator like any other tensor buffer;
 * when staging needs room, the oldest slot still held by a member (its batch already freed) is retired. When the
 * group closes, its free slots go to the sidecar's {@link SlotPool} for the next group (and new slots come from it
 * first). Guarded by the group lock, except {@link #create}'s file work.
 */
final class ShmSlots {
  /** Free slots kept beyond this many go to the pool (a slot is a whole batch). */
  static final int MAX_FREE = 4;

  /** Where a group's slot files are made ({@code dir}), where they come from and go ({@code pool}), their size. */
  record Files(Path dir, SlotPool pool, long slotBytes) {}

  private static final class Slot {
    final ShmBuffer shm;
    ArrowBuf buf; // this group's own reference (a SlotPool.Lease); a staged batch's tensor holds another
    long pos = -1; // the batch in it; -1 while free
    boolean staged; // the batch is still staged
    boolean unreported; // a member that does not report releases mapped it: retire once unstaged
    volatile boolean reusable; // nobody maps it: when its last reference goes, it goes to the pool, not unlinked
    final Map<Long, Integer> holders = new HashMap<>(); // member -> mappings not yet released

    Slot(ShmBuffer shm) {
      this.shm = shm;
    }
  }

  private final String group;
  private final Files files;
  private final BufferAllocator alloc;
  private final Object lock;
  private final TreeMap<Long, Slot> byPos = new TreeMap<>();
  private final ArrayDeque<Slot> free = new ArrayDeque<>();
  private long created;
  private long fromPool;
  private long reused;
  private long retired;
  private boolean closed;

  ShmSlots(String group, Files files, BufferAllocator alloc, Object lock) {
    this.group = group;
    this.files = files;
    this.alloc = alloc;
    this.lock = lock;
  }

  /**
   * A slot for the batch at {@code pos}: a free one, or a file from the pool or new. Returns a buffer of {@code bytes}
   * (at most a slot) over it for the batch's tensor (the vector that loads it holds its own reference) and the path.
   */
  Tensor take(long pos, long bytes) throws IOException {
    Slot s;
    synchronized (lock) {
      s = null;
      for (Iterator<Slot> it = free.iterator(); it.hasNext() && s == null; ) {
        Slot f = it.next();
        if (f.buf.getReferenceManager().getRefCount() == 1) { // no send still holds a view of its last batch
          it.remove();
          s = f;
        }
      }
      if (s != null) {
        reused++;
        s.pos = pos;
        s.staged = true;
        byPos.put(pos, s);
      }
    }
    if (s == null) {
      s = create(pos);
    }
    s.buf.getReferenceManager().retain(); // the caller's reference: it closes the slice once a vector holds it
    return new Tensor(s.buf.slice(0, bytes), s.shm.path().toString());
  }

  /** A batch's tensor buffer in a slot (one reference, the caller's to close), and the slot's file. */
  record Tensor(ArrowBuf data, String path) {}

  private Slot create(long pos) throws IOException {
    ShmBuffer shm = files.pool().take(files.slotBytes());
    boolean pooled = shm != null;
    if (shm == null) {
      shm = files.pool().create(files.dir(), files.slotBytes());
    }
    Slot s = new Slot(shm);
    try {
      s.buf = lease(s);
    } catch (OutOfMemoryException e) { // the budget may be held by pooled files: free them and try once more
      files.pool().drain();
      try {
        s.buf = lease(s);
      } catch (RuntimeException again) {
        shm.discard();
        throw again;
      }
    } catch (RuntimeException e) {
      shm.discard();
      throw e;
    }
    synchronized (lock) {
      if (closed) { // the group closed while this file was made
        s.buf.close();
        throw new IOException("prep group " + group + " closed");
      }
      created++;
      fromPool += pooled ? 1 : 0;
      s.pos = pos;
      s.staged = true;
      byPos.put(pos, s);
    }
    return s;
  }

  /** A member mapped the batch at {@code pos}; {@code reports}: it will say when it lets go. Caller holds the lock. */
  void mapped(long pos, long member, boolean reports) {
    Slot s = byPos.get(pos);
    if (s == null) {
      return;
    }
    if (reports) {
      s.holders.merge(member, 1, Integer::sum);
    } else {
      s.unreported = true;
    }
  }

  /** The member let go of its mapping of the batch at {@code pos}. Caller holds the lock. */
  void released(long pos, long member) {
    Slot s = byPos.get(pos);
    if (s == null) {
      return;
    }
    Integer n = s.holders.get(member);
    if (n != null) {
      if (n <= 1) {
        s.holders.remove(member);
      } else {
        s.holders.put(member, n - 1);
      }
      settle(s);
    }
  }

  /** The batch at {@code pos} is no longer staged (read by all, failed, or dropped). Caller holds the lock. */
  void unstaged(long pos) {
    Slot s = byPos.get(pos);
    if (s != null) {
      s.staged = false;
      settle(s);
    }
  }

  /** A member left or was dropped: what it still maps is never written again. Caller holds the lock. */
  void memberGone(long member) {
    for (Iterator<Slot> it = byPos.values().iterator(); it.hasNext(); ) {
      Slot s = it.next();
      if (s.holders.remove(member) != null) {
        if (s.staged) {
          s.unreported = true; // staged for the others still: retire once they are past it
        } else {
          it.remove();
          retire(s);
        }
      }
    }
  }

  /** Bytes of the sidecar's pooled files: counted in the prep allocator, freed when a group needs the memory. */
  long pooledBytes() {
    return files.pool().bytes();
  }

  /** Bytes of free slots: allocated, but the next batches reuse them. Caller holds the lock. */
  long reusableBytes() {
    long b = 0;
    for (Slot s : free) {
      b += s.shm.getSize();
    }
    return b;
  }

  /**
   * Retires the oldest slot whose batch is freed but that a member still maps, so staging has room again; false
   * when there is none. Caller holds the lock.
   */
  boolean reclaim() {
    for (Iterator<Slot> it = byPos.values().iterator(); it.hasNext(); ) {
      Slot s = it.next();
      if (!s.staged) {
        it.remove();
        retire(s);
        return true;
      }
    }
    return false;
  }

  /** Retires every slot a member may still map, and pools the free ones (the group closed). Caller holds the lock. */
  void close() {
    closed = true;
    byPos.values().forEach(this::retire);
    byPos.clear();
    free.forEach(this::toPool);
    free.clear();
  }

  private void settle(Slot s) {
    if (s.staged || !s.holders.isEmpty()) {
      return;
    }
    byPos.remove(s.pos);
    if (s.unreported) {
      retire(s);
    } else if (closed || free.size() >= MAX_FREE) {
      toPool(s);
    } else {
      s.pos = -1;
      s.unreported = false;
      free.addLast(s);
    }
  }

  /** The slot's memory, counted in this group's allocator; when the last reference goes, the file is pooled or not. */
  private ArrowBuf lease(Slot s) {
    return alloc.wrapForeignAllocation(new SlotPool.Lease(s.shm, () -> {
      if (s.reusable) {
        files.pool().offer(s.shm);
      } else {
        s.shm.discard(); // unlinked: members that still map it keep its pages
      }
    }));
  }

  /** Drops this group's reference: the file goes when the last tensor over it does; mappings stay valid. */
  private void retire(Slot s) {
    retired++;
    s.reusable = false;
    s.buf.close();
  }

  /** A free slot nobody maps (the group closed, or it has too many): to the sidecar's files.pool(). */
  private void toPool(Slot s) {
    s.reusable = true;
    s.buf.close();
  }

  /** Caller holds the lock. */
  void stats(ObjectNode o) {
    ObjectNode n = o.putObject("shm_slots");
    n.put("files", byPos.size() + free.size());
    n.put("free", free.size());
    n.put("held", byPos.values().stream().filter(s -> !s.staged).count());
    n.put("created", created);
    n.put("from_pool", fromPool);
    n.put("reused", reused);
    n.put("retired", retired);
  }
}
