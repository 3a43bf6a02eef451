package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.cache.Digest;
import io.unstall.flight.prep.PrepPipeline.Op;
import io.unstall.flight.prep.PrepPipeline.RandomResizedCrop;
import java.nio.ByteBuffer;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.LongAdder;
import org.apache.arrow.memory.BufferAllocator;

/**
 * The decoded form (docs/PREP.md, "Cache forms"): JPEGs kept as RGB pixels, decoded once at a reduced DCT scale
 * that still serves the pipeline's crops ({@link #denom}), so later epochs only resample. Keyed by content digest
 * and scale; made the first time a sample is prepared while the quota the {@link FormPlanner} set has room, and
 * never evicted (as the encoded forms: under random-order epochs an evicting store would decode every sample
 * every epoch). The pixels live in {@link Slabs} of the forms memory ({@code --reindex-memory}), shared with the
 * restart-indexed copies; {@code -Dunstall.prep.decoded-form=off} turns the form off.
 */
final class DecodedImages implements AutoCloseable {
  static final boolean ENABLED = !"off".equals(System.getProperty("unstall.prep.decoded-form"));

  /** One kept image: {@code width} x {@code height} RGB pixels decoded at 1/{@code denom}. */
  record Image(ByteBuffer pixels, int width, int height, int denom, int sourceLength) {}

  private record Key(Digest digest, int denom) {}

  private final BufferAllocator memory; // null: off
  private final Slabs slabs;
  private final ConcurrentHashMap<Key, Image> images = new ConcurrentHashMap<>();
  private volatile long quota; // bytes the planner gives this form
  private final LongAdder hits = new LongAdder();
  private final LongAdder made = new LongAdder();
  private final LongAdder noRoom = new LongAdder();
  private final ConcurrentHashMap<String, Measured> measured = new ConcurrentHashMap<>(); // by pipeline fingerprint

  /**
   * One pipeline's CPU per sample on each path, for the cost model: from the encoded bytes (a sample decoded into
   * the store counts here: a whole-image decode, an upper bound of the crop's) and from kept pixels; and the bytes
   * of each form. Kept by the store, so a group whose samples are all kept still knows the encoded path's cost.
   */
  static final class Measured {
    private final LongAdder encodedNanos = new LongAdder();
    private final LongAdder encodedSamples = new LongAdder();
    private final LongAdder decodedNanos = new LongAdder();
    private final LongAdder decodedSamples = new LongAdder();
    private final LongAdder encodedBytes = new LongAdder();
    private final LongAdder keptBytes = new LongAdder(); // the decoded form's bytes (0: the sample has none)

    void add(boolean fromKept, long cpuNanos, long encoded, long kept) {
      (fromKept ? decodedNanos : encodedNanos).add(cpuNanos);
      (fromKept ? decodedSamples : encodedSamples).increment();
      encodedBytes.add(encoded);
      keptBytes.add(kept);
    }

    /** CPU seconds per sample from encoded bytes and from kept pixels (NaN: none yet), bytes per sample of each. */
    double[] rates() {
      long e = encodedSamples.sum();
      long k = decodedSamples.sum();
      long all = e + k;
      return new double[] {e == 0 ? Double.NaN : encodedNanos.sum() / 1e9 / e,
          k == 0 ? Double.NaN : decodedNanos.sum() / 1e9 / k, all == 0 ? 0 : (double) encodedBytes.sum() / all,
          all == 0 ? 0 : (double) keptBytes.sum() / all};
    }
  }

  /** The measurements of the pipeline with {@code fingerprint}, shared by its groups. */
  Measured measured(String fingerprint) {
    return measured.computeIfAbsent(fingerprint, f -> new Measured());
  }

  /** Pixels in {@code memory} (the forms memory); null, a zero limit or the native path missing: off. */
  DecodedImages(BufferAllocator memory) {
    this.memory = memory == null || memory.getLimit() <= 0 || !NativeJpeg.AVAILABLE || !ENABLED ? null : memory;
    this.slabs = new Slabs(memory);
    this.quota = this.memory == null ? 0 : this.memory.getLimit();
  }

  boolean enabled() {
    return memory != null;
  }

  /** The bytes the decoded form may hold from now on: kept images stay, new ones stop once it is reached. */
  void quota(long bytes) {
    quota = bytes;
  }

  /** Bytes the kept images take. */
  long bytesHeld() {
    return slabs.bytes();
  }

  long limit() {
    return memory == null ? 0 : memory.getLimit();
  }

  /**
   * The DCT scale denominator an image of {@code h} keeps for {@code p}: the largest of 8, 4, 2 that leaves its
   * shorter side at least the output's longer side / sqrt(the crop's smallest area scale), so a square crop of the
   * smallest area still has at least the output's pixels; 1 otherwise. 0: the pipeline has no decoded form (its
   * spatial op is not a random_resized_crop).
   */
  static int denom(ImageHeader h, PrepPipeline p) {
    RandomResizedCrop c = null;
    for (Op op : p.ops()) {
      if (op instanceof RandomResizedCrop r) {
        c = r;
      }
    }
    if (c == null || !ImagePrep.nativeOps(p)) {
      return 0;
    }
    double needed = Math.max(c.height(), c.width()) / Math.sqrt(Math.max(c.scaleMin(), 1e-6));
    int shorter = Math.min(h.width(), h.height());
    for (int d = NativeJpeg.MAX_SCALE_DENOM; d >= 2; d /= 2) {
      if (NativeJpeg.scaledSize(shorter, d) >= needed) {
        return d;
      }
    }
    return 1;
  }

  /** Whether the image with {@code digest} is kept at 1/{@code d}. */
  boolean has(Digest digest, int d) {
    return digest != null && images.containsKey(new Key(digest, d));
  }

  /** Bytes the decoded form of {@code h} takes at 1/{@code d}. */
  static long bytes(ImageHeader h, int d) {
    return (long) NativeJpeg.scaledSize(h.width(), d) * NativeJpeg.scaledSize(h.height(), d) * 3;
  }

  /**
   * The kept image of the JPEG {@code src} (its bytes hash to {@code digest}) at 1/{@code d}, decoded now if
   * there is none and the quota and the decode memory ({@code budget}, without waiting) have room; null: prepare
   * it from the encoded bytes.
   */
  Image forResample(Digest digest, ByteBuffer src, ImageHeader h, int d, DecodeBudget budget)
      throws BadImageException {
    if (memory == null || digest == null || d <= 0) {
      return null;
    }
    Key key = new Key(digest, d);
    Image kept = images.get(key);
    if (kept != null) {
      if (kept.sourceLength() != src.remaining()) { // not the bytes the digest was learned from
        return null;
      }
      hits.increment();
      return kept;
    }
    long n = bytes(h, d);
    if (n > Integer.MAX_VALUE || slabs.bytes() + n > quota) {
      return noRoom();
    }
    int w = NativeJpeg.scaledSize(h.width(), d);
    int ht = NativeJpeg.scaledSize(h.height(), d);
    long coefficients = h.multiScan() ? ImagePrep.coefficientBytes(h) : 0;
    ByteBuffer dst;
    // The decode's working memory only if it is there now: the thread may hold decode memory already.
    try (DecodeBudget.Reservation r = budget.tryAcquire(coefficients + ImagePrep.DECODER_OVERHEAD)) {
      dst = r == null ? null : slabs.place((int) n, quota);
      if (dst == null) {
        return noRoom();
      }
      NativeJpeg.decodeScaled(src, src.position(), src.remaining(), h.width(), h.height(), d, dst, 0, w, ht);
    }
    made.increment();
    Image mine = new Image(dst.asReadOnlyBuffer(), w, ht, d, src.remaining());
    Image won = images.putIfAbsent(key, mine); // two groups decoded it at once: the same pixels
    return won == null ? mine : won;
  }

  /** No image kept: no room in the quota, the forms memory or the decode memory now. */
  private Image noRoom() {
    noRoom.increment();
    return null;
  }

  /** prep.stats "decoded". */
  void stats(ObjectNode o) {
    o.put("enabled", memory != null);
    o.put("quota_bytes", quota);
    o.put("images", images.size());
    o.put("bytes", slabs.bytes());
    o.put("made", made.sum());
    o.put("hits", hits.sum());
    o.put("no_room", noRoom.sum());
  }

  @Override
  public void close() {
    images.clear();
    slabs.close();
  }
}
