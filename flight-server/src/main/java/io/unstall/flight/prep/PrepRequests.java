package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.unstall.flight.protocol.PrepRates;
import java.io.IOException;
import java.util.Iterator;
import java.util.List;
import org.apache.arrow.vector.compression.CompressionUtil;

/**
 * The JSON bodies of the {@code prep.*} actions and the descriptor command of a {@code prep.put} upload
 * (protocol/README.md, "Coordinated prep"), parsed and checked before anything is looked up. Every defect is an
 * IllegalArgumentException naming the action and the field; {@code PrepServiceFuzzTest} holds them to that.
 */
final class PrepRequests {
  private static final ObjectMapper JSON = new ObjectMapper();
  /** Epochs and batch indices are u32 on the wire (the PREP ticket), so in JSON too. */
  private static final long MAX_U32 = 0xFFFFFFFFL;

  private PrepRequests() {}

  /** A {@code prep.join} body. {@code pipeline} is null for a raw group and for an external one ({@code external}). */
  record Join(String dataset, PrepPipeline pipeline, String external, int batchSize, long seed, boolean shuffle,
      boolean dropLast, PrepGroup.Settings settings, long epochs, long startEpoch, long startBatch, String name,
      RankShare.Spec share, Double cpuLoad, int cacheWindow, String cacheSnapshot) {

    /** What, besides the dataset, seed, batch size and order, decides which group a member joins. */
    String fingerprint() {
      return external != null
          ? PrepService.EXTERNAL_PREFIX + external
          : pipeline == null ? "raw" : cpuLoad != null ? "hybrid:" + cpuLoad + ":" + pipeline.fingerprint()
          : pipeline.fingerprint();
    }
  }

  /** {@code prep.heartbeat}, {@code prep.leave}: a member of a group. */
  record Member(String group, long member) {}

  /** {@code prep.claim}, {@code prep.next}, {@code prep.put}: one batch, for a member of a group. */
  record At(String group, long member, long epoch, long batch) {}

  /** An action's body: one JSON object. */
  static JsonNode body(String action, byte[] body) {
    JsonNode n;
    try {
      n = JSON.readTree(body);
    } catch (IOException e) {
      throw new IllegalArgumentException(action + ": the body is not valid JSON (" + e.getMessage() + ")");
    }
    if (n == null || !n.isObject()) {
      throw new IllegalArgumentException(action + ": the body must be a JSON object");
    }
    return n;
  }

  static Member member(JsonNode b) {
    return new Member(group(b), memberOf(b));
  }

  static At at(String action, JsonNode b) {
    return new At(group(b), memberOf(b), u32(action, b, "epoch"), u32(action, b, "batch"));
  }

  /**
   * {@code prep.next}'s {@code "released"}: the batches, {@code [[epoch, batch], ...]}, whose /dev/shm files the
   * member no longer maps; null when absent (a shim that does not report: its slots are never reused).
   */
  static long[][] released(String action, JsonNode b) {
    JsonNode r = b.get("released");
    if (r == null || r.isNull()) {
      return null;
    }
    if (!r.isArray() || r.size() > MAX_RELEASED) {
      throw new IllegalArgumentException(action + ": \"released\" must be a list of at most " + MAX_RELEASED
          + " [epoch, batch] pairs, got " + (r.isArray() ? r.size() + " entries" : r.getNodeType().toString()));
    }
    long[][] out = new long[r.size()][];
    for (int i = 0; i < r.size(); i++) {
      JsonNode e = r.get(i);
      if (!e.isArray() || e.size() != 2) {
        throw new IllegalArgumentException(action + ": \"released\"[" + i + "] must be [epoch, batch], got " + e);
      }
      out[i] = new long[] {u32Value(action, e.get(0), "epoch"), u32Value(action, e.get(1), "batch")};
    }
    return out;
  }

  /**
   * {@code prep.next}'s {@code "rates"}: {@code {"decode_s_per_sample", "step_s"}}, both finite and positive; null
   * when absent (a member that does not measure them: not hybrid, or an older shim).
   */
  static PrepRates rates(String action, JsonNode b) {
    JsonNode r = b.get("rates");
    if (r == null || r.isNull()) {
      return null;
    }
    if (!r.isObject()) {
      throw new IllegalArgumentException(action + ": \"rates\" must be {\"decode_s_per_sample\", \"step_s\"}, got "
          + r.getNodeType());
    }
    return new PrepRates(seconds(action, r, PrepRates.DECODE), seconds(action, r, PrepRates.STEP));
  }

  private static double seconds(String action, JsonNode r, String field) {
    JsonNode v = r.get(field);
    if (v == null || !v.isNumber() || !PrepRates.isSeconds(v.asDouble())) {
      throw new IllegalArgumentException(action + ": \"rates\"." + PrepRates.required(field, v));
    }
    return v.asDouble();
  }

  /** The most batches one {@code prep.next} may report released. */
  static final int MAX_RELEASED = 4096;

  /** {@code prep.claim} with {@code "next": true}: a member's epoch (the batch is the sidecar's to pick; 0 here). */
  static At epochOf(String action, JsonNode b) {
    JsonNode e = b.get("epoch");
    if (e == null || !e.isIntegralNumber() || !e.canConvertToLong() || e.asLong() < 0 || e.asLong() > MAX_U32) {
      throw new IllegalArgumentException(action + ": \"epoch\" (an integer in 0.." + MAX_U32 + ") is required, got "
          + e);
    }
    return new At(group(b), memberOf(b), e.asLong(), 0);
  }

  /** {@code prep.join}'s {@code "compression"}: {@code "lz4"}, {@code "zstd"}, or absent/null for none. */
  static CompressionUtil.CodecType compression(JsonNode b) {
    JsonNode c = b.get("compression");
    if (c != null && !c.isNull() && !c.isTextual()) {
      throw new IllegalArgumentException("prep.join: \"compression\" must be \"lz4\", \"zstd\" or null, got " + c);
    }
    return c == null || c.isNull() ? null : CompressedBatches.codec(c.asText());
  }

  /** The descriptor command of a DoPut upload: {@code {"prep.put":{"group","member","epoch","batch"}}}. */
  static At put(byte[] command) {
    JsonNode c;
    try {
      c = JSON.readTree(command);
    } catch (IOException e) {
      throw new IllegalArgumentException("prep.put: the descriptor command is not valid JSON");
    }
    c = c == null ? null : c.get("prep.put");
    if (c == null || !c.isObject()) {
      throw new IllegalArgumentException(
          "prep.put: expected {\"prep.put\":{\"group\",\"member\",\"epoch\",\"batch\"}}");
    }
    return at("prep.put", c);
  }

  /**
   * The fields of a {@code prep.join} body, in the order the shim's {@code encode_prep_join} writes them
   * (protocol/fixtures/prep-join-v1.json). A body with any other field is refused: a misspelt option would otherwise
   * be ignored without a word.
   */
  static final List<String> JOIN_FIELDS = List.of("v", "dataset", "pipeline", "batch_size", "seed", "shuffle",
      "drop_last", "group_size", "join_timeout_s", "member_timeout_s", "name", "window", "autotune", "staging_bytes",
      "compression", "share", "hybrid", "order", "cache_snapshot", "epochs", "start_epoch", "start_batch", "shm");

  /** A {@code prep.join} body; its pipeline's decode fields default to, and are capped by, {@code limits}. */
  static Join join(JsonNode b, PrepPipeline.DecodeLimits limits) {
    for (Iterator<String> names = b.fieldNames(); names.hasNext(); ) {
      String name = names.next();
      if (!JOIN_FIELDS.contains(name)) {
        throw new IllegalArgumentException("prep.join: unknown field \"" + name + "\" (the fields are "
            + String.join(", ", JOIN_FIELDS) + ")");
      }
    }
    String dataset = b.path("dataset").asText("");
    if (dataset.isEmpty()) {
      throw new IllegalArgumentException("prep.join: \"dataset\" (a registered dataset's name) is required");
    }
    JsonNode p = b.get("pipeline");
    String external = null;
    if (p != null && p.isObject() && p.has("python")) {
      // Python-side transforms: the sidecar shares the fetch, the order and the batches members upload.
      external = p.get("python").asText("");
      if (external.isEmpty() || p.size() != 1) {
        throw new IllegalArgumentException(
            "prep.join: a Python-side pipeline is {\"python\": \"<fingerprint of the transforms>\"}, got " + p);
      }
    }
    PrepPipeline pipeline = p == null || p.isNull() || external != null ? null : PrepPipeline.parse(p, limits);
    int batchSize = intIn(b, "batch_size", 1, 65536, -1);
    if (b.has("seed") && !b.get("seed").canConvertToLong()) {
      throw new IllegalArgumentException("prep.join: \"seed\" must be an integer, got " + b.get("seed"));
    }
    long seed = b.path("seed").asLong(0);
    JsonNode staging = b.get("staging_bytes");
    if (staging != null && !staging.isNull()
        && !(staging.isIntegralNumber() && staging.canConvertToLong() && staging.asLong() >= 0)) {
      throw new IllegalArgumentException(
          "prep.join: \"staging_bytes\" must be a non-negative integer (0: the default), got " + staging);
    }
    JsonNode autotune = b.get("autotune");
    if (autotune != null && !autotune.isNull() && !autotune.isBoolean()) {
      throw new IllegalArgumentException("prep.join: \"autotune\" must be true or false, got " + autotune);
    }
    PrepGroup.Settings s = new PrepGroup.Settings(
        intIn(b, "window", 1, 1024, 4),
        b.path("staging_bytes").asLong(0),
        seconds(b, "member_timeout_s", 30),
        intIn(b, "group_size", 1, 1024, 1),
        seconds(b, "join_timeout_s", 60),
        b.path("shm").asBoolean(false),
        b.path("autotune").asBoolean(true),
        b.hasNonNull("window"));
    long epochs = intIn(b, "epochs", 0, Integer.MAX_VALUE, 0);
    // A resumed member (restored from a checkpoint) starts at batch start_batch of epoch start_epoch.
    long startEpoch = b.hasNonNull("start_epoch") ? intIn(b, "start_epoch", 0, Integer.MAX_VALUE, 0) : -1;
    long startBatch = intIn(b, "start_batch", 0, Integer.MAX_VALUE, 0);
    if (startEpoch < 0 && startBatch > 0) {
      throw new IllegalArgumentException("prep.join: \"start_batch\" needs \"start_epoch\"");
    }
    RankShare.Spec share = share(b.get("share"));
    if (share != null && startEpoch < 0 && (share.consumed().length > 0 || share.skip() > 0)) {
      throw new IllegalArgumentException("prep.join: \"share\" with \"consumed\" or \"skip\" needs \"start_epoch\""
          + " (the epoch they apply to)");
    }
    int cacheWindow = cacheWindow(b.get("order"));
    JsonNode snapshot = b.get("cache_snapshot");
    if (snapshot != null && !snapshot.isNull() && (!snapshot.isTextual() || cacheWindow == 0 || startEpoch < 0)) {
      throw new IllegalArgumentException("prep.join: \"cache_snapshot\" (a string, from prep.order) is the snapshot"
          + " of a resumed member's epoch: it needs \"order\": {\"cache_first\": window} and \"start_epoch\"");
    }
    return new Join(dataset, pipeline, external, batchSize, seed, b.path("shuffle").asBoolean(true),
        b.path("drop_last").asBoolean(false), s, epochs, startEpoch, startBatch, b.path("name").asText(""), share,
        hybrid(b.get("hybrid"), pipeline), cacheWindow,
        snapshot == null || snapshot.isNull() ? null : snapshot.asText());
  }

  /**
   * {@code prep.join}'s {@code "order"}: {@code {"cache_first": window}} (each epoch's seeded order reordered cached
   * samples first within aligned windows of that many positions, {@link BatchOrder#cacheFirst}); 0 when absent.
   */
  private static int cacheWindow(JsonNode o) {
    if (o == null || o.isNull()) {
      return 0;
    }
    if (!o.isObject() || o.size() != 1 || !o.has("cache_first")) {
      throw new IllegalArgumentException("prep.join: \"order\" is {\"cache_first\": window} (positions a sample may"
          + " move), got " + o);
    }
    return intIn(o, "cache_first", 1, Integer.MAX_VALUE, -1);
  }

  /**
   * {@code prep.join}'s {@code "hybrid": {"cpu_load": 0..1 | "auto"}}: the share of each batch the sidecar prepares
   * with the pipeline (uint8 NHWC, on_error raise), the rest left encoded for the members' device; "auto" is -1
   * (tuned online). Null when absent.
   */
  private static Double hybrid(JsonNode h, PrepPipeline pipeline) {
    if (h == null || h.isNull()) {
      return null;
    }
    if (!h.isObject() || !h.has("cpu_load") || h.size() != 1) {
      throw new IllegalArgumentException("prep.join: \"hybrid\" is {\"cpu_load\": a number in [0, 1] or \"auto\"}, got "
          + h);
    }
    if (pipeline == null) {
      throw new IllegalArgumentException("prep.join: \"hybrid\" needs a sidecar \"pipeline\" (the ops the sidecar runs"
          + " on its share of each batch)");
    }
    if (pipeline.dtype() != PrepPipeline.DType.UINT8 || pipeline.layout() != PrepPipeline.Layout.NHWC
        || pipeline.decode().onError() != PrepPipeline.OnError.RAISE) {
      throw new IllegalArgumentException("prep.join: a \"hybrid\" group's pipeline is uint8, NHWC and on_error"
          + " \"raise\" (the device normalizes; a batch is decoded whole), got " + pipeline.dtype().wire() + ", "
          + pipeline.layout() + ", on_error " + pipeline.decode().onError().wire());
    }
    JsonNode c = h.get("cpu_load");
    if (c.isTextual() && c.asText().equals("auto")) {
      return -1.0;
    }
    if (!c.isNumber() || !(c.asDouble() >= 0 && c.asDouble() <= 1)) {
      throw new IllegalArgumentException("prep.join: \"hybrid\".\"cpu_load\" must be a number in [0, 1] or \"auto\","
          + " got " + c);
    }
    return c.asDouble();
  }

  /**
   * {@code prep.join}'s {@code "share"}: {@code {"world_size","rank"}}, optional {@code "consumed": [[start, end),
   * ...]} (batches of {@code start_epoch} the job read before its checkpoint) and {@code "skip"} (the batches of its
   * share there this member read itself); null when absent.
   */
  private static RankShare.Spec share(JsonNode s) {
    if (s == null || s.isNull()) {
      return null;
    }
    if (!s.isObject()) {
      throw new IllegalArgumentException("prep.join: \"share\" must be {\"world_size\", \"rank\", \"consumed\","
          + " \"skip\"}, got " + s);
    }
    int world = intIn(s, "world_size", 1, 65536, -1);
    int rank = intIn(s, "rank", 0, world - 1, -1);
    long skip = intIn(s, "skip", 0, Integer.MAX_VALUE, 0);
    JsonNode c = s.get("consumed");
    if (c != null && !c.isNull() && (!c.isArray() || c.size() > MAX_RELEASED)) {
      throw new IllegalArgumentException("prep.join: \"consumed\" must be a list of at most " + MAX_RELEASED
          + " [start, end) batch ranges, got " + c);
    }
    long[][] consumed = new long[c == null || c.isNull() ? 0 : c.size()][];
    for (int i = 0; i < consumed.length; i++) {
      JsonNode r = c.get(i);
      if (!r.isArray() || r.size() != 2 || !isU32(r.get(0)) || !isU32(r.get(1))) {
        throw new IllegalArgumentException("prep.join: \"consumed\"[" + i + "] must be [start, end), batch indices"
            + " in 0.." + MAX_U32 + ", got " + r);
      }
      consumed[i] = new long[] {r.get(0).asLong(), r.get(1).asLong()};
    }
    return new RankShare.Spec(world, rank, consumed, skip);
  }

  /** A remote prep worker's batch: {@code {"group","worker","epoch","batch"}} (the worker id in {@code member}). */
  static At workerAt(String action, JsonNode b) {
    JsonNode w = b.get("worker");
    if (w == null || !w.isIntegralNumber() || !w.canConvertToLong()) {
      throw new IllegalArgumentException(action + ": \"worker\" (the id peer.prep.enlist returned) is required, got "
          + w);
    }
    return new At(group(b), w.asLong(), u32(action, b, "epoch"), u32(action, b, "batch"));
  }

  static String group(JsonNode b) {
    return b.path("group").asText("");
  }

  private static long memberOf(JsonNode b) {
    JsonNode m = b.get("member");
    if (m == null || !m.isIntegralNumber() || !m.canConvertToLong()) {
      throw new IllegalArgumentException("\"member\" (the id prep.join returned) is required, got " + m);
    }
    return m.asLong();
  }

  private static long u32(String action, JsonNode b, String field) {
    return u32Value(action, b.get(field), field);
  }

  private static boolean isU32(JsonNode v) {
    return v != null && v.isIntegralNumber() && v.canConvertToLong() && v.asLong() >= 0 && v.asLong() <= MAX_U32;
  }

  private static long u32Value(String action, JsonNode v, String field) {
    if (!isU32(v)) {
      throw new IllegalArgumentException(action + ": \"epoch\" and \"batch\" (integers in 0.." + MAX_U32
          + ") are required; \"" + field + "\" is " + v);
    }
    return v.asLong();
  }

  /** An integer field in [min, max]; absent or null is {@code dflt}, or an error where {@code dflt} < 0. */
  private static int intIn(JsonNode b, String field, int min, int max, int dflt) {
    JsonNode v = b.get(field);
    if (v == null || v.isNull()) {
      if (dflt < 0) {
        throw new IllegalArgumentException("prep.join: \"" + field + "\" is required");
      }
      return dflt;
    }
    // canConvertToLong: a BigInteger's asLong() wraps, and 2^64 + 5 would pass as 5.
    if (!v.isIntegralNumber() || !v.canConvertToLong() || v.asLong() < min || v.asLong() > max) {
      throw new IllegalArgumentException("prep.join: \"" + field + "\" must be an integer in " + min + ".." + max
          + ", got " + v);
    }
    return v.asInt();
  }

  private static long seconds(JsonNode b, String field, double dflt) {
    JsonNode v = b.get(field);
    double s = v == null || v.isNull() ? dflt : v.asDouble(-1);
    if (v != null && !v.isNull() && !v.isNumber() || !(s > 0) || s > 86400) {
      throw new IllegalArgumentException("prep.join: \"" + field + "\" must be seconds in (0, 86400], got " + v);
    }
    return (long) (s * 1e9);
  }
}
