package io.unstall.flight.dataset;

import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.cache.Digest;
import io.unstall.flight.format.CorruptRecordException;
import io.unstall.flight.format.Format;
import io.unstall.flight.format.SampleIndex;
import io.unstall.flight.protocol.DataError;
import io.unstall.flight.storage.Storage;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.List;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReferenceArray;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/** A registered dataset: a named storage location plus a format, indexed into stable sample ids. */
public final class Dataset {
  private static final Logger LOG = LoggerFactory.getLogger(Dataset.class);
  private static final com.fasterxml.jackson.databind.ObjectMapper LAYOUT =
      new com.fasterxml.jackson.databind.ObjectMapper();
  private final String name;
  private final Format format;
  /** The format options as registered, canonical JSON ("{}" for none): part of the dataset's identity. */
  private final String options;
  private final Storage storage;
  private final SampleIndex index;
  private final List<String> classes;
  private final DatasetStats stats;
  /** What this sidecar served to other sidecars of its cluster (partitioned cache): not its clients' epochs. */
  private final DatasetStats servedToPeers;
  /**
   * The digest manifest: sample id -> content digest, each computed from this dataset's own bytes (a read from
   * its storage, or a persisted manifest of the same fingerprint). Only these key cache lookups.
   */
  private final AtomicReferenceArray<Digest> digests;
  /** How many digests were learned or changed: the registry checkpoints the manifest when this moved. */
  private final AtomicLong learned = new AtomicLong();
  /**
   * Digests an imported manifest claims, not yet checked against this dataset's bytes (null: none imported).
   * A claim never keys a lookup: the sample's first read from storage checks it ({@link #learn}) and removes it.
   */
  private volatile AtomicReferenceArray<Digest> claims;
  /** Where the claims came from, for the mismatch warning. */
  private volatile String claimsFrom;
  private final AtomicBoolean warnedMismatch = new AtomicBoolean();
  private volatile byte[] fingerprint;

  Dataset(String name, Format format, String options, Storage storage, SampleIndex index, List<String> classes,
      int statsEpochs) {
    this.stats = new DatasetStats(statsEpochs);
    this.servedToPeers = new DatasetStats(statsEpochs);
    this.name = name;
    this.format = format;
    this.options = options;
    this.storage = storage;
    this.index = index;
    this.classes = List.copyOf(classes);
    this.digests = new AtomicReferenceArray<>(index.size());
  }

  /** The content digest of sample {@code id} computed from this dataset's own bytes, or null if not known yet. */
  public Digest digest(int id) {
    return digests.get(id);
  }

  /** What {@link #learn} made of an imported claim on the sample. */
  public enum Claim {
    /** No claim was pending on the sample. */
    NONE,
    /** The sample's bytes hash to the claimed digest. */
    VERIFIED,
    /** They do not: the claim is dropped, and the entry it named is never served to this dataset. */
    MISMATCH
  }

  /**
   * Records the digest of sample {@code id}'s bytes just read from this dataset's storage (the only way a
   * digest is learned while the sidecar runs), and checks a pending imported claim against it.
   */
  public Claim learn(int id, Digest digest) {
    if (!digest.equals(digests.getAndSet(id, digest))) {
      learned.incrementAndGet();
    }
    AtomicReferenceArray<Digest> c = claims;
    Digest claimed = c == null ? null : c.getAndSet(id, null);
    if (claimed == null) {
      return Claim.NONE;
    }
    if (claimed.equals(digest)) {
      return Claim.VERIFIED;
    }
    if (warnedMismatch.compareAndSet(false, true)) {
      LOG.warn("dataset '{}' sample {} (file '{}'): its bytes do not hash to the digest that manifest {} claims;"
          + " the claimed cache entry is refused and its own bytes served (further mismatches of this dataset are"
          + " counted as verify_mismatches in stats, not logged)", name, id, fileOf(id), claimsFrom);
    }
    return Claim.MISMATCH;
  }

  /** Trusts a digest computed from this dataset's bytes by an earlier sidecar (a persisted manifest). */
  void restore(int id, Digest digest) {
    digests.set(id, digest);
  }

  /**
   * Notes the digests an imported manifest ({@code from}) claims, for samples whose digest is not known: each is
   * checked on the sample's first read. Returns how many claims are pending.
   */
  int claim(Digest[] claimed, String from) {
    AtomicReferenceArray<Digest> c = new AtomicReferenceArray<>(claimed.length);
    int n = 0;
    for (int i = 0; i < claimed.length; i++) {
      if (claimed[i] != null && digests.get(i) == null) {
        c.set(i, claimed[i]);
        n++;
      }
    }
    claimsFrom = from;
    claims = c;
    return n;
  }

  /** The digest an imported manifest claims for sample {@code id} and no read checked yet, or null. */
  public Digest claimed(int id) {
    AtomicReferenceArray<Digest> c = claims;
    return c == null ? null : c.get(id);
  }

  /** Digests learned so far (a counter that moves whenever the manifest changes). */
  long learned() {
    return learned.get();
  }

  /** The manifest fingerprint of this dataset as registered, computed once (see {@link Manifests}). */
  byte[] fingerprint() throws IOException {
    byte[] fp = fingerprint;
    if (fp == null) {
      fingerprint = fp = Manifests.fingerprint(this);
    }
    return fp;
  }

  SampleIndex index() {
    return index;
  }

  public String name() {
    return name;
  }

  public Format format() {
    return format;
  }

  public Storage storage() {
    return storage;
  }

  /** The format options as registered (canonical JSON, "{}" for none). */
  public String options() {
    return options;
  }

  public int size() {
    return index.size();
  }

  public long totalBytes() {
    return index.totalBytes();
  }

  public int length(int id) {
    return index.length(id);
  }

  public boolean labelled() {
    return index.labelled();
  }

  public long label(int id) {
    return index.label(id);
  }

  public String key(int id) {
    return format.key(index, id);
  }

  public DatasetStats stats() {
    return stats;
  }

  /** The counters of samples this sidecar served to peers that asked it as their owner. */
  public DatasetStats servedToPeers() {
    return servedToPeers;
  }

  /** Checks that {@code id} is a sample of this dataset. */
  public int checkId(long id) {
    if (id < 0 || id >= index.size()) {
      throw new IllegalArgumentException(
          "sample id " + id + " out of range for dataset '" + name + "' (size " + index.size()
              + ", valid ids 0.." + (index.size() - 1) + ")");
    }
    return (int) id;
  }

  /** Reads sample {@code id} from storage into {@code dst}. */
  public void read(int id, ByteBuffer dst) throws IOException {
    try {
      format.read(storage, index, id, dst);
    } catch (CorruptRecordException e) {
      throw e.inSample(name, id, key(id));
    }
  }

  /** The file (storage path) sample {@code id} lives in, and where its data starts. */
  public String file(int id) {
    return index.file(id);
  }

  public long offset(int id) {
    return index.offset(id);
  }

  /** Bytes after a sample's data that a read also fetches to verify it (see {@link Format#trailer}). */
  public int trailer() {
    return format.trailer();
  }

  /** Reads {@code run.remaining()} bytes of {@code file} from {@code start}: one ranged request for many samples. */
  public void readRun(String file, long start, ByteBuffer run) throws IOException {
    storage.readFully(file, start, run);
  }

  /** Takes sample {@code id} out of a run read from {@code runStart} of its file, verifying it. */
  public void extract(int id, ByteBuffer run, long runStart, ByteBuffer dst) throws IOException {
    try {
      format.extract(storage, index, id, run, runStart, dst);
    } catch (CorruptRecordException e) {
      throw e.inSample(name, id, key(id));
    }
  }

  /** The storage path of a sample's file, for error messages. */
  public String fileOf(int id) {
    return storage.describe(index.file(id));
  }

  /** Sample {@code id} refused for {@code reason} (a bad image): bad data, named with where the sample lies. */
  public DataError badSample(int id, String reason) {
    return new DataError(name, id, key(id), fileOf(id), offset(id), reason);
  }

  /** The description sent as FlightInfo app_metadata and returned by the control plane. */
  public ObjectNode describe() {
    ObjectNode o = JsonNodeFactory.instance.objectNode();
    o.put("v", 1);
    o.put("name", name);
    o.put("format", format.name());
    o.put("uri", storage.uri());
    o.put("num_samples", index.size());
    o.put("total_bytes", index.totalBytes());
    if (index.labelled()) {
      o.putPOJO("classes", classes);
    }
    if (!index.layout().isEmpty()) {
      try {
        o.set("layout", LAYOUT.readTree(index.layout()));
      } catch (com.fasterxml.jackson.core.JsonProcessingException e) {
        throw new IllegalStateException("format " + format.name() + " made an invalid layout", e);
      }
    }
    return o;
  }
}
