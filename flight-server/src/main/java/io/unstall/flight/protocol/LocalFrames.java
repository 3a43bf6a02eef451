package io.unstall.flight.protocol;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.List;

/**
 * The same-host data plane's frames ({@code UNSL} version 1, protocol/README.md): requests and replies over
 * the sidecar's Unix socket. Every message is {@code u32 length} then the body; request bodies start with a
 * kind byte. Pinned by golden fixtures shared with the Python shim ({@code local-*-v1.bin}).
 */
public final class LocalFrames {
  public static final byte[] MAGIC = {'U', 'N', 'S', 'L'};
  public static final int VERSION = 1;
  /** Frames carry at most this many body bytes (a PLAN of 2^25 ids fits). */
  public static final int MAX_FRAME = 16 + 8 * (1 << 25);
  public static final int MAX_FETCH_IDS = FetchTicket.MAX_IDS;
  public static final int MAX_PLAN_IDS = 1 << 25;

  public static final int HELLO = 1;
  public static final int OPEN = 2;
  public static final int FETCH = 3;
  public static final int PLAN = 4;
  public static final int CLOSE = 5;
  public static final int PREP = 6;
  public static final int CACHED = 7;
  /** The longest action type a PREP request may name ({@code prep.*}, as DoAction would). */
  public static final int MAX_ACTION_TYPE = 64;

  public static final int REPLY_OK = 0;
  public static final int REPLY_ERROR = 1;
  public static final int REPLY_BATCH = 2;

  public static final int INVALID_ARGUMENT = 1;
  public static final int NOT_FOUND = 2;
  public static final int INTERNAL = 3;
  public static final int RESOURCE_EXHAUSTED = 4;
  public static final int UNAUTHENTICATED = 5;
  public static final int UNAVAILABLE = 6;

  private static final ObjectMapper JSON = new ObjectMapper();

  private LocalFrames() {}

  /** A FETCH or PLAN request: the session, the epoch and the ids. */
  public record IdList(long session, long epoch, long[] ids) {}

  /** The token of a HELLO body (after the kind byte); a defect is an IllegalArgumentException. */
  public static byte[] parseHello(ByteBuffer b) {
    need(b, 7, "HELLO header");
    byte[] magic = new byte[4];
    b.get(magic);
    if (!Arrays.equals(magic, MAGIC)) {
      throw malformed("bad magic in HELLO (expected \"UNSL\")");
    }
    int version = Byte.toUnsignedInt(b.get());
    if (version != VERSION) {
      throw malformed("unsupported version " + version + " (this sidecar speaks version " + VERSION + ")");
    }
    int len = Short.toUnsignedInt(b.getShort());
    need(b, len, "token");
    byte[] token = new byte[len];
    b.get(token);
    end(b);
    return token;
  }

  /** An OPEN request: the dataset and a name for the session (for stats). */
  public record Open(String dataset, String name) {}

  /** An OPEN body (after the kind byte): UTF-8 JSON {@code {"dataset": name, "name": ...}}. */
  public static Open parseOpen(ByteBuffer b) {
    byte[] body = new byte[b.remaining()];
    b.get(body);
    JsonNode req;
    try {
      req = JSON.readTree(body); // from the bytes: malformed UTF-8 is an error, not U+FFFD
    } catch (JsonProcessingException e) {
      throw malformed("OPEN body is not UTF-8 JSON (" + e.getOriginalMessage() + ")");
    } catch (java.io.IOException e) {
      throw malformed("OPEN body is not UTF-8 JSON (" + e.getMessage() + ")");
    }
    if (req == null || !req.isObject()) {
      throw malformed("OPEN body must be a JSON object {\"dataset\": name, \"name\": ...}");
    }
    String dataset = req.path("dataset").asText("");
    if (dataset.isEmpty()) {
      throw new IllegalArgumentException("OPEN needs {\"dataset\": name}");
    }
    return new Open(dataset, req.path("name").asText("pid ?"));
  }

  /** A FETCH or PLAN body (after the kind byte). */
  public static IdList parseIds(ByteBuffer b, int kind) {
    need(b, 16, "session, epoch and id count");
    long session = b.getLong();
    long epoch = Integer.toUnsignedLong(b.getInt());
    long n = Integer.toUnsignedLong(b.getInt());
    int max = kind == PLAN ? MAX_PLAN_IDS : MAX_FETCH_IDS;
    if (n < 1 || n > max) {
      throw malformed("id count " + n + " not in 1.." + max);
    }
    need(b, 8 * n, n + " ids");
    long[] ids = new long[(int) n];
    b.asLongBuffer().get(ids);
    b.position(b.position() + 8 * (int) n);
    end(b);
    return new IdList(session, epoch, ids);
  }

  /** The request body of a CLOSE or CACHED (kind byte included), as a client sends it. */
  public static byte[] encodeSession(int kind, long session) {
    return ByteBuffer.allocate(9).order(ByteOrder.LITTLE_ENDIAN).put((byte) kind).putLong(session).array();
  }

  /** A CLOSE or CACHED body (after the kind byte): the session id. */
  public static long parseSession(ByteBuffer b) {
    need(b, 8, "session id");
    long s = b.getLong();
    end(b);
    return s;
  }

  /** The request body of a FETCH or PLAN (kind byte included), as a client sends it. */
  public static byte[] encodeIds(int kind, long session, long epoch, long[] ids) {
    ByteBuffer b = ByteBuffer.allocate(17 + 8 * ids.length).order(ByteOrder.LITTLE_ENDIAN);
    b.put((byte) kind).putLong(session).putInt((int) epoch).putInt(ids.length);
    for (long id : ids) {
      b.putLong(id);
    }
    return b.array();
  }

  /** A PREP request: a {@code prep.*} action and its body (UTF-8 JSON), as a Flight DoAction would carry them. */
  public record PrepAction(String type, byte[] body) {}

  /**
   * A PREP body (after the kind byte): {@code u16 L, type[L]} (UTF-8, {@code prep.*}), then the action's body to
   * the end of the frame. The body is the action's to parse, as over Flight.
   */
  public static PrepAction parsePrep(ByteBuffer b) {
    need(b, 2, "PREP action type length");
    int len = Short.toUnsignedInt(b.getShort());
    if (len < 1 || len > MAX_ACTION_TYPE) {
      throw malformed("PREP action type length " + len + " not in 1.." + MAX_ACTION_TYPE);
    }
    need(b, len, "PREP action type");
    byte[] t = new byte[len];
    b.get(t);
    String type;
    try {
      type = StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
          .onUnmappableCharacter(CodingErrorAction.REPORT).decode(ByteBuffer.wrap(t)).toString();
    } catch (CharacterCodingException e) {
      throw malformed("PREP action type is not UTF-8");
    }
    if (!type.startsWith("prep.")) {
      throw malformed("PREP carries prep.* actions only, not '" + type + "'");
    }
    byte[] body = new byte[b.remaining()];
    b.get(body);
    return new PrepAction(type, body);
  }

  /** The request body of a PREP (kind byte included), as a client sends it. */
  public static byte[] encodePrep(String type, byte[] body) {
    byte[] t = type.getBytes(StandardCharsets.UTF_8);
    return ByteBuffer.allocate(3 + t.length + body.length).order(ByteOrder.LITTLE_ENDIAN)
        .put((byte) PREP).putShort((short) t.length).put(t).put(body).array();
  }

  public static byte[] ok(String json) {
    return ok(json.getBytes(StandardCharsets.UTF_8));
  }

  /** An OK reply of UTF-8 JSON bytes. */
  public static byte[] ok(byte[] j) {
    byte[] out = new byte[1 + j.length];
    out[0] = REPLY_OK;
    System.arraycopy(j, 0, out, 1, j.length);
    return out;
  }

  public static byte[] error(int code, String message) {
    byte[] m = message.getBytes(StandardCharsets.UTF_8);
    byte[] out = new byte[2 + m.length];
    out[0] = REPLY_ERROR;
    out[1] = (byte) code;
    System.arraycopy(m, 0, out, 2, m.length);
    return out;
  }

  /**
   * A BATCH reply body. {@code labelValid[i]} false leaves {@code labels[i]} undefined; {@code segs[i]} indexes
   * {@code segments} (file names in the sidecar's shared-memory directory).
   */
  public static ByteBuffer batch(
      long[] ids, long[] labels, boolean[] labelValid, long[] offsets, int[] lengths, int[] segs, byte[][] keys,
      List<String> segments) {
    int n = ids.length;
    int keyBytes = 0;
    for (byte[] k : keys) {
      keyBytes += k.length;
    }
    byte[][] names = new byte[segments.size()][];
    int table = 0;
    for (int i = 0; i < names.length; i++) {
      names[i] = segments.get(i).getBytes(StandardCharsets.UTF_8);
      table += 2 + names[i].length;
    }
    ByteBuffer b = ByteBuffer.allocate(16 + 37 * n + keyBytes + table).order(ByteOrder.LITTLE_ENDIAN);
    b.put((byte) REPLY_BATCH).put((byte) 0).put((byte) 0).put((byte) 0);
    b.putInt(n).putInt(names.length).putInt(keyBytes);
    for (long v : ids) {
      b.putLong(v);
    }
    for (int i = 0; i < n; i++) {
      b.putLong(labelValid[i] ? labels[i] : 0);
    }
    for (long v : offsets) {
      b.putLong(v);
    }
    for (int v : lengths) {
      b.putInt(v);
    }
    for (int v : segs) {
      b.putInt(v);
    }
    int end = 0;
    for (byte[] k : keys) {
      end += k.length;
      b.putInt(end);
    }
    for (boolean v : labelValid) {
      b.put((byte) (v ? 1 : 0));
    }
    for (byte[] k : keys) {
      b.put(k);
    }
    for (byte[] name : names) {
      b.putShort((short) name.length).put(name);
    }
    return b.flip();
  }

  private static void need(ByteBuffer b, long n, String what) {
    if (b.remaining() < n) {
      throw malformed("truncated at byte " + (b.position() - 1) + ": " + what + " needs " + n + " bytes, "
          + b.remaining() + " left");
    }
  }

  private static void end(ByteBuffer b) {
    if (b.hasRemaining()) {
      throw malformed(b.remaining() + " trailing byte" + (b.remaining() == 1 ? "" : "s"));
    }
  }

  private static IllegalArgumentException malformed(String detail) {
    return new IllegalArgumentException("malformed local request: " + detail);
  }
}
