package io.unstall.flight.dataset;

import io.unstall.flight.cache.Digest;
import io.unstall.flight.cache.DiskTier;
import io.unstall.flight.format.CorruptRecordException;
import io.unstall.flight.format.Format;
import io.unstall.flight.format.FormatOptions;
import io.unstall.flight.format.Formats;
import io.unstall.flight.format.SampleIndex;
import io.unstall.flight.storage.LocalStorage;
import io.unstall.flight.storage.Storage;
import java.io.IOException;
import java.net.URI;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.regex.Pattern;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/** The registered datasets by name. Registration indexes the dataset once, logging progress. */
public final class DatasetRegistry implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(DatasetRegistry.class);
  private static final Pattern NAME = Pattern.compile("[A-Za-z0-9][A-Za-z0-9._-]{0,127}");
  private static final long PROGRESS_EVERY = 10_000;

  /** How often persisted manifests (and the disk tier) are checkpointed while the sidecar runs. */
  public static final Duration CHECKPOINT_EVERY = Duration.ofSeconds(30);

  private final Map<String, Dataset> datasets = new ConcurrentHashMap<>();
  /** Per dataset, {@link Dataset#learned()} when its persisted manifest was last written (or loaded). */
  private final Map<Dataset, Long> saved = new ConcurrentHashMap<>();
  private final Object checkpointing = new Object();
  private volatile Path manifestDir;
  private volatile DiskTier tier;
  private ScheduledExecutorService checkpointer;
  private volatile io.unstall.flight.storage.Throttle throttle;
  private volatile int statsEpochs = io.unstall.flight.Bounds.STATS_EPOCHS;
  private volatile org.apache.arrow.memory.BufferAllocator formatMemory;

  /**
   * The allocator whose children hold formats' decoded units (Parquet row groups, HDF5 chunks); {@link
   * io.unstall.flight.DataPlane} owns it. Without one, formats that decode units cannot be registered.
   */
  public void decodeFormatsIn(org.apache.arrow.memory.BufferAllocator memory) {
    this.formatMemory = memory;
  }

  /** How many epochs' counters each dataset registered from now on keeps ({@code --stats-epochs}). */
  public void keepStatsEpochs(int epochs) {
    if (epochs < 1) {
      throw new IllegalArgumentException("--stats-epochs must be at least 1, got " + epochs);
    }
    this.statsEpochs = epochs;
  }

  /** Throttle every dataset's storage reads (a stand-in for a slow link to remote storage). */
  public void throttleStorage(io.unstall.flight.storage.Throttle t) {
    this.throttle = t;
  }

  /**
   * Persists digest manifests in {@code dir} (next to the disk tier {@code tier}) so that a restarted sidecar
   * finds its entries, even after a SIGKILL: a daemon {@linkplain #checkpoint() checkpoints} every {@code
   * every}, and {@link #close()} once more.
   */
  public synchronized void persistManifestsIn(Path dir, DiskTier tier, Duration every) {
    this.manifestDir = dir;
    this.tier = tier;
    if (checkpointer == null) {
      checkpointer = Executors.newSingleThreadScheduledExecutor(r -> {
        Thread t = new Thread(r, "unstall-checkpoint");
        t.setDaemon(true);
        return t;
      });
      long ms = every.toMillis();
      checkpointer.scheduleWithFixedDelay(this::checkpointQuietly, ms, ms, TimeUnit.MILLISECONDS);
    }
  }

  /**
   * Makes what the sidecar learned durable: the disk tier's entries first ({@link DiskTier#checkpoint()}), then
   * the manifest of every dataset that learned digests since its last one (each replaced atomically).
   */
  public void checkpoint() throws IOException {
    synchronized (checkpointing) {
      if (tier != null) {
        tier.checkpoint();
      }
      for (Dataset d : datasets.values()) {
        Path p = persistedManifest(d);
        long learned = d.learned();
        Long last = saved.get(d);
        if (p != null && (last == null || last != learned)) {
          Manifests.write(d, p);
          saved.put(d, learned);
        }
      }
    }
  }

  private void checkpointQuietly() {
    try {
      checkpoint();
    } catch (IOException | RuntimeException e) {
      LOG.warn("checkpoint of the disk tier and manifests in {} failed (retried in {} s): {}", manifestDir,
          CHECKPOINT_EVERY.toSeconds(), e.toString());
    }
  }

  /** Registers without importing a manifest; see {@link #register(String, String, String, Path)}. */
  public Dataset register(String name, String formatName, String uri) throws IOException {
    return register(name, formatName, uri, null);
  }

  /**
   * Registers {@code name} as {@code format} data at {@code uri}. Registering the same name with the same
   * format and location again returns the existing dataset; with another one it is an error. A
   * {@code manifest} exported from a dataset of the same content is imported as claims ({@link
   * Manifests#importClaims}): checked, sample by sample, against this dataset's bytes on first read.
   */
  public Dataset register(String name, String formatName, String uri, Path manifest) throws IOException {
    return register(name, formatName, uri, manifest, FormatOptions.NONE);
  }

  /**
   * Registers as {@link #register(String, String, String, Path)}, the format configured by {@code options} (which
   * are part of the dataset's identity: the same name with other options is an error).
   */
  public synchronized Dataset register(String name, String formatName, String uri, Path manifest,
      FormatOptions options) throws IOException {
    checkName(name);
    Format format;
    try {
      format = Formats.create(formatName, options);
    } catch (IllegalArgumentException e) {
      throw new IllegalArgumentException("dataset '" + name + "': " + e.getMessage(), e);
    }
    String canonical = options.canonical();
    Storage storage = openStorage(uri);
    if (throttle != null) {
      storage = new io.unstall.flight.storage.ThrottledStorage(storage, throttle);
    }
    Dataset existing = datasets.get(name);
    if (existing != null) {
      storage.close(); // the existing dataset keeps its own
      if (existing.format().name().equals(format.name()) && existing.storage().uri().equals(storage.uri())
          && existing.options().equals(canonical)) {
        return existing;
      }
      throw new IllegalArgumentException(
          "dataset '" + name + "' is already registered as " + existing.format().name() + " at "
              + existing.storage().uri()
              + (existing.options().equals("{}") ? "" : " with options " + existing.options())
              + "; choose another name");
    }
    long start = System.nanoTime();
    LOG.info("indexing dataset '{}' ({} at {})", name, format.name(), storage.uri());
    try {
      format.decodeIn(name, formatMemory);
      return register(name, format, storage, canonical, manifest, start);
    } catch (IOException | RuntimeException e) {
      format.close();
      storage.close();
      throw e;
    }
  }

  private Dataset register(String name, Format format, Storage storage, String canonical, Path manifest, long start)
      throws IOException {
    String identity = identity(format, storage, canonical);
    Path indexFile = format.persistsIndex() ? persisted(identity, ".index") : null;
    SampleIndex index = indexFile == null ? null : PersistedIndexes.read(indexFile, identity, storage);
    if (index != null) {
      LOG.info("dataset '{}': index of {} samples loaded from {}", name, index.size(), indexFile);
    } else {
      index = build(name, format, storage);
      if (indexFile != null) {
        try {
          PersistedIndexes.write(indexFile, identity, storage, index);
        } catch (IOException e) {
          LOG.warn("dataset '{}': could not persist its index in {} (it is rebuilt at the next registration): {}",
              name, indexFile, e.toString());
        }
      }
    }
    Dataset d = new Dataset(name, format, canonical, storage, index, format.classes(storage), statsEpochs);
    Path persisted = persistedManifest(d);
    if (persisted != null && Files.exists(persisted)) {
      restore(d, persisted);
    }
    if (manifest != null) {
      int n = Manifests.importClaims(d, manifest);
      LOG.info("dataset '{}': {} sample digests claimed by {}, each checked against the sample's bytes on its first"
          + " read", name, n, manifest);
    }
    datasets.put(name, d);
    LOG.info(
        "registered dataset '{}': {} samples, {} bytes, indexed in {} ms",
        name, d.size(), d.totalBytes(), (System.nanoTime() - start) / 1_000_000);
    return d;
  }

  /** Indexes the dataset, logging progress; an option that does not fit the data is an error naming the dataset. */
  private static SampleIndex build(String name, Format format, Storage storage) throws IOException {
    try {
      return format.index(storage, n -> {
        if (n % PROGRESS_EVERY == 0) {
          LOG.info("indexing dataset '{}': {} samples so far", name, n);
        }
      });
    } catch (IllegalArgumentException e) { // a missing column, array or member
      throw new IllegalArgumentException("dataset '" + name + "': " + e.getMessage(), e);
    } catch (CorruptRecordException e) {
      throw e.inDataset(name);
    }
  }

  /**
   * Loads a persisted manifest. A changed dataset, or a torn or corrupt manifest (a crash while it was written
   * by an older sidecar, a bad disk), is no error: the digests are relearned from storage, and the next
   * checkpoint rewrites the file.
   */
  private void restore(Dataset d, Path persisted) {
    try {
      int n = Manifests.restore(d, persisted);
      if (n < 0) {
        LOG.info("dataset '{}' changed since its manifest was saved: digests will be relearned", d.name());
      } else {
        saved.put(d, d.learned());
        LOG.info("dataset '{}': {} sample digests restored from {}", d.name(), n, persisted);
      }
    } catch (IOException | IllegalArgumentException e) {
      LOG.warn("dataset '{}': relearning its digests; the persisted manifest is unusable: {}", d.name(),
          e.getMessage());
    }
  }

  /** Refuses a name that is not a dataset name, saying what one is. */
  public static void checkName(String name) {
    if (name == null || !NAME.matcher(name).matches()) {
      throw new IllegalArgumentException(
          "invalid dataset name '" + name + "': use 1-128 letters, digits, '.', '_' or '-', starting with a"
              + " letter or digit");
    }
  }

  /** The dataset called {@code name}; unknown names are an error listing the registered ones. */
  public Dataset get(String name) {
    return get(name, n -> true);
  }

  /**
   * The dataset called {@code name}; an unknown name is an error that lists only the registered datasets the
   * caller may see (a tenant learns nothing of the others).
   */
  public Dataset get(String name, java.util.function.Predicate<String> visible) {
    Dataset d = datasets.get(name);
    if (d == null) {
      throw new UnknownDatasetException(name, datasets.keySet().stream().filter(visible).toList());
    }
    return d;
  }

  public Collection<Dataset> all() {
    List<Dataset> out = new ArrayList<>(datasets.values());
    out.sort((a, b) -> a.name().compareTo(b.name()));
    return out;
  }

  private Path persistedManifest(Dataset d) {
    return persisted(identity(d.format(), d.storage(), d.options()), ".manifest");
  }

  /** What identifies a dataset's persisted files: format, location and (when any) options. */
  private static String identity(Format format, Storage storage, String options) {
    return format.name() + "|" + storage.uri() + (options.equals("{}") ? "" : "|" + options); // none: as before
  }

  /** The file of the dataset {@code identity} with {@code suffix} in the manifest directory, or null without one. */
  private Path persisted(String identity, String suffix) {
    Path dir = manifestDir;
    if (dir == null) {
      return null;
    }
    byte[] id = identity.getBytes(StandardCharsets.UTF_8);
    return dir.resolve(Digest.of(ByteBuffer.wrap(id)).hex().substring(0, 32) + suffix);
  }

  static Storage openStorage(String uri) throws IOException {
    if (uri == null || uri.isBlank()) {
      throw new IllegalArgumentException("dataset location (uri) is empty");
    }
    if (uri.startsWith("file:")) {
      return new LocalStorage(Path.of(URI.create(uri)));
    }
    if (uri.startsWith("s3://")) {
      return io.unstall.flight.storage.S3Storage.open(uri);
    }
    if (uri.contains("://")) {
      throw new IllegalArgumentException(
          "unsupported storage scheme in '" + uri + "'; supported: file://, s3:// or an absolute path");
    }
    Path p = Path.of(uri);
    if (!p.isAbsolute()) {
      throw new IllegalArgumentException(
          "dataset location '" + uri + "' must be absolute (the sidecar's working directory is not yours)");
    }
    return new LocalStorage(p);
  }

  /** Stops the checkpoint daemon, checkpoints a last time and closes every dataset's storage. */
  @Override
  public void close() throws IOException {
    synchronized (this) {
      if (checkpointer != null) {
        checkpointer.shutdown(); // not shutdownNow: an interrupt would close the disk tier's channel mid-fsync
        try {
          checkpointer.awaitTermination(1, TimeUnit.MINUTES);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
        }
      }
    }
    checkpoint();
    for (Dataset d : datasets.values()) {
      d.format().close();
      d.storage().close();
    }
    datasets.clear();
  }
}
