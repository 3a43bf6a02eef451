package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.shm.SharedMemory;
import java.io.IOException;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;
import java.util.function.LongSupplier;
import org.apache.arrow.flight.CallStatus;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.BaseVariableWidthVector;
import org.apache.arrow.vector.FixedSizeBinaryVector;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VectorLoader;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.VectorUnloader;
import org.apache.arrow.vector.ipc.message.ArrowFieldNode;
import org.apache.arrow.vector.ipc.message.ArrowRecordBatch;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A group's bounded staging: its own child allocator (limit: the group's staging bytes), the prepared batches by
 * position until every member's cursor has passed them, the failures members are told about, the /dev/shm files of
 * shared-memory groups, and the sends still holding staged buffers. What may be prepared ahead is the window, in
 * steps of the widest rank job's world size ({@link Membership#aheadEnd}); the allocator's limit bounds the bytes
 * whatever the window, and holds at least one step ({@link #checkHoldsStep}). Guarded by the group lock, but for the
 * allocator, which sources allocate from as they prepare.
 */
final class Staging {
  private static final Logger LOG = LoggerFactory.getLogger(Staging.class);
  /** Default staging of groups whose batch size is known only when members upload (external groups). */
  static final long UPLOAD_STAGING = 256L << 20;

  /** The staging limit and window a group gets for what it asked and what a batch costs. */
  record Size(long limit, int window) {}

  private final String group;
  private final GroupLock lock;
  private final BufferAllocator alloc;
  private final long limit;
  private final ShmSlots slots; // the reused /dev/shm files of prepared tensors; null: ordinary Arrow memory
  private int window;
  private final TreeMap<Long, VectorSchemaRoot> staged = new TreeMap<>();
  private final Map<Long, FlightRuntimeException> failed = new HashMap<>();
  private final Map<Long, String> shmPaths = new HashMap<>();
  private int stagedPeak;
  private int inFlight; // sends holding views of staged batches
  private boolean freed;
  private final List<AutoCloseable> freedWith; // closed by free(), after the last send
  private final LongSupplier clock; // System::nanoTime but in tests

  /**
   * Sizes staging for a source and a first joiner of {@code world} data-parallel ranks (1: not a rank):
   * {@code staging_bytes} if given, else what {@code window} steps of {@code world} batches need (times
   * {@link #AUTOTUNE_HEADROOM} when the window is tuned; for uploads: {@link #UPLOAD_STAGING}), within the sidecar's
   * prep budget {@code parentLimit}; the window shrinks to the steps the limit holds, and a limit that cannot hold
   * one step ({@link #checkHoldsStep}) is refused.
   */
  static Size size(BatchSource source, PrepGroup.Settings requested, long parentLimit, int batchSize, int world) {
    long perBatch = source.batchBytes();
    long fixed = source.workingBytes();
    if (perBatch == 0) {
      return forUploads(requested, parentLimit);
    }
    long staging = within(parentLimit, requested.stagingBytes() > 0
        ? requested.stagingBytes()
        : Math.min(parentLimit, fixed + perBatch * requested.window() * world * headroom(requested)));
    checkHoldsStep("", staging, fixed, perBatch, world, "batch_size " + batchSize + source.describeOutput());
    return new Size(staging, (int) Math.max(1, Math.min(requested.window(), (staging - fixed) / (perBatch * world))));
  }

  /**
   * RESOURCE_EXHAUSTED unless {@code limit} holds {@code world} batches of {@code perBatch} bytes beside {@code
   * fixed} working bytes: the ranks of a data-parallel job read {@code world} consecutive batches at each step and
   * wait for each other there (DDP's allreduce), so a step's batches are staged at once. {@code batch}: what a batch
   * is, for the message ("batch_size 4, ..." or "an uploaded batch").
   */
  static void checkHoldsStep(String group, long limit, long fixed, long perBatch, int world, String batch) {
    if (fixed + perBatch * world <= limit) {
      return;
    }
    String prefix = "prep group" + (group.isEmpty() ? "" : " " + group) + ": staging_bytes " + limit;
    if (world == 1) {
      throw CallStatus.RESOURCE_EXHAUSTED.withDescription(prefix + " cannot hold one batch (" + (fixed + perBatch)
          + " bytes for " + batch + "); raise staging_bytes or lower batch_size").toRuntimeException();
    }
    throw CallStatus.RESOURCE_EXHAUSTED.withDescription(prefix + " cannot serve " + world + " data-parallel ranks:"
        + " at each step they read " + world + " batches, staged at once, of " + perBatch + " bytes each (" + batch
        + ")" + (fixed > 0 ? " beside " + fixed + " working bytes" : "") + ", " + (fixed + perBatch * world)
        + " bytes in all; raise staging_bytes, lower batch_size or use fewer ranks").toRuntimeException();
  }

  /**
   * Sizes staging for batches whose size is known only as members upload them: {@code staging_bytes} if given, else
   * {@link #UPLOAD_STAGING}; the window as asked (uploads wait for room in staging instead).
   */
  static Size forUploads(PrepGroup.Settings requested, long parentLimit) {
    long staging = requested.stagingBytes() > 0 ? requested.stagingBytes() : Math.min(parentLimit, UPLOAD_STAGING);
    return new Size(within(parentLimit, staging), requested.window());
  }

  private static long within(long parentLimit, long staging) {
    if (staging > parentLimit) {
      throw CallStatus.RESOURCE_EXHAUSTED.withDescription("prep group: staging_bytes " + staging
          + " exceeds the sidecar's prep staging budget of " + parentLimit + " bytes").toRuntimeException();
    }
    return staging;
  }

  /** How many times the window's batches default staging holds: room for the autotuner to grow the window. */
  static int headroom(PrepGroup.Settings requested) {
    return requested.tunesWindow() ? AUTOTUNE_HEADROOM : 1;
  }

  /** Default staging of a group whose window is tuned: this many times what its starting window needs. */
  static final int AUTOTUNE_HEADROOM = 2;
  /** The largest window ever. */
  static final int MAX_WINDOW = 1024;

  /**
   * {@code shm}: a shared-memory group's slot files (where, their pool, their size); null for ordinary memory.
   * {@code freedWith}: memory kept beside the staged batches, closed when staging is freed (after the last send).
   */
  Staging(String group, String allocatorName, BufferAllocator parent, Size size, ShmSlots.Files shm, GroupLock lock,
      AutoCloseable... freedWith) {
    this(group, allocatorName, parent, size, shm, lock, System::nanoTime, freedWith);
  }

  /** {@code clock}: {@link System#nanoTime}, or a fake one in tests (how long {@link #free} waits for sends). */
  Staging(String group, String allocatorName, BufferAllocator parent, Size size, ShmSlots.Files shm, GroupLock lock,
      LongSupplier clock, AutoCloseable... freedWith) {
    this.freedWith = List.of(freedWith);
    this.clock = clock;
    this.group = group;
    this.lock = lock;
    this.limit = size.limit();
    this.window = size.window();
    this.alloc = parent.newChildAllocator(allocatorName, 0, size.limit());
    this.slots = shm == null ? null : new ShmSlots(group, shm, alloc, lock);
  }

  /** A fresh /dev/shm directory for a shared-memory group, or null (none here, or it could not be made). */
  static Path sharedMemory(String group) {
    if (!SharedMemory.available()) {
      return null;
    }
    try {
      return SharedMemory.create(PrepService.SHM_PREFIX).dir();
    } catch (IOException e) {
      LOG.warn("prep group {}: no shared memory ({}); members get batches over Flight", group, e.toString());
      return null;
    }
  }

  BufferAllocator allocator() {
    return alloc;
  }

  long limit() {
    return limit;
  }

  /** Positions that may be prepared ahead of the slowest member. Caller holds the lock. */
  int window() {
    return window;
  }

  /** Sets the window (the autotuner). Caller holds the lock. */
  void window(int w) {
    window = w;
    lock.changed();
  }

  /** The largest window (steps of {@code world} batches, {@link Membership#aheadEnd}) this staging holds. */
  int maxWindow(BatchSource source, int world) {
    long perBatch = source.batchBytes();
    return perBatch == 0 ? MAX_WINDOW
        : (int) Math.max(1, Math.min(MAX_WINDOW, (limit - source.workingBytes()) / (perBatch * world)));
  }

  /**
   * Whether a window of {@code w} steps of {@code world} batches fits: its batches within this group's limit, and
   * one more batch within what the sidecar's prep budget (shared by every group) has left.
   */
  boolean roomForWindow(int w, BatchSource source, int world) {
    BufferAllocator parent = alloc.getParentAllocator();
    long pooled = slots == null ? 0 : slots.pooledBytes(); // freed when a group needs the memory
    return w <= maxWindow(source, world)
        && parent.getLimit() - parent.getAllocatedMemory() + pooled >= Math.max(source.batchBytes(), 1);
  }

  /**
   * RESOURCE_EXHAUSTED unless this staging holds a step of {@code world} ranks of {@code source}'s batches
   * ({@link #checkHoldsStep}); a source whose batch size is known only from uploads is checked as they arrive.
   */
  void checkHoldsStep(int world, BatchSource source, int batchSize) {
    if (source.batchBytes() > 0) {
      checkHoldsStep(group, limit, source.workingBytes(), source.batchBytes(), world,
          "batch_size " + batchSize + source.describeOutput());
    }
  }

  boolean shm() {
    return slots != null;
  }

  long allocated() {
    return alloc.getAllocatedMemory();
  }

  boolean has(long pos) {
    return staged.containsKey(pos);
  }

  VectorSchemaRoot get(long pos) {
    return staged.get(pos);
  }

  String shmPath(long pos) {
    return shmPaths.get(pos);
  }

  FlightRuntimeException failure(long pos) {
    return failed.get(pos);
  }

  /** Members asking for {@code pos} get this error. Caller holds the lock. */
  void fail(long pos, FlightRuntimeException e) {
    failed.put(pos, e);
    unstaged(pos);
    lock.changed();
  }

  /**
   * Stages a prepared batch, or frees it when nobody will read it (every member past it, or the group closed).
   * Caller holds the lock.
   */
  void put(long pos, VectorSchemaRoot root, long minCursor, boolean closed) {
    if (closed || pos < minCursor) {
      root.close();
      unstaged(pos);
    } else {
      staged.put(pos, root);
      stagedPeak = Math.max(stagedPeak, staged.size());
    }
    lock.changed();
  }

  /**
   * Takes an uploaded batch's buffers into this allocator (and, for a shared-memory group, its tensor into a
   * /dev/shm file) and stages it; returns its rows, or -1 when /dev/shm could not take it (nothing staged).
   * Caller holds the lock.
   */
  int adopt(VectorSchemaRoot in, long pos, long minCursor, int sampleBytes) {
    VectorSchemaRoot copy = VectorSchemaRoot.create(in.getSchema(), alloc);
    for (int i = 0; i < in.getFieldVectors().size(); i++) {
      in.getVector(i).makeTransferPair(copy.getVector(i)).transfer();
    }
    copy.setRowCount(in.getRowCount());
    if (slots != null) {
      try {
        FixedSizeBinaryVector tensor = (FixedSizeBinaryVector) copy.getVector(PrepSchema.TENSOR);
        toSlot(tensor, pos, copy.getRowCount(), (long) copy.getRowCount() * sampleBytes, true);
      } catch (IOException | RuntimeException e) { // /dev/shm full
        copy.close();
        unstaged(pos);
        LOG.warn("prep group {}: batch at {} could not be staged in shared memory ({})", group, pos, e.toString());
        return -1;
      }
    }
    int rows = copy.getRowCount();
    put(pos, copy, minCursor, false);
    return rows;
  }

  /**
   * Gives the tensor column of a batch being prepared at {@code pos} its buffers: ordinary memory, or a slot of
   * {@link ShmSlots} (a /dev/shm file mapped here, reused, counted by the staging allocator like any other). Called
   * without the lock.
   */
  void allocateTensor(FixedSizeBinaryVector tensor, long pos, int n, long sampleBytes) throws IOException {
    if (slots == null) {
      tensor.allocateNew(n);
      return;
    }
    toSlot(tensor, pos, n, (long) n * sampleBytes, false);
  }

  /**
   * Gives the payload column of a raw or hybrid batch being prepared at {@code pos} its buffers for {@code n} rows of
   * {@code bytes} in all: ordinary memory, or a slot of {@link ShmSlots} for its bytes (as {@link #allocateTensor}).
   * The caller writes the offsets, the valid bits and the bytes ({@code BatchAssembler.assemble},
   * {@link RawBatches#restage}). Called without the lock.
   */
  void allocatePayload(VarBinaryVector payload, long pos, int n, long bytes) throws IOException {
    if (slots == null) {
      payload.allocateNew(bytes, n);
      return;
    }
    ShmSlots.Tensor t = slots.take(pos, bytes);
    try (ArrowBuf data = t.data();
        ArrowBuf offsets = alloc.buffer((long) (n + 1) * BaseVariableWidthVector.OFFSET_WIDTH);
        ArrowBuf validity = alloc.buffer(Math.max(8, (n + 7) / 8))) {
      offsets.setZero(0, offsets.capacity()); // the first offset; the writer sets the others and the valid bits
      validity.setZero(0, validity.capacity());
      payload.loadFieldBuffers(new ArrowFieldNode(n, 0), List.of(validity, offsets, data)); // no nulls: all valid
    }
    synchronized (lock) {
      shmPaths.put(pos, t.path());
    }
  }

  /**
   * Loads {@code tensor} with {@code n} rows ({@code bytes}) over a slot taken for {@code pos}; {@code keep}: its
   * bytes and validity so far (an uploaded batch) are copied in, else it is left to be written (a batch being
   * prepared).
   */
  private void toSlot(FixedSizeBinaryVector tensor, long pos, int n, long bytes, boolean keep) throws IOException {
    ShmSlots.Tensor t = slots.take(pos, bytes);
    try (ArrowBuf data = t.data();
        ArrowBuf validity = alloc.buffer(Math.max(8, (n + 7) / 8))) {
      validity.setZero(0, validity.capacity());
      int nulls = 0;
      if (keep) {
        data.setBytes(0, tensor.getDataBuffer(), 0, bytes);
        validity.setBytes(0, tensor.getValidityBuffer(), 0, (n + 7) / 8);
        nulls = tensor.getNullCount();
      }
      tensor.loadFieldBuffers(new ArrowFieldNode(n, nulls), List.of(validity, data));
    }
    synchronized (lock) {
      shmPaths.put(pos, t.path());
    }
  }

  /**
   * A member got the /dev/shm file of the batch at {@code pos} ({@code reports}: it says when it lets go,
   * {@link #releasedBy}). Caller holds the lock.
   */
  void mapped(long pos, long member, boolean reports) {
    if (slots != null) {
      slots.mapped(pos, member, reports);
    }
  }

  /** The member let go of its mapping of the batch at {@code pos}. Caller holds the lock. */
  void releasedBy(long member, long pos) {
    if (slots != null) {
      slots.released(pos, member);
    }
  }

  /** A member left or was dropped: the slots it may still map are never written again. Caller holds the lock. */
  void memberGone(long member) {
    if (slots != null) {
      slots.memberGone(member);
    }
  }

  /** Allocated bytes that the next batches reuse (free slots). Caller holds the lock. */
  long reusableBytes() {
    return slots == null ? 0 : slots.reusableBytes();
  }

  /** Frees memory a member still maps so staging has room (see {@link ShmSlots#reclaim}). Caller holds the lock. */
  boolean reclaim() {
    return slots != null && slots.reclaim();
  }

  private void unstaged(long pos) {
    if (slots != null) {
      slots.unstaged(pos);
    }
  }

  /**
   * A root over the staged batch's buffers (reference counted), for one send without copies; the send ends with
   * {@link #sent}. Caller holds the lock.
   */
  VectorSchemaRoot share(long pos) {
    VectorSchemaRoot src = staged.get(pos);
    VectorSchemaRoot view = VectorSchemaRoot.create(src.getSchema(), alloc);
    try (ArrowRecordBatch rb = new VectorUnloader(src).getRecordBatch()) {
      new VectorLoader(view).load(rb);
    }
    inFlight++;
    return view;
  }

  /** A send started by {@link #share} is over. Caller holds the lock. */
  void sent() {
    inFlight--;
  }

  /** Frees every staged batch below {@code minCursor} (every member is past it), and its failures. */
  void release(long minCursor) {
    while (!staged.isEmpty() && staged.firstKey() < minCursor) {
      long pos = staged.firstKey();
      shmPaths.remove(pos);
      staged.pollFirstEntry().getValue().close();
      unstaged(pos);
    }
    failed.keySet().removeIf(p -> p < minCursor);
  }

  /** Waits for sends still holding staged buffers, then frees everything and closes the allocator (once). */
  void free() {
    synchronized (lock) {
      if (freed) {
        return;
      }
      freed = true;
      long deadline = clock.getAsLong() + TimeUnit.SECONDS.toNanos(30);
      while (inFlight > 0 && clock.getAsLong() < deadline) {
        try {
          lock.await(10);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          break;
        }
      }
      staged.values().forEach(VectorSchemaRoot::close);
      staged.clear();
      shmPaths.clear();
      if (slots != null) {
        slots.close();
      }
    }
    for (AutoCloseable c : freedWith) {
      try {
        c.close();
      } catch (Exception e) {
        LOG.warn("prep group {}: {}", group, e.getMessage());
      }
    }
    // sends write from the staged buffers themselves (zero copy): gRPC lets go of the last ones once written
    long until = clock.getAsLong() + TimeUnit.SECONDS.toNanos(5);
    while (alloc.getAllocatedMemory() > 0 && clock.getAsLong() < until) {
      LockSupport.parkNanos(TimeUnit.MILLISECONDS.toNanos(5));
    }
    try {
      alloc.close();
    } catch (RuntimeException e) {
      LOG.warn("prep group {}: {}", group, e.getMessage());
    }
  }

  /** Caller holds the lock. */
  void stats(ObjectNode o, boolean closed) {
    o.put("window", window);
    o.put("staging_limit_bytes", limit);
    o.put("staging_allocated_bytes", closed ? 0 : alloc.getAllocatedMemory());
    o.put("staging_peak_bytes", alloc.getPeakMemoryAllocation());
    o.put("staged_batches", staged.size());
    o.put("staged_batches_peak", stagedPeak);
    if (slots != null) {
      slots.stats(o);
    }
  }
}
