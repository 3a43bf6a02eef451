package io.unstall.flight.protocol;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;

/**
 * The answer to {@code prep.next}, version 1 (protocol/README.md, "Prep groups"): where a staged batch lies in the
 * /dev/shm slot file {@code path} that the member maps read-only. A prepared batch is a {@code [rows, *shape]}
 * array of {@code dtype} at the start of the file; a raw or hybrid batch is its rows' payloads one after another
 * from the start of the file, row {@code i} at bytes {@code offsets[i]} to {@code offsets[i + 1]}, with each row's
 * key and, for a hybrid batch, whether it holds prepared pixels (uint8 HWC) instead of its stored bytes.
 */
public final class PrepNextReply {
  public static final int VERSION = 1;

  private PrepNextReply() {}

  /** A prepared batch: {@code ids.length} rows of {@code shape} ({@code dtype}: the wire name, "float32"). */
  public static ObjectNode tensor(String path, int[] shape, String dtype, long[] ids, long[] labels) {
    ObjectNode o = rows(path, ids, labels);
    ArrayNode s = o.putArray("shape");
    for (int d : shape) {
      s.add(d);
    }
    o.put("dtype", dtype);
    return o;
  }

  /**
   * A raw batch ({@code prepared} null) or a hybrid one: {@code offsets} has a row more than {@code ids} (unless the
   * batch is empty), its last the bytes of every payload together.
   */
  public static ObjectNode payloads(String path, long[] ids, long[] labels, String[] keys, int[] offsets,
      boolean[] prepared) {
    if (keys.length != ids.length || (ids.length > 0 && offsets.length != ids.length + 1)
        || (prepared != null && prepared.length != ids.length)) {
      throw new IllegalArgumentException("prep.next: " + ids.length + " rows need as many keys (got " + keys.length
          + "), one more offset (got " + offsets.length + ") and as many prepared flags");
    }
    ObjectNode o = rows(path, ids, labels);
    ArrayNode k = o.putArray("keys");
    for (String key : keys) {
      k.add(key);
    }
    ArrayNode off = o.putArray("offsets");
    for (int v : offsets) {
      off.add(v);
    }
    if (prepared != null) {
      ArrayNode p = o.putArray("prepared");
      for (boolean b : prepared) {
        p.add(b);
      }
    }
    return o;
  }

  /** {@code labels}: -1 for a sample without one. */
  private static ObjectNode rows(String path, long[] ids, long[] labels) {
    ObjectNode o = JsonNodeFactory.instance.objectNode();
    o.put("v", VERSION);
    o.put("path", path);
    o.put("rows", ids.length);
    ArrayNode i = o.putArray("ids");
    for (long id : ids) {
      i.add(id);
    }
    ArrayNode l = o.putArray("labels");
    for (long label : labels) {
      l.add(label);
    }
    return o;
  }
}
