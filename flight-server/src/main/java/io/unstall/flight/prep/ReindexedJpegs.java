package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.cache.Digest;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.nio.ByteBuffer;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.LongAdder;
import org.apache.arrow.memory.BufferAllocator;

/**
 * Restart-indexed copies of the JPEGs the native path prepares, so that each later decode entropy-decodes only
 * the restart intervals its crop covers (docs/ARCHITECTURE.md, "Decoding only the crop's MCUs"). A crop window
 * alone still Huffman-decodes every MCU above its bottom edge, most of a decode on photographs; the copy
 * ({@link NativeJpeg#reindex}) holds the same DCT coefficients, so it decodes to the same pixels.
 *
 * <p>Copies are keyed by the sample's content digest (shared by every group and dataset with the same bytes),
 * made the first time a sample is prepared while there is room, and never evicted: CoorDL's MinIO policy, since
 * under random-order epochs over more samples than fit an evicting store would rewrite every sample every epoch
 * (a rewrite costs about one and a half decodes). They live in {@link Slabs} of the data plane's "reindexed"
 * allocator ({@code --reindex-memory}, the forms memory it shares with {@link DecodedImages}), freed when the
 * sidecar closes.
 */
final class ReindexedJpegs implements AutoCloseable {
  private static final ThreadMXBean CPU = ManagementFactory.getThreadMXBean();
  static final int SLAB = Slabs.SLAB;
  /** Restart intervals span at most this many pixels of an MCU row: the crop's columns at this granularity. */
  static final int SPAN_PX = 32;
  /** Samples remembered as not rewritable (so not tried again each epoch), at most. */
  static final int MAX_REFUSED = 65536;

  private record Copy(ByteBuffer jpeg, int sourceLength) {}

  private final BufferAllocator memory; // null: off
  private final ConcurrentHashMap<Digest, Copy> copies = new ConcurrentHashMap<>();
  private final Set<Digest> refused = ConcurrentHashMap.newKeySet();
  private final Slabs slabs;
  private final LongAdder hits = new LongAdder();
  private final LongAdder made = new LongAdder();
  private final LongAdder notRewritable = new LongAdder();
  private final LongAdder noRoom = new LongAdder();
  private final LongAdder cpuNanos = new LongAdder();

  /** Copies in {@code memory} (its limit is the store's size); null or a zero limit: off. */
  ReindexedJpegs(BufferAllocator memory) {
    this.memory = memory == null || memory.getLimit() <= 0 || !NativeJpeg.AVAILABLE ? null : memory;
    this.slabs = new Slabs(memory);
  }

  /**
   * What the native path should decode for the JPEG {@code src} (its bytes hash to {@code digest}; null: unknown):
   * its copy, made now if there is none and there is room (the rewrite's working memory is reserved in
   * {@code budget} if it is there now: the caller holds the decode's), or {@code src} itself.
   */
  ByteBuffer forDecode(Digest digest, ByteBuffer src, ImageHeader h, DecodeBudget budget) {
    if (memory == null || digest == null) {
      return src;
    }
    Copy c = copies.get(digest);
    if (c != null) {
      if (c.sourceLength != src.remaining()) { // not the bytes the digest was learned from: never a wrong image
        return src;
      }
      hits.increment();
      return c.jpeg.duplicate();
    }
    if (slabs.full() || refused.contains(digest)) {
      if (slabs.full()) {
        noRoom.increment();
      }
      return src;
    }
    // The rewrite holds every DCT coefficient of the image and its output; one that would crowd out decodes is
    // not made (the sample is decoded from its original, as it would be without the store).
    long working = ImagePrep.coefficientBytes(h) + 2L * src.remaining() + 65536;
    DecodeBudget.Reservation r = working > budget.limit() / 4 ? null : budget.tryAcquire(working);
    if (r == null) {
      noRoom.increment();
      return src;
    }
    try (r) {
      long t0 = CPU.getCurrentThreadCpuTime();
      try {
        int n = NativeJpeg.reindex(src, src.position(), src.remaining(), SPAN_PX);
        if (n <= 0) {
          notRewritable.increment();
          if (refused.size() < MAX_REFUSED) {
            refused.add(digest);
          }
          return src;
        }
        ByteBuffer dst = slabs.place(n, Long.MAX_VALUE);
        if (dst == null) {
          noRoom.increment();
          return src;
        }
        NativeJpeg.takeReindexed(dst, 0, n);
        made.increment();
        Copy mine = new Copy(dst.asReadOnlyBuffer(), src.remaining());
        Copy won = copies.putIfAbsent(digest, mine); // two groups rewrote it at once: both are the same bytes
        return (won == null ? mine : won).jpeg.duplicate();
      } finally {
        cpuNanos.add(CPU.getCurrentThreadCpuTime() - t0);
      }
    }
  }

  /** prep.stats "reindexed". */
  void stats(ObjectNode o) {
    o.put("enabled", memory != null);
    o.put("memory_limit_bytes", memory == null ? 0 : memory.getLimit());
    o.put("memory_allocated_bytes", memory == null ? 0 : memory.getAllocatedMemory());
    o.put("copies", copies.size());
    o.put("bytes", slabs.bytes());
    o.put("full", slabs.full());
    o.put("made", made.sum());
    o.put("hits", hits.sum());
    o.put("not_rewritable", notRewritable.sum());
    o.put("no_room", noRoom.sum());
    o.put("rewrite_cpu_ms", cpuNanos.sum() / 1_000_000);
  }

  @Override
  public void close() {
    copies.clear();
    slabs.close();
  }
}
