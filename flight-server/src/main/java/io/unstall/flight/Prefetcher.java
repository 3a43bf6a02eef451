package io.unstall.flight;

import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.dataset.DatasetStats;
import java.io.IOException;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Clairvoyant prefetch (NoPFS): the shim sends the epoch's sample order (derived from the sampler's seed) and
 * this reads upcoming misses from storage ahead of consumption, with parallel reads, at most a window ahead:
 * {@code windowSamples} beyond the samples already served this epoch, and {@code windowBytes} of staged data
 * (its own child allocator: the bytes are part of the sidecar's budget). Bytes read are offered to the
 * caches; what the caches do not take is staged until the batch that needs it is assembled, then freed.
 *
 * <p>Every staged sample is a future in {@code staged}, and whoever removes it from the map owns it: the batch
 * that takes it, or whoever drops the plan's staging. Its owner copies from the buffer or closes it, never
 * both parties. Every future completes (a slot whose allocation or read fails completes with null, and the
 * batch reads the sample itself), and a batch waits for prefetched samples at most {@link #TAKE_DEADLINE}.
 */
public final class Prefetcher implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(Prefetcher.class);
  /** How long a batch waits, in all, for its prefetched samples; then it reads the rest from storage. */
  public static final java.time.Duration TAKE_DEADLINE = java.time.Duration.ofSeconds(30);

  /**
   * Reads sample {@code id} of {@code epoch} into {@code buf} (from its owner in a cluster, else storage) and
   * offers bytes read from storage to the caches, counting into {@code stats}.
   */
  interface Source {
    void read(Dataset d, long epoch, int id, ArrowBuf buf, int len, DatasetStats.Epoch stats) throws IOException;
  }

  /** Whether a sample is already held by a cache tier. */
  interface Cached {
    boolean test(Dataset d, int id);
  }

  /** A staged sample of one plan owner (a session, or a dataset for Flight clients without one). */
  private record Key(String owner, int id) {}

  /** One owner's current epoch plan: its driver and which ids batches have already served. */
  private static final class Plan {
    final long epoch;
    final java.util.concurrent.atomic.AtomicLongArray served;
    final AtomicBoolean warnedLate = new AtomicBoolean();
    volatile Future<?> driver;

    Plan(long epoch, int size) {
      this.epoch = epoch;
      this.served = new java.util.concurrent.atomic.AtomicLongArray((size + 63) / 64);
    }

    void markServed(int id) {
      long bit = 1L << (id & 63);
      served.getAndUpdate(id >>> 6, w -> w | bit);
    }

    boolean isServed(int id) {
      return (served.get(id >>> 6) & (1L << (id & 63))) != 0;
    }
  }

  private final BufferAllocator allocator;
  private final ExecutorService readers;
  private final ExecutorService drivers;
  private final int windowSamples;
  private final Source source;
  private final Cached cached;
  private final Map<Key, CompletableFuture<ArrowBuf>> staged = new ConcurrentHashMap<>();
  private final Map<String, Plan> plans = new ConcurrentHashMap<>();

  /**
   * Stages in {@code allocator}: the data plane's "prefetch" child, whose limit is the window's bytes
   * ({@code --prefetch-window-bytes}; 0 turns prefetch off). The allocator is its builder's to close.
   */
  Prefetcher(BufferAllocator allocator, int windowSamples, int threads, Source source, Cached cached) {
    this.allocator = allocator;
    this.windowSamples = windowSamples;
    this.readers = Executors.newFixedThreadPool(Math.max(1, threads), daemon("unstall-prefetch-read"));
    this.drivers = Executors.newCachedThreadPool(daemon("unstall-prefetch-plan"));
    this.source = source;
    this.cached = cached;
  }

  static java.util.concurrent.ThreadFactory daemon(String name) {
    AtomicInteger n = new AtomicInteger();
    return r -> {
      Thread t = new Thread(r, name + "-" + n.incrementAndGet());
      t.setDaemon(true);
      return t;
    };
  }

  /** Refuses a plan of {@code n} ids over {@code maxIds} ({@code --max-plan-ids}), before its ids are read. */
  public static void checkPlanSize(long n, int maxIds) {
    if (n > maxIds) {
      throw new PlanTooLargeException("a prefetch plan of " + n + " ids exceeds the sidecar's --max-plan-ids "
          + maxIds + "; send a shorter plan (one epoch's order) or raise --max-plan-ids");
    }
  }

  /**
   * A plan's ids checked against its dataset: at most {@code maxIds} ({@code --max-plan-ids}), at most as many as
   * the dataset has samples (a plan is one epoch's order), each in range.
   */
  public static int[] checkedPlan(Dataset d, long[] requested, int maxIds) {
    checkPlanSize(requested.length, maxIds);
    if (requested.length > d.size()) {
      throw new IllegalArgumentException("a prefetch plan of " + requested.length + " ids for dataset '" + d.name()
          + "', which has " + d.size() + " samples: a plan is one epoch's order, at most one id per sample");
    }
    int[] ids = new int[requested.length];
    for (int i = 0; i < ids.length; i++) {
      ids[i] = d.checkId(requested[i]);
    }
    return ids;
  }

  /** A plan over {@code --max-plan-ids}: RESOURCE_EXHAUSTED. */
  public static final class PlanTooLargeException extends RuntimeException {
    PlanTooLargeException(String message) {
      super(message);
    }
  }

  public boolean enabled() {
    return allocator.getLimit() > 0 && windowSamples > 0;
  }

  /**
   * Starts prefetching {@code ids} (the epoch's order of {@code d}) for {@code owner} (a session id, or the
   * dataset's name for Flight clients), replacing that owner's previous plan. The window counts the samples
   * served to {@code stats} (the owner's counters).
   */
  public void plan(Dataset d, String owner, DatasetStats stats, long epoch, int[] ids) {
    if (!enabled()) {
      throw new IllegalArgumentException(
          "prefetch is disabled on this sidecar (--prefetch-window 0); start it with a prefetch window");
    }
    Plan plan = new Plan(epoch, d.size());
    Plan old = plans.put(owner, plan);
    if (old != null) {
      old.driver.cancel(true);
      dropStaged(owner); // what the last epoch staged but never served
    }
    plan.driver = drivers.submit(() -> drive(d, owner, stats, plan, ids));
    LOG.info("dataset '{}' ({}) epoch {}: prefetching {} samples, window {} samples / {} bytes", d.name(), owner,
        epoch, ids.length, windowSamples, allocator.getLimit());
  }

  /** Stops {@code owner}'s plan and frees what it staged (its session ended). */
  public void cancel(String owner) {
    Plan old = plans.remove(owner);
    if (old != null) {
      old.driver.cancel(true);
      dropStaged(owner);
    }
  }

  /**
   * Walks the plan ahead of consumption. A sample is read either here or by the batch that needs it, never
   * both: a batch marks the id served before it looks for staging, and this claims staging before it
   * checks the mark again (see {@link #take}).
   */
  private void drive(Dataset d, String owner, DatasetStats counters, Plan plan, int[] ids) {
    long epoch = plan.epoch;
    DatasetStats.Epoch stats = counters.epoch(epoch);
    try {
      for (int p = 0; p < ids.length; p++) {
        int id = ids[p];
        Key key = new Key(owner, id);
        if (plan.isServed(id) || cached.test(d, id) || staged.containsKey(key)) {
          continue;
        }
        int len = d.length(id);
        long cost = allocator.getRoundingPolicy().getRoundedSize(Math.max(1, len));
        if (cost > allocator.getLimit()) {
          continue; // larger than the whole window: the batch will read it itself
        }
        while (p - stats.servedSamples() > windowSamples
            || allocator.getAllocatedMemory() + cost > allocator.getLimit()) {
          Thread.sleep(1);
        }
        CompletableFuture<ArrowBuf> f = new CompletableFuture<>();
        if (staged.putIfAbsent(key, f) != null || (plan.isServed(id) && staged.remove(key, f))) {
          continue; // a batch got there first and reads it itself
        }
        if (plans.get(owner) != plan) {
          giveBack(key, f); // this plan was replaced or cancelled after its staging was dropped
          return;
        }
        if (!startRead(d, epoch, id, len, key, f, stats)) {
          p--; // no room after all: try this position again once there is
          Thread.sleep(1);
        }
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    } catch (RuntimeException | Error e) {
      LOG.warn("prefetch for dataset '{}' ({}) epoch {} stopped: {}", d.name(), owner, epoch, e.toString());
    }
  }

  /**
   * Allocates the staging of slot {@code f} and hands it to a reader, which then owns both. Whatever fails
   * before the hand-off (the window is full after all, direct memory is exhausted, the readers are shut down)
   * gives the slot back, so the future always completes; false when there was no room.
   */
  private boolean startRead(
      Dataset d, long epoch, int id, int len, Key key, CompletableFuture<ArrowBuf> f, DatasetStats.Epoch stats) {
    ArrowBuf buf = null;
    boolean handedOff = false;
    try {
      buf = allocator.buffer(Math.max(1, len));
      readers.execute(new Read(d, epoch, id, len, buf, f, stats));
      handedOff = true;
      return true;
    } catch (org.apache.arrow.memory.OutOfMemoryException full) {
      return false; // another plan's reader took the room between the check and here
    } finally {
      if (!handedOff) {
        if (buf != null) {
          buf.close();
        }
        giveBack(key, f);
      }
    }
  }

  /** Takes a slot out of staging if it is still there, and completes it empty for whoever holds it. */
  private void giveBack(Key key, CompletableFuture<ArrowBuf> f) {
    staged.remove(key, f);
    f.complete(null);
  }

  /** A prefetch read of one sample into its staging buffer; it owns the buffer until the future holds it. */
  private final class Read implements Runnable {
    private final Dataset d;
    private final long epoch;
    private final int id;
    private final int len;
    private final ArrowBuf buf;
    private final CompletableFuture<ArrowBuf> future;
    private final DatasetStats.Epoch stats;

    Read(Dataset d, long epoch, int id, int len, ArrowBuf buf, CompletableFuture<ArrowBuf> future,
        DatasetStats.Epoch stats) {
      this.d = d;
      this.epoch = epoch;
      this.id = id;
      this.len = len;
      this.buf = buf;
      this.future = future;
      this.stats = stats;
    }

    @Override
    public void run() {
      boolean handedOff = false;
      try {
        source.read(d, epoch, id, buf, len, stats);
        handedOff = future.complete(buf);
      } catch (Throwable e) {
        future.completeExceptionally(e);
      } finally {
        if (!handedOff) {
          abandon();
        }
      }
    }

    /** Frees the buffer and completes the future empty (if it is not complete yet): the read never ran. */
    void abandon() {
      buf.close();
      future.complete(null);
    }
  }

  /**
   * Called for every sample a batch of {@code epoch} serves, before any other tier: marks it served and, if
   * it was prefetched (or is being read), waits for it until {@code deadlineNanos} ({@link System#nanoTime};
   * a batch gives all its samples one deadline) and copies it into {@code dst}. False when the batch must read
   * the sample itself: it was not prefetched, its slot was given back, or the deadline passed (the staged
   * copy is then freed when its read completes). A read error is raised here, for the batch that needs it.
   */
  public boolean take(Dataset d, String owner, long epoch, int id, ArrowBuf dst, long off, long deadlineNanos)
      throws IOException {
    CompletableFuture<ArrowBuf> f = claim(owner, epoch, id);
    if (f == null) {
      return false;
    }
    // Claiming removed the slot from staging: this call owns it, and frees it on every path.
    ArrowBuf buf;
    try {
      buf = f.get(Math.max(0, deadlineNanos - System.nanoTime()), TimeUnit.NANOSECONDS);
    } catch (TimeoutException e) {
      release(f);
      Plan plan = plans.get(owner);
      if (plan == null || plan.warnedLate.compareAndSet(false, true)) {
        LOG.warn("dataset '{}' ({}) epoch {}: prefetched sample {} not ready within {} s of its batch; reading it"
            + " from storage (further late samples of this plan are not logged)", d.name(), owner, epoch, id,
            TAKE_DEADLINE.toSeconds());
      }
      return false;
    } catch (InterruptedException e) {
      release(f);
      Thread.currentThread().interrupt();
      throw new IOException("interrupted waiting for prefetched sample " + id + " of dataset '" + d.name() + "'", e);
    } catch (ExecutionException e) {
      if (e.getCause() instanceof IOException io) {
        throw io;
      }
      throw new IOException(e.getCause());
    }
    if (buf == null) {
      return false; // the prefetch slot was given back: the batch reads the sample itself
    }
    try {
      dst.setBytes(off, buf, 0, d.length(id));
    } finally {
      buf.close();
    }
    return true;
  }

  /** Like {@link #take} for a sample served from elsewhere (the shared-memory cache): a staged copy is freed. */
  public void skip(String owner, long epoch, int id) {
    release(claim(owner, epoch, id));
  }

  /** Marks {@code id} served in {@code owner}'s plan of {@code epoch} and removes its staging, if any. */
  private CompletableFuture<ArrowBuf> claim(String owner, long epoch, int id) {
    Plan plan = plans.get(owner);
    if (plan != null && plan.epoch == epoch) {
      plan.markServed(id);
    }
    return staged.remove(new Key(owner, id));
  }

  /** Drops what {@code owner} staged: each slot removed here is owned here, so a batch cannot be copying it. */
  private void dropStaged(String owner) {
    for (Key k : staged.keySet()) {
      if (k.owner().equals(owner)) {
        release(staged.remove(k));
      }
    }
  }

  /** Frees an owned slot's buffer once its read completes (at once if it has). */
  private static void release(CompletableFuture<ArrowBuf> f) {
    if (f != null) {
      f.whenComplete((buf, e) -> {
        if (buf != null) {
          buf.close();
        }
      });
    }
  }

  /** Bytes staged right now (for tests of the bound). */
  public long stagedBytes() {
    return allocator.getAllocatedMemory();
  }

  public long peakStagedBytes() {
    return allocator.getPeakMemoryAllocation();
  }

  @Override
  public void close() {
    plans.values().forEach(p -> p.driver.cancel(true));
    drivers.shutdownNow();
    for (Runnable never : readers.shutdownNow()) {
      ((Read) never).abandon(); // queued reads that will not run: their slots complete empty
    }
    try {
      readers.awaitTermination(10, TimeUnit.SECONDS);
      drivers.awaitTermination(10, TimeUnit.SECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
    for (Key k : staged.keySet()) {
      release(staged.remove(k));
    }
  }
}
