package io.unstall.flight;

import io.unstall.flight.StorageReader.Miss;
import io.unstall.flight.cache.Digest;
import io.unstall.flight.cache.DiskTier;
import io.unstall.flight.cache.SampleCache;
import io.unstall.flight.cache.TierBreaker;
import io.unstall.flight.cluster.Ownership;
import io.unstall.flight.cluster.Peer;
import io.unstall.flight.cluster.PeerClients;
import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.dataset.DatasetStats;
import io.unstall.flight.protocol.BatchSchema;
import io.unstall.flight.shm.ShmRef;
import java.io.IOException;
import java.util.ArrayList;
import java.util.BitSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.nio.charset.StandardCharsets;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.BitVectorHelper;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.arrow.vector.VectorSchemaRoot;

/**
 * Builds the record batch for a fetch ticket. Each sample comes from the first tier that has it: the
 * prefetcher's staging, the memory cache (by content digest), the disk tier, or storage, read straight into
 * the batch's payload buffer and then offered to the caches. A cache entry is looked up only under a digest
 * the dataset computed from its own bytes ({@link Dataset#digest}); an imported claim is checked by the
 * sample's first read ({@link #admit}). The whole batch is assembled before anything is sent, so a failure
 * never yields a partial batch. A cache tier's error (disk full, EIO, memory that cannot be allocated) never
 * fails a batch: the sample is read from storage, and each tier sits behind a {@link TierBreaker}.
 *
 * <p>In a cluster (the partitioned cache, {@link #joinCluster}) the memory cache and the disk tier admit only the
 * samples this sidecar owns, and a sample owned by another sidecar is asked of its owner over Flight after the
 * local tiers (prefetch, memory cache); the owners' answers overlap this sidecar's own storage reads of the
 * batch, and a sample whose owner failed or left is read from the disk tier or storage.
 */
public final class BatchAssembler {
  private final SampleCache cache;
  private final DiskTier disk; // null when there is no disk tier
  private final TierBreaker cacheBreaker; // the memory cache's admission
  private final TierBreaker diskBreaker; // null when there is no disk tier
  private final Prefetcher prefetcher;
  private final ExecutorService io; // parallel storage reads of a batch's misses, and its peer fetches
  private final StorageReader storage;
  private volatile Ownership ownership = Ownership.SOLO;
  private volatile PeerClients peers; // null: no cluster

  /** The prefetcher stages in {@code prefetch}, the data plane's "prefetch" allocator (its limit is the window). */
  public BatchAssembler(
      SampleCache cache, DiskTier disk, BufferAllocator prefetch, int prefetchWindowSamples, int prefetchThreads) {
    this(cache, disk, new TierBreaker("memory cache (" + cache.policy() + ")"),
        disk == null ? null : new TierBreaker("disk tier " + disk.file().getParent()), prefetch,
        prefetchWindowSamples, prefetchThreads);
  }

  /** With the breakers of the memory cache's admission and of the disk tier (null without one) given. */
  BatchAssembler(
      SampleCache cache, DiskTier disk, TierBreaker cacheBreaker, TierBreaker diskBreaker, BufferAllocator prefetch,
      int prefetchWindowSamples, int prefetchThreads) {
    this.cache = cache;
    this.disk = disk;
    this.cacheBreaker = cacheBreaker;
    this.diskBreaker = diskBreaker;
    this.io = Executors.newFixedThreadPool(Math.max(1, prefetchThreads), Prefetcher.daemon("unstall-io"));
    this.storage = new StorageReader(io, this::admit);
    this.prefetcher =
        new Prefetcher(prefetch, prefetchWindowSamples, prefetchThreads, this::prefetchRead, this::isCached);
  }

  public Prefetcher prefetcher() {
    return prefetcher;
  }

  /** The breaker of the memory cache's admission (for stats). */
  public TierBreaker cacheBreaker() {
    return cacheBreaker;
  }

  /** The disk tier's breaker (for stats), or null without a disk tier. */
  public TierBreaker diskBreaker() {
    return diskBreaker;
  }

  /**
   * From now on, the memory cache admits only what {@code ownership} says this sidecar owns, and samples owned
   * elsewhere are asked of their owner through {@code peers}.
   */
  public void joinCluster(Ownership ownership, PeerClients peers) {
    this.ownership = ownership;
    this.peers = peers;
  }

  /**
   * The samples of {@code d} cached here now (memory cache or disk tier): bit {@code id} of the set. A snapshot, read
   * sample by sample while batches go on, for orders that serve cached samples first.
   */
  public BitSet cached(Dataset d) {
    BitSet set = new BitSet(d.size());
    for (int id = 0; id < d.size(); id++) {
      if (isCached(d, id)) {
        set.set(id);
      }
    }
    return set;
  }

  /** Whether the prefetcher need not read {@code id}: cached here. */
  private boolean isCached(Dataset d, int id) {
    Digest digest = d.digest(id);
    return digest != null && (cache.contains(digest) || onDisk(digest));
  }

  /**
   * A prefetch read: a sample owned by another sidecar is asked of its owner (which reads it from its storage
   * link and admits it on its own miss: in a cluster every node's link works ahead of the batches, not only for
   * its own samples); one this sidecar owns, or whose owner fails, is read from storage and offered to the caches.
   */
  private void prefetchRead(Dataset d, long epoch, int id, ArrowBuf buf, int len, DatasetStats.Epoch stats)
      throws IOException {
    PeerClients peerClients = peers;
    if (peerClients != null) {
      Peer owner = ownership.ownerOf(d.name(), id);
      if (owner.remote()) {
        if (peerClients.fetch(owner, d, epoch, new int[] {id}, buf, new long[] {0})) {
          stats.peerPrefetched(len);
          return;
        }
        stats.peerFallback(1);
      }
    }
    StorageReader.readFromStorage(d, id, buf, 0, len);
    stats.prefetched(len);
    admit(d, id, buf, 0, len, stats);
  }

  /** Whether the disk tier holds {@code digest} and is not bypassed. */
  private boolean onDisk(Digest digest) {
    return disk != null && disk.contains(digest) && !diskBreaker.bypassing();
  }

  /**
   * Who a batch is for: the owner of the prefetch plan it may be served from (a session, or the dataset's
   * name for Flight clients) and the counters it counts into.
   */
  public record Requester(String owner, DatasetStats stats) {
    /** A Flight client without a session: the dataset's own plan and counters. */
    public static Requester of(Dataset d) {
      return new Requester(d.name(), d.stats());
    }

    /** Another sidecar asking this one as the owner: no plan, its own counters. */
    public static Requester peerOf(Dataset d) {
      return new Requester("peer:" + d.name(), d.servedToPeers());
    }
  }

  /** A ticket's ids, checked against the dataset, and the payload bytes of the batch they make. */
  public record CheckedIds(int[] ids, long payloadBytes) {}

  /**
   * The start of a client's fetch, whichever way it comes (a Flight DoGet, the local socket): its ids checked
   * ({@link #checkedIds(Dataset, long[])}), then its epoch counted as started in the dataset's stats.
   */
  public static CheckedIds startFetch(Dataset d, long[] requested, long epoch) {
    CheckedIds checked = checkedIds(d, requested);
    d.stats().startEpoch(d.name(), epoch);
    return checked;
  }

  /** Checks ids against the dataset (range, and a batch under 2 GiB). */
  public static CheckedIds checkedIds(Dataset d, long[] requested) {
    int[] ids = new int[requested.length];
    for (int i = 0; i < ids.length; i++) {
      ids[i] = d.checkId(requested[i]);
    }
    long bytes = payloadBytes(d, ids);
    if (bytes > Integer.MAX_VALUE) {
      throw new IllegalArgumentException(
          "a batch of dataset '" + d.name() + "' would carry " + bytes + " payload bytes; Arrow binary columns"
              + " hold < 2 GiB: ask for fewer samples per ticket");
    }
    return new CheckedIds(ids, bytes);
  }

  private static long payloadBytes(Dataset d, int[] ids) {
    long bytes = 0;
    for (int id : ids) {
      bytes += d.length(id);
    }
    return bytes;
  }

  /** Assembles the batch for Flight, every payload copied into it; the caller owns (and closes) the root. */
  public VectorSchemaRoot assemble(Dataset d, Requester r, long epoch, int[] ids, BufferAllocator allocator)
      throws IOException {
    return assemble(d, r, epoch, ids, allocator, HEAP, true);
  }

  /**
   * Assembles the batch with its payload column's buffers from {@code memory} (a prep group's shared-memory slot),
   * every payload copied straight into them.
   */
  public VectorSchemaRoot assemble(Dataset d, Requester r, long epoch, int[] ids, BufferAllocator allocator,
      PayloadMemory memory) throws IOException {
    return assemble(d, r, epoch, ids, allocator, memory, true);
  }

  /** Gives a batch's payload column its buffers for {@code rows} rows of {@code bytes} bytes in all. */
  @FunctionalInterface
  public interface PayloadMemory {
    void allocate(VarBinaryVector payload, int rows, long bytes) throws IOException;
  }

  private static final PayloadMemory HEAP = (payload, rows, bytes) -> payload.allocateNew(bytes, rows);

  /**
   * Assembles the batch a peer asked this sidecar for, as the owner: from the local tiers or storage, never from
   * another peer (an owner that is asked does not pass the question on), counted in the dataset's
   * {@code servedToPeers}.
   */
  public VectorSchemaRoot assembleForPeer(Dataset d, long epoch, int[] ids, BufferAllocator allocator)
      throws IOException {
    return assemble(d, Requester.peerOf(d), epoch, ids, allocator, HEAP, false);
  }

  private VectorSchemaRoot assemble(Dataset d, Requester r, long epoch, int[] ids, BufferAllocator allocator,
      PayloadMemory memory, boolean askPeers) throws IOException {
    int n = ids.length;
    VectorSchemaRoot root = VectorSchemaRoot.create(BatchSchema.SCHEMA, allocator);
    try {
      BigIntVector idVec = (BigIntVector) root.getVector(BatchSchema.ID);
      BigIntVector labelVec = (BigIntVector) root.getVector(BatchSchema.LABEL);
      VarCharVector keyVec = (VarCharVector) root.getVector(BatchSchema.KEY);
      VarBinaryVector payload = (VarBinaryVector) root.getVector(BatchSchema.PAYLOAD);
      idVec.allocateNew(n);
      labelVec.allocateNew(n);
      keyVec.allocateNew(n);
      memory.allocate(payload, n, Math.max(1, payloadBytes(d, ids)));

      ArrowBuf data = payload.getDataBuffer();
      ArrowBuf offsets = payload.getOffsetBuffer();
      ArrowBuf validity = payload.getValidityBuffer();
      long[] at = new long[n];
      int off = 0;
      for (int i = 0; i < n; i++) {
        int id = ids[i];
        at[i] = off;
        off += d.length(id);
        offsets.setInt((long) (i + 1) * Integer.BYTES, off);
        BitVectorHelper.setBit(validity, i);
        idVec.set(i, id);
        if (d.labelled()) {
          labelVec.set(i, d.label(id));
        } else {
          labelVec.setNull(i);
        }
        keyVec.setSafe(i, d.key(id).getBytes(StandardCharsets.UTF_8));
      }
      fill(d, r, epoch, ids, null, data, at, askPeers);
      payload.setLastSet(n - 1);
      root.setRowCount(n);
      return root;
    } catch (IOException | RuntimeException e) {
      root.close();
      throw e;
    }
  }

  /** Makes the staging buffer of a same-host batch: shared memory of {@code bytes}, counted by the budget. */
  public interface Staging {
    ArrowBuf allocate(long bytes) throws IOException;
  }

  /**
   * Assembles a batch for a client on this host: rows whose bytes sit in the shared-memory cache are
   * referenced in place (never copied); the others (LRU or disk hits, prefetched samples, misses read from
   * storage) are copied or read into one staging buffer from {@code staging}, called only if some row needs it.
   * {@code refs[i]} is set for referenced rows; the others are at {@code stagedAt[i]} in the returned buffer.
   * Returns the staging buffer (the caller closes it), or null when every row was referenced.
   */
  public ArrowBuf assembleLocal(
      Dataset d, Requester r, long epoch, int[] ids, ShmRef[] refs, long[] stagedAt, Staging staging)
      throws IOException {
    DatasetStats.Epoch stats = r.stats().epoch(epoch);
    long staged = 0;
    int unreferenced = 0;
    for (int i = 0; i < ids.length; i++) {
      int id = ids[i];
      Digest digest = d.digest(id);
      ShmRef ref = digest == null ? null : cache.locate(digest, d.name());
      if (ref != null) {
        prefetcher.skip(r.owner(), epoch, id); // served from the cache: a staged copy is not needed
        stats.hit(ref.length());
        refs[i] = ref;
      } else {
        stagedAt[i] = staged;
        staged += d.length(id);
        unreferenced++;
      }
    }
    if (unreferenced == 0) {
      return null;
    }
    ArrowBuf buf = staging.allocate(staged);
    try {
      fill(d, r, epoch, ids, refs, buf, stagedAt, true);
      return buf;
    } catch (IOException | RuntimeException e) {
      buf.close();
      throw e;
    }
  }

  /**
   * Fills every row not in {@code refs} into {@code data} at {@code at[i]} from the first tier that has it:
   * prefetch staging and the memory cache, then (with {@code askPeers}, in a cluster) the owners of samples owned
   * elsewhere, one request per owner, then the disk tier; the rest is read from storage in parallel.
   */
  private void fill(
      Dataset d, Requester r, long epoch, int[] ids, ShmRef[] refs, ArrowBuf data, long[] at, boolean askPeers)
      throws IOException {
    DatasetStats.Epoch stats = r.stats().epoch(epoch);
    List<Miss> misses = new ArrayList<>();
    PeerClients peerClients = askPeers ? peers : null;
    Map<Peer, List<Miss>> remote = peerClients == null ? Map.of() : new LinkedHashMap<>();
    long prefetchDeadline = System.nanoTime() + Prefetcher.TAKE_DEADLINE.toNanos();
    for (int i = 0; i < ids.length; i++) {
      if (refs != null && refs[i] != null) {
        continue;
      }
      int id = ids[i];
      int len = d.length(id);
      long off = at[i];
      if (fillFromMemory(d, r.owner(), epoch, id, data, off, len, stats, prefetchDeadline)) {
        continue;
      }
      if (peerClients != null) {
        Peer owner = ownership.ownerOf(d.name(), id);
        if (owner.remote()) {
          remote.computeIfAbsent(owner, o -> new ArrayList<>()).add(new Miss(id, off, len));
          continue;
        }
      }
      if (!fillFromDisk(d, id, data, off, len, stats)) {
        misses.add(new Miss(id, off, len));
      }
    }
    if (remote.isEmpty()) {
      storage.read(d, misses, data, stats);
      return;
    }
    // The owners' answers and this sidecar's own storage reads overlap: each node's storage link and the peer
    // links are busy at once (CoorDL's aggregate bandwidth), and the two write disjoint slots of the batch.
    PeerFetches fromPeers = new PeerFetches(peerClients, d, epoch, remote, data);
    try {
      storage.read(d, misses, data, stats);
    } finally {
      fromPeers.await(); // every fetch is awaited: none writes into the buffer after it is released
    }
    List<Miss> late = new ArrayList<>();
    for (Miss m : fromPeers.failed(stats)) {
      if (!fillFromDisk(d, m.id(), data, m.off(), m.len(), stats)) {
        late.add(m);
      }
    }
    storage.read(d, late, data, stats);
  }

  /**
   * The batch's samples asked of their owners, owners in parallel, started at construction; {@link #failed}
   * gives the samples whose owner failed (gone, hung past the deadline, a reply that does not match), to be
   * read here.
   */
  private final class PeerFetches {
    private final Dataset d;
    private final Map<Peer, List<Miss>> remote;
    private final List<Peer> owners;
    private final List<Future<Boolean>> answers;
    private final boolean[] ok;
    private InterruptedException interrupted;

    PeerFetches(PeerClients peerClients, Dataset d, long epoch, Map<Peer, List<Miss>> remote, ArrowBuf data) {
      this.d = d;
      this.remote = remote;
      this.owners = new ArrayList<>(remote.keySet());
      this.answers = new ArrayList<>(owners.size());
      this.ok = new boolean[owners.size()];
      for (Peer owner : owners) {
        List<Miss> ms = remote.get(owner);
        int[] ids = new int[ms.size()];
        long[] at = new long[ms.size()];
        for (int k = 0; k < ids.length; k++) {
          ids[k] = ms.get(k).id();
          at[k] = ms.get(k).off();
        }
        answers.add(io.submit(() -> peerClients.fetch(owner, d, epoch, ids, data, at)));
      }
    }

    /** Waits for every answer (a failed one counts as not ok). */
    void await() {
      for (int k = 0; k < owners.size(); k++) {
        try {
          ok[k] = answers.get(k).get();
        } catch (ExecutionException e) {
          ok[k] = false;
        } catch (InterruptedException e) {
          if (interrupted == null) {
            interrupted = e;
          }
          k--; // still awaited: the fetch may be writing into the batch buffer
          Thread.interrupted();
        }
      }
      if (interrupted != null) {
        Thread.currentThread().interrupt();
      }
    }

    /** After {@link #await}: counts peer hits and fallbacks, and returns the samples to read here. */
    List<Miss> failed(DatasetStats.Epoch stats) throws IOException {
      if (interrupted != null) {
        throw new IOException("interrupted waiting for peers' samples of dataset '" + d.name() + "'", interrupted);
      }
      List<Miss> failed = new ArrayList<>();
      for (int k = 0; k < owners.size(); k++) {
        List<Miss> ms = remote.get(owners.get(k));
        if (ok[k]) {
          for (Miss m : ms) {
            stats.peerHit(m.len());
          }
        } else {
          stats.peerFallback(ms.size());
          failed.addAll(ms);
        }
      }
      return failed;
    }
  }

  /**
   * Copies sample {@code id} into {@code data[off..off+len)} from prefetch staging or the memory cache; false if
   * neither has it. Prefetched samples are waited for until {@code prefetchDeadline} ({@link System#nanoTime}).
   */
  private boolean fillFromMemory(
      Dataset d, String owner, long epoch, int id, ArrowBuf data, long off, int len, DatasetStats.Epoch stats,
      long prefetchDeadline) throws IOException {
    if (prefetcher.take(d, owner, epoch, id, data, off, prefetchDeadline)) {
      stats.prefetchHit();
      return true;
    }
    Digest digest = d.digest(id);
    if (digest != null && cache.copyTo(digest, data, off, d.name())) {
      stats.hit(len);
      return true;
    }
    return false;
  }

  /** Copies sample {@code id} from the disk tier (promoting it to the memory cache); false if it is not there. */
  private boolean fillFromDisk(Dataset d, int id, ArrowBuf data, long off, int len, DatasetStats.Epoch stats) {
    Digest digest = d.digest(id);
    if (digest != null) {
      if (onDisk(digest)
          && diskBreaker.run(() -> "reading " + sample(d, id), () -> disk.read(digest, data.nioBuffer(off, len)))) {
        stats.diskHit(len);
        admitToCache(d, id, digest, data, off, len); // promote while there is room
        return true;
      }
    }
    return false;
  }

  /** Names a sample in tier errors: dataset, id and the file it comes from. */
  private static String sample(Dataset d, int id) {
    return "dataset '" + d.name() + "' sample " + id + " (file '" + d.fileOf(id) + "')";
  }

  /** Whether this sidecar caches sample {@code id} (in a cluster each caches only its own part, in both tiers). */
  private boolean owns(Dataset d, int id) {
    return ownership.ownerOf(d.name(), id) == Peer.SELF;
  }

  /** Offers a sample to the memory cache, if this sidecar owns it (in a cluster, each caches its own part). */
  private void admitToCache(Dataset d, int id, Digest digest, ArrowBuf data, long off, int len) {
    if (!owns(d, id)) {
      return;
    }
    cacheBreaker.run(() -> "admitting " + sample(d, id),
        () -> cache.admit(digest, data, off, len, d.name()) == SampleCache.Admission.ADMITTED);
  }

  /** Stops the storage readers (after the data plane stopped serving). */
  public void close() {
    io.shutdownNow();
    prefetcher.close();
  }

  /**
   * Learns the digest of bytes just read from this dataset's storage (checking an imported claim on the sample:
   * counted in {@code stats}) and offers them to both tiers. Without any tier (a cache of capacity 0 and no disk
   * tier) there is nothing to key, share or admit: no hashing. A tier that fails to admit is skipped (behind its
   * breaker): the bytes are already where the batch needs them.
   */
  void admit(Dataset d, int id, ArrowBuf data, long off, int len, DatasetStats.Epoch stats) {
    if (disk == null && cache.capacityBytes() == 0) {
      return;
    }
    Digest digest = Digest.of(data.nioBuffer(off, len));
    stats.claim(d.learn(id, digest));
    admitToCache(d, id, digest, data, off, len);
    if (disk != null && owns(d, id)) {
      diskBreaker.run(() -> "writing " + sample(d, id), () -> disk.admit(digest, data.nioBuffer(off, len)));
    }
  }
}
