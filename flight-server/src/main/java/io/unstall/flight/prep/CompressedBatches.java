package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.node.ObjectNode;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.util.ArrayList;
import java.util.EnumMap;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.arrow.compression.CommonsCompressionFactory;
import org.apache.arrow.flight.FlightProducer.ServerStreamListener;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.OutOfMemoryException;
import org.apache.arrow.util.AutoCloseables;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.VectorUnloader;
import org.apache.arrow.vector.compression.CompressionCodec;
import org.apache.arrow.vector.compression.CompressionUtil;
import org.apache.arrow.vector.ipc.message.ArrowRecordBatch;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Arrow IPC body compression (LZ4_FRAME or ZSTD) of a group's staged batches for the members that asked for it at
 * {@code prep.join} ({@code "compression"}), so remote members receive fewer bytes (docs/PREP.md, "Flight").
 *
 * <p>Each staged batch is compressed at most once per codec, by the first member that reads it with that codec,
 * into this group's own child allocator ({@code prep-group-<id>-compressed}, a sibling of its staging allocator
 * under {@code prep}, capped at {@code staging_bytes}), and the compressed buffers are sent to every such member
 * (reference counted, no copy per member); they are freed with the staged batch ({@link #freeBelow}). A batch whose
 * compressed copy does not fit is sent uncompressed and counted ({@code compression_fallbacks}).
 *
 * <p>Compression that does not pay is stopped: once the last {@link #WINDOW} batches a codec compressed came to
 * more than {@link #WORTH} of their raw bytes (uint8 pixels of photographs hardly shrink), the next
 * {@link #PROBE_EVERY} positions go uncompressed ({@code skipped_batches}), then one is compressed again to see
 * whether the data changed. Members read the same tensors either way; only the sidecar's CPU changes.
 *
 * <p>Flight's server listener (arrow-java 19) has no codec option: it unloads the started root with its own
 * {@link VectorUnloader}. {@link #send} swaps that unloader (the listener's protected {@code unloader} field,
 * set by {@code start}) for one that hands out the cached compressed record batch; pyarrow decompresses it.
 */
final class CompressedBatches implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(CompressedBatches.class);
  private static final VarHandle UNLOADER = unloaderField();
  /**
   * Compressed bodies above this share of the raw bytes are not worth the CPU: a batch must save at least 1/8 of
   * its bytes, the rule ZFS applies to each block, since a codec that saves a few percent costs more CPU than the
   * bytes it saves (benchmarks/results/2026-11-26-prep-fifth-pass.md).
   */
  static final double WORTH = 0.875;
  /** How many of a codec's latest compressed batches judge it. */
  static final int WINDOW = 4;
  /** Positions sent uncompressed after a codec did not pay, before it is tried again. */
  static final long PROBE_EVERY = 64;

  /** The {@code compression} option of {@code prep.join}, or null for none; names the option when wrong. */
  static CompressionUtil.CodecType codec(String name) {
    if (name == null || name.isEmpty() || name.equalsIgnoreCase("none")) {
      return null;
    }
    return switch (name.toLowerCase(Locale.ROOT)) {
      case "lz4", "lz4_frame" -> CompressionUtil.CodecType.LZ4_FRAME;
      case "zstd" -> CompressionUtil.CodecType.ZSTD;
      default -> throw new IllegalArgumentException("prep.join: \"compression\" must be \"lz4\", \"zstd\" or null,"
          + " got \"" + name + "\"");
    };
  }

  private final String group;
  private final BufferAllocator parent;
  private final long limit;
  private final Map<Long, CompressionUtil.CodecType> byMember = new HashMap<>();
  private final TreeMap<Long, Map<CompressionUtil.CodecType, Entry>> cache = new TreeMap<>();
  private final Map<CompressionUtil.CodecType, long[]> sent = new EnumMap<>(CompressionUtil.CodecType.class);
  private final Map<CompressionUtil.CodecType, Yield> yields = new EnumMap<>(CompressionUtil.CodecType.class);
  private BufferAllocator alloc; // made on the first compressed read
  private final AtomicLong fallbacks = new AtomicLong();

  CompressedBatches(String group, BufferAllocator parent, long limit) {
    this.group = group;
    this.parent = parent;
    this.limit = limit;
  }

  synchronized void setMember(long member, CompressionUtil.CodecType codec) {
    if (codec == null) {
      byMember.remove(member);
    } else {
      byMember.put(member, codec);
    }
  }

  synchronized CompressionUtil.CodecType of(long member) {
    return byMember.get(member);
  }

  synchronized void removeMember(long member) {
    byMember.remove(member);
  }

  /**
   * Starts {@code listener} on {@code view} (staged batch {@code pos}) with the record batch it will send compressed
   * with {@code codec}; the caller then calls {@code putNext()} as usual. Returns the compressed batch to close after
   * the send, or null where it went uncompressed.
   */
  ArrowRecordBatch send(ServerStreamListener listener, VectorSchemaRoot view, long pos,
      CompressionUtil.CodecType codec) {
    listener.start(view);
    long raw = rawBytes(view);
    ArrowRecordBatch batch = retained(pos, codec, view, raw);
    if (batch == null) {
      count(codec, raw, raw);
      return null;
    }
    UNLOADER.setVolatile(listener, new VectorUnloader(view) {
      @Override
      public ArrowRecordBatch getRecordBatch() {
        return copyOf(batch, true);
      }
    });
    count(codec, raw, batch.computeBodyLength());
    return batch;
  }

  private static long rawBytes(VectorSchemaRoot view) {
    long raw = 0;
    for (FieldVector v : view.getFieldVectors()) {
      raw += v.getBufferSize();
    }
    return raw;
  }

  /** Whether to compress position {@code pos} with {@code codec}: always, unless it stopped paying (above). */
  private synchronized boolean worthTrying(CompressionUtil.CodecType codec, long pos) {
    Yield y = yields.get(codec);
    return y == null || y.worthTrying(pos);
  }

  /** Notes what batch {@code pos} compressed to (see {@link Yield}). */
  private synchronized void judge(CompressionUtil.CodecType codec, long pos, long raw, long packed) {
    Yield y = yields.computeIfAbsent(codec, c -> new Yield());
    if (y.judge(pos, raw, packed) && y.stops == 1) {
      LOG.info("prep group {}: {} shrinks its batches to only {}% of their bytes; sending them uncompressed, trying"
          + " again every {} batches", group, wire(codec), Math.round(100.0 * y.share()), PROBE_EVERY);
    }
  }

  /** Frees the compressed copies of batches below {@code pos} (the staged ones freed with them). */
  void freeBelow(long pos) {
    List<Entry> gone = new ArrayList<>();
    synchronized (this) { // entries are closed outside this lock: a compressing reader holds an entry's lock
      while (!cache.isEmpty() && cache.firstKey() < pos) {
        gone.addAll(cache.pollFirstEntry().getValue().values());
      }
    }
    for (Entry e : gone) {
      e.close();
    }
  }

  /** The counts {@code prep.stats} shows: raw and sent bytes per codec, compressed staging, fallbacks. */
  synchronized void stats(ObjectNode o) {
    if (sent.isEmpty() && byMember.isEmpty()) {
      return;
    }
    ObjectNode c = o.putObject("compression");
    for (Map.Entry<CompressionUtil.CodecType, long[]> e : sent.entrySet()) {
      Yield y = yields.get(e.getKey());
      c.putObject(wire(e.getKey())).put("batches_sent", e.getValue()[0]).put("raw_bytes_sent", e.getValue()[1])
          .put("compressed_bytes_sent", e.getValue()[2]).put("skipped_batches", y == null ? 0 : y.skipped);
    }
    c.put("members", byMember.size());
    c.put("staging_bytes", alloc == null ? 0 : alloc.getAllocatedMemory());
    c.put("staging_peak_bytes", alloc == null ? 0 : alloc.getPeakMemoryAllocation());
    c.put("fallbacks", fallbacks.get());
  }

  @Override
  public void close() {
    freeBelow(Long.MAX_VALUE);
    synchronized (this) {
      if (alloc != null) {
        alloc.close();
      }
    }
  }

  static String wire(CompressionUtil.CodecType codec) {
    return codec == CompressionUtil.CodecType.LZ4_FRAME ? "lz4" : "zstd";
  }

  private synchronized void count(CompressionUtil.CodecType codec, long raw, long compressed) {
    long[] c = sent.computeIfAbsent(codec, k -> new long[3]);
    c[0]++;
    c[1] += raw;
    c[2] += compressed;
  }

  /** The cached compressed batch {@code pos} with its own references (null: it did not fit, send it raw). */
  private ArrowRecordBatch retained(long pos, CompressionUtil.CodecType codec, VectorSchemaRoot view, long raw) {
    Entry e;
    BufferAllocator allocator;
    synchronized (this) {
      if (alloc == null) {
        alloc = parent.newChildAllocator("prep-group-" + group + "-compressed", 0, limit);
      }
      e = cache.computeIfAbsent(pos, p -> new EnumMap<>(CompressionUtil.CodecType.class))
          .computeIfAbsent(codec, c -> new Entry());
      allocator = alloc;
    }
    synchronized (e) { // compressed once, by the first reader; the others wait for it
      if (e.closed) {
        return null;
      }
      if (e.batch == null && !e.failed && !e.skipped) {
        try {
          if (!worthTrying(codec, pos)) {
            e.skipped = true;
          } else {
            e.batch = compress(view, codecFor(codec), allocator);
            judge(codec, pos, raw, e.batch.computeBodyLength());
          }
        } catch (OutOfMemoryException oom) {
          e.failed = true;
          fallbacks.incrementAndGet();
          LOG.info("prep group {}: the {} copy of batch position {} does not fit the compressed staging ({} bytes);"
              + " sent uncompressed", group, wire(codec), pos, limit);
        }
      }
      return e.batch == null ? null : copyOf(e.batch, true);
    }
  }

  /** LZ4 by {@link Lz4FrameCodec} (native-speed Java); ZSTD by arrow-compression's (zstd-jni). */
  static CompressionCodec codecFor(CompressionUtil.CodecType codec) {
    return codec == CompressionUtil.CodecType.LZ4_FRAME ? new Lz4FrameCodec()
        : CommonsCompressionFactory.INSTANCE.createCodec(codec);
  }

  private static ArrowRecordBatch compress(VectorSchemaRoot view, CompressionCodec codec, BufferAllocator alloc) {
    List<ArrowBuf> out = new ArrayList<>();
    try (ArrowRecordBatch raw = new VectorUnloader(view, true, true).getRecordBatch()) {
      for (ArrowBuf b : raw.getBuffers()) {
        b.getReferenceManager().retain(); // compress() releases its input
        out.add(codec.compress(alloc, b));
      }
      return new ArrowRecordBatch(raw.getLength(), raw.getNodes(), out, CompressionUtil.createBodyCompression(codec),
          true, false);
    } catch (RuntimeException e) {
      try {
        AutoCloseables.close(out);
      } catch (Exception suppressed) {
        e.addSuppressed(suppressed);
      }
      throw e;
    }
  }

  private static ArrowRecordBatch copyOf(ArrowRecordBatch b, boolean retain) {
    return new ArrowRecordBatch(b.getLength(), b.getNodes(), b.getBuffers(), b.getBodyCompression(), true, retain);
  }

  private static VarHandle unloaderField() {
    try {
      Class<?> impl = Class.forName("org.apache.arrow.flight.OutboundStreamListenerImpl");
      return MethodHandles.privateLookupIn(impl, MethodHandles.lookup())
          .findVarHandle(impl, "unloader", VectorUnloader.class);
    } catch (ReflectiveOperationException e) {
      throw new ExceptionInInitializerError("arrow-java's Flight listener changed: no OutboundStreamListenerImpl"
          + ".unloader field to send compressed batches through (" + e + ")");
    }
  }

  /**
   * Whether a codec pays: its latest {@link #WINDOW} results and the positions it is paused for. Not thread-safe
   * (the CompressedBatches lock guards it).
   */
  static final class Yield {
    private final long[] raw = new long[WINDOW];
    private final long[] packed = new long[WINDOW];
    private int judged;
    private long stoppedAt; // positions in [stoppedAt, resumeAt) go uncompressed
    private long resumeAt;
    long skipped;
    int stops;

    /** Whether to compress {@code pos}; counts it skipped when not. */
    boolean worthTrying(long pos) {
      if (pos >= resumeAt || pos < stoppedAt) { // a resumed member may read below where it stopped
        return true;
      }
      skipped++;
      return false;
    }

    /** Notes that {@code pos} compressed {@code raw} bytes to {@code packed}; true when that paused the codec. */
    boolean judge(long pos, long raw, long packed) {
      this.raw[judged % WINDOW] = raw;
      this.packed[judged % WINDOW] = packed;
      judged++;
      if (judged < WINDOW || share() <= WORTH || pos < resumeAt) { // below resumeAt: compressed before the pause
        return false;
      }
      stoppedAt = pos + 1;
      resumeAt = pos + 1 + PROBE_EVERY;
      stops++;
      return true;
    }

    /** What the latest batches compressed to, as a share of their raw bytes. */
    double share() {
      long r = 0;
      long p = 0;
      for (int i = 0; i < Math.min(judged, WINDOW); i++) {
        r += raw[i];
        p += packed[i];
      }
      return r == 0 ? 1.0 : (double) p / r;
    }
  }

  private static final class Entry implements AutoCloseable {
    ArrowRecordBatch batch;
    boolean failed;
    boolean skipped; // sent uncompressed: the codec did not pay (every member reads it raw)
    boolean closed;

    @Override
    public synchronized void close() {
      closed = true;
      if (batch != null) {
        batch.close();
        batch = null;
      }
    }
  }
}
