package io.unstall.flight.protocol;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

/**
 * The answer to {@code prep.next}, version 1 (protocol/README.md, "Prep groups"): where a staged batch lies in the
 * /dev/shm slot file {@code path} that the member maps read-only. A prepared batch is a {@code [rows, *shape]}
 * array of {@code dtype} at the start of the file; a raw or hybrid batch is its rows' payloads one after another
 * from the start of the file, row {@code i} at bytes {@code offsets[i]} to {@code offsets[i + 1]}, with each row's
 * key, the header the sidecar vouches for (a JPEG's, packed; null for none) and, for a hybrid batch, whether it holds
 * prepared pixels (uint8 HWC) instead of its stored bytes.
 */
public final class PrepNextReply {
  public static final int VERSION = 1;
  private static final ObjectMapper JSON = new ObjectMapper();

  private PrepNextReply() {}

  /** A prepared batch: {@code ids.length} rows of {@code shape} ({@code dtype}: the wire name, "float32"). */
  public static ObjectNode tensor(String path, int[] shape, String dtype, long[] ids, long[] labels) {
    ObjectNode o = rows(path, ids, labels);
    o.set("shape", JSON.valueToTree(shape));
    o.put("dtype", dtype);
    return o;
  }

  /**
   * A raw batch ({@code prepared} null) or a hybrid one: {@code offsets} has a row more than {@code ids} (unless the
   * batch is empty), its last the bytes of every payload together; {@code headers} each row's packed header, negative
   * for none (sent as null).
   */
  public static ObjectNode payloads(String path, long[] ids, long[] labels, String[] keys, int[] offsets,
      long[] headers, boolean[] prepared) {
    if (keys.length != ids.length || (ids.length > 0 && offsets.length != ids.length + 1)
        || headers.length != ids.length || (prepared != null && prepared.length != ids.length)) {
      throw new IllegalArgumentException("prep.next: " + ids.length + " rows need as many keys (got " + keys.length
          + "), one more offset (got " + offsets.length + "), as many headers (got " + headers.length
          + ") and as many prepared flags");
    }
    ObjectNode o = rows(path, ids, labels);
    o.set("keys", JSON.valueToTree(keys));
    o.set("offsets", JSON.valueToTree(offsets));
    ArrayNode h = o.putArray("headers");
    for (long v : headers) {
      if (v < 0) {
        h.addNull();
      } else {
        h.add(v);
      }
    }
    if (prepared != null) {
      o.set("prepared", JSON.valueToTree(prepared));
    }
    return o;
  }

  /** {@code labels}: -1 for a sample without one. */
  private static ObjectNode rows(String path, long[] ids, long[] labels) {
    ObjectNode o = JSON.createObjectNode();
    o.put("v", VERSION);
    o.put("path", path);
    o.put("rows", ids.length);
    o.set("ids", JSON.valueToTree(ids));
    o.set("labels", JSON.valueToTree(labels));
    return o;
  }
}
