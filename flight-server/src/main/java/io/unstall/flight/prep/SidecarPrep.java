package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.protocol.BatchSchema;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.DoubleSupplier;
import org.apache.arrow.flight.CallStatus;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.rounding.RoundingPolicy;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.BitVectorHelper;
import org.apache.arrow.vector.FixedSizeBinaryVector;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.types.pojo.Schema;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The sidecar-prep source: fetches a position's raw batch ({@link RawBatches}) and runs the group's pipeline
 * ({@link ImagePrep}) on every row, spread in chunks over the shared prep pool, into the batch tensor; bad images
 * fail their batch or (on_error "skip") are left out and remembered for stats. Remote prep workers
 * ({@link RemoteWorkers}) prepare some of the same positions elsewhere with the very same code ({@link PrepReplica}).
 */
final class SidecarPrep implements BatchSource {
  private static final Logger LOG = LoggerFactory.getLogger(SidecarPrep.class);
  private static final ThreadMXBean CPU = ManagementFactory.getThreadMXBean();
  /** The last skipped samples kept for stats. */
  static final int SKIPPED_HISTORY = 64;
  /** The cache-form plans kept for stats. */
  static final int PLANS_KEPT = 8;

  private final BatchOrder order;
  private final RawBatches raw;
  private final PrepPipeline pipeline;
  private final ImagePrep imagePrep;
  private final ExecutorService pool;
  private final int threads;
  private volatile int parallelism; // decode tasks of one batch in flight on the pool (the Autotuner sets it)
  private final boolean skip; // on_error "skip": a bad image is left out of its batch instead of failing it
  private final Schema schema;
  private final long cost;
  private final PrepCounts counts;
  private final GroupLock lock;
  private final DecodedImages decoded; // null: no decoded form
  private volatile DoubleSupplier consumption = () -> 0; // batches/s the members can read (Autotuner; 0: unknown)
  // Guarded by the group lock.
  private long plannedEpoch = -1;
  private long epochStartNanos;
  private long fetchNanosAtPlan; // the fetch clock and samples prepared at the last plan: the epoch's fetch rate
  private long samplesAtPlan;
  private final ArrayDeque<ObjectNode> plans = new ArrayDeque<>(); // the latest plans, with their measured epoch
  private long samplesSkipped;
  private final ArrayDeque<ObjectNode> skippedRecent = new ArrayDeque<>();
  private final Set<Integer> skippedLogged = new HashSet<>(); // samples warned about once

  SidecarPrep(BatchOrder order, RawBatches raw, PrepPipeline pipeline, DecodeBudget decodeBudget,
      ReindexedJpegs reindexed, DecodedImages decoded, ExecutorService pool, int threads, RoundingPolicy rounding,
      PrepCounts counts, GroupLock lock) {
    this.order = order;
    this.raw = raw;
    this.pipeline = pipeline;
    this.decoded = decoded == null || !decoded.enabled() ? null : decoded;
    this.imagePrep = new ImagePrep(pipeline, decodeBudget, ImagePrep.Decoder.NATIVE, reindexed, this.decoded);
    this.pool = pool;
    this.threads = threads;
    this.parallelism = threads;
    this.skip = pipeline.decode().onError() == PrepPipeline.OnError.SKIP;
    this.schema = PrepSchema.of(pipeline);
    int b = order.key.batchSize();
    this.cost = rounding.getRoundedSize((long) pipeline.sampleBytes() * b) + b * PrepGroup.ROW_OVERHEAD
        + PrepGroup.BATCH_OVERHEAD;
    this.counts = counts;
    this.lock = lock;
  }

  /** Where the members' capacity (batches per second; 0: unknown) is read for the cost model. */
  void consumption(DoubleSupplier batchesPerSecond) {
    consumption = batchesPerSecond;
  }

  /**
   * Re-plans the cache forms when a batch of a new epoch is prepared ({@link FormPlanner}): the decoded form's
   * quota, from the rates measured so far (CPU: this pipeline's, every group; fetch: the epoch that ended); the plan
   * before it gets the epoch's measured seconds. Until both paths are measured the decoded form may fill the forms
   * memory.
   */
  private void planForms(long epoch) {
    synchronized (lock) {
      if (epoch <= plannedEpoch) {
        return;
      }
      long now = System.nanoTime();
      if (!plans.isEmpty() && plannedEpoch >= 0) {
        plans.peekLast().put("measured_epoch_s", (now - epochStartNanos) / 1e9);
      }
      plannedEpoch = epoch;
      epochStartNanos = now;
      double[] r = imagePrep.rates(); // encoded CPU s, decoded CPU s, encoded bytes, decoded bytes per sample
      long samples = (long) order.numBatches * order.key.batchSize();
      long fetched = counts.fetchNanos.get();
      long prepared = counts.samplesPrepared;
      double fetchS = prepared > samplesAtPlan ? (fetched - fetchNanosAtPlan) / 1e9 / (prepared - samplesAtPlan) : 0;
      fetchNanosAtPlan = fetched;
      samplesAtPlan = prepared;
      ObjectNode o = JsonNodeFactory.instance.objectNode();
      o.put("epoch", epoch);
      String line;
      if (Double.isNaN(r[0]) || Double.isNaN(r[1])) {
        decoded.quota(decoded.limit());
        o.put("decoded_bytes", decoded.limit());
        line = "prep from " + (Double.isNaN(r[0]) ? "encoded bytes" : "decoded pixels") + " not measured yet:"
            + " decoded pixels may fill the forms memory (" + (decoded.limit() >> 20) + " MB) meanwhile";
        o.put("reason", line);
      } else {
        double consumer = consumption.getAsDouble() * order.key.batchSize();
        FormPlanner.Rates rates = new FormPlanner.Rates(samples, r[0], r[1], fetchS, r[2], r[3], consumer,
            parallelism, decoded.limit(), 0);
        FormPlanner.Plan plan = FormPlanner.plan(rates);
        decoded.quota(Math.max(plan.decodedBytes(), decoded.bytesHeld())); // kept images are never evicted
        plan.stats(o);
        o.put("encoded_cpu_ms_per_sample", rates.encodedCpuS() * 1e3);
        o.put("decoded_cpu_ms_per_sample", rates.decodedCpuS() * 1e3);
        o.put("consumer_samples_per_s", consumer);
        line = plan.reason();
      }
      LOG.info("prep group {}: cache forms for epoch {}: {}", order.group, epoch, line);
      plans.addLast(o);
      while (plans.size() > PLANS_KEPT) {
        plans.removeFirst();
      }
    }
  }

  /** At most {@code n} (1..pool size) decode tasks of one batch run at once from now on. */
  @Override
  public void parallelism(int n) {
    parallelism = Math.max(1, Math.min(threads, n));
  }

  @Override
  public boolean parallel() {
    return true;
  }

  @Override
  public PrepPipeline pipeline() {
    return pipeline;
  }

  @Override
  public String mode() {
    return "sidecar";
  }

  @Override
  public Schema schema() {
    return schema;
  }

  @Override
  public long batchBytes() {
    return cost;
  }

  @Override
  public long workingBytes() {
    return raw.batchBytes(); // one raw batch being decoded
  }

  @Override
  public long slotBytes() {
    return pipeline.sampleBytes() * order.key.batchSize();
  }

  @Override
  public String describeOutput() {
    return " and output " + Arrays.toString(pipeline.sampleShape()) + " " + pipeline.dtype().wire();
  }

  @Override
  public VectorSchemaRoot prepare(long pos, Staging staging) throws Exception {
    int[] ids = order.ids(pos);
    VectorSchemaRoot in = raw.fetch(pos, ids, staging);
    try {
      return decode(in, pos, ids, staging, true);
    } finally {
      in.close();
    }
  }

  /**
   * Runs the pipeline on every row of {@code raw}, spread over the prep pool. A sample that is not a decodable image
   * within the pipeline's rules fails the batch, naming it, or (on_error "skip") is left out: the kept rows close
   * up, and the batch's schema lists the skipped ones ({@link PrepSchema#SKIPPED}). {@code staged}: the result is
   * the batch staged at {@code pos} (its tensor in the group's slot when it has shared memory), not a part of one.
   */
  VectorSchemaRoot decode(VectorSchemaRoot raw, long pos, int[] ids, Staging staging, boolean staged)
      throws Exception {
    long epoch = pos / order.numBatches;
    if (decoded != null) {
      planForms(epoch);
    }
    long seed = order.key.seed();
    int n = ids.length;
    VectorSchemaRoot out = VectorSchemaRoot.create(schema, staging.allocator());
    try {
      BigIntVector idOut = (BigIntVector) out.getVector(PrepSchema.ID);
      BigIntVector labelOut = (BigIntVector) out.getVector(PrepSchema.LABEL);
      FixedSizeBinaryVector tensor = (FixedSizeBinaryVector) out.getVector(PrepSchema.TENSOR);
      BigIntVector labelIn = (BigIntVector) raw.getVector(BatchSchema.LABEL);
      VarBinaryVector payload = (VarBinaryVector) raw.getVector(BatchSchema.PAYLOAD);
      idOut.allocateNew(n);
      labelOut.allocateNew(n);
      if (staged) {
        staging.allocateTensor(tensor, pos, n, pipeline.sampleBytes());
      } else {
        tensor.allocateNew(n);
      }
      int sb = (int) pipeline.sampleBytes(); // at most Integer.MAX_VALUE (PrepPipeline.parse)
      ArrowBuf in = payload.getDataBuffer();
      ArrowBuf dst = tensor.getDataBuffer();
      String[] bad = new String[n]; // why each skipped sample was skipped
      int chunks = Math.min(n, threads * 4); // small chunks even out the threads' finishing times
      int runners = Math.min(chunks, parallelism);
      AtomicInteger nextChunk = new AtomicInteger();
      List<Callable<Void>> tasks = new ArrayList<>(runners);
      for (int r = 0; r < runners; r++) {
        tasks.add(() -> {
          long cpu0 = CPU.getCurrentThreadCpuTime();
          for (int c = nextChunk.getAndIncrement(); c < chunks; c = nextChunk.getAndIncrement()) {
            int lo = (int) ((long) n * c / chunks);
            int hi = (int) ((long) n * (c + 1) / chunks);
            for (int i = lo; i < hi; i++) {
              int start = payload.getStartOffset(i);
              int len = payload.getEndOffset(i) - start;
              try {
                imagePrep.run(in.nioBuffer(start, len), order.dataset.digest(ids[i]),
                    ImagePrep.rng(seed, epoch, ids[i]), dst.nioBuffer((long) i * sb, sb));
              } catch (BadImageException e) {
                if (!skip) {
                  throw order.dataset.badSample(ids[i], e.getMessage()).toStatus(order.sample(ids[i]) + ": "
                      + e.getMessage() + "; prep with on_error=\"skip\" leaves such samples out", e);
                }
                bad[i] = e.getMessage();
              } catch (DecodeBudget.ExhaustedException e) {
                throw CallStatus.RESOURCE_EXHAUSTED.withDescription(order.sample(ids[i]) + ": " + e.getMessage())
                    .toRuntimeException();
              }
            }
          }
          counts.prepCpuNanos.addAndGet(CPU.getCurrentThreadCpuTime() - cpu0);
          return null;
        });
      }
      for (Future<Void> f : pool.invokeAll(tasks)) {
        try {
          f.get();
        } catch (ExecutionException e) {
          if (e.getCause() instanceof Exception ex) {
            throw ex;
          }
          throw e;
        }
      }
      // The kept rows, in order, close up over the skipped ones: row k is the k-th kept sample.
      ArrowBuf validity = tensor.getValidityBuffer();
      int kept = 0;
      ArrayNode skipped = JsonNodeFactory.instance.arrayNode();
      for (int i = 0; i < n; i++) {
        if (bad[i] != null) {
          skipped.addObject().put("id", ids[i]).put("key", order.dataset.key(ids[i])).put("reason", bad[i]);
          continue;
        }
        if (kept != i) {
          dst.setBytes((long) kept * sb, dst, (long) i * sb, sb);
        }
        idOut.set(kept, ids[i]);
        if (labelIn.isNull(i)) {
          labelOut.setNull(kept);
        } else {
          labelOut.set(kept, labelIn.get(i));
        }
        BitVectorHelper.setBit(validity, kept);
        kept++;
      }
      out.setRowCount(kept);
      if (skipped.isEmpty()) {
        return out;
      }
      noteSkipped(epoch, pos % order.numBatches, skipped);
      Map<String, String> meta = new HashMap<>(schema.getCustomMetadata());
      meta.put(PrepSchema.SKIPPED, skipped.toString());
      return new VectorSchemaRoot(new Schema(schema.getFields(), meta), out.getFieldVectors(), kept);
    } catch (Exception | Error e) {
      out.close();
      throw e;
    }
  }

  private void noteSkipped(long epoch, long batch, ArrayNode skipped) {
    synchronized (lock) {
      for (var it = skipped.elements(); it.hasNext(); ) {
        ObjectNode s = ((ObjectNode) it.next()).deepCopy();
        samplesSkipped++;
        int sampleId = s.get("id").asInt();
        if (skippedLogged.add(sampleId)) { // each epoch skips it again: warn once
          LOG.warn("prep group {}: skipped {} (on_error skip): {}", order.group, order.sample(sampleId),
              s.get("reason").asText());
        }
        s.put("epoch", epoch);
        s.put("batch", batch);
        skippedRecent.addLast(s);
        if (skippedRecent.size() > SKIPPED_HISTORY) {
          skippedRecent.removeFirst();
        }
      }
    }
  }

  @Override
  public void describe(ObjectNode join) {
    describeOutput(join, pipeline);
    join.put("on_error", pipeline.decode().onError().wire());
  }

  /** A prepared sample's {@code shape}, {@code dtype} and {@code layout}, as join answers give them. */
  static void describeOutput(ObjectNode o, PrepPipeline pipeline) {
    ArrayNode shape = o.putArray("shape");
    for (int s : pipeline.sampleShape()) {
      shape.add(s);
    }
    o.put("dtype", pipeline.dtype().wire());
    o.put("layout", pipeline.layout().name());
  }

  @Override
  public void stats(ObjectNode o) {
    o.put("decoder", imagePrep.decoderName()); // for JPEGs the native path can take
    if (imagePrep.decoderReason() != null) {
      o.put("decoder_reason", imagePrep.decoderReason());
    }
    o.put("on_error", pipeline.decode().onError().wire());
    o.put("samples_skipped", samplesSkipped);
    ArrayNode forms = o.putArray("cache_forms"); // the latest plans: predicted and measured epoch seconds
    plans.forEach(forms::add);
    ArrayNode sk = o.putArray("skipped");
    skippedRecent.forEach(sk::add);
  }
}
