package io.unstall.flight.protocol;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.CharBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CharsetDecoder;
import java.nio.charset.CoderResult;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;

/**
 * What every binary message of wire version 1 shares (protocol/README.md): the {@code "UNST"} magic, the
 * version, the kinds, and the id-list layout of FETCH tickets and PLAN messages:
 *
 * <pre>"UNST" u8 version u8 kind u16 nameLen name[nameLen] u32 epoch u32 n u64 ids[n]</pre>
 *
 * (little-endian). {@link FetchTicket}, {@link Plan}, {@link PrepTicket} and {@link PeerTicket} are the messages.
 */
public final class Wire {
  public static final byte[] MAGIC = {'U', 'N', 'S', 'T'};
  public static final int VERSION = 1;
  public static final int KIND_FETCH = 1;
  public static final int KIND_PLAN = 2;
  public static final int KIND_PREP = 3;
  /** A sidecar asking the sidecar that owns samples for them (the partitioned cache, on the peer port). */
  public static final int KIND_PEER = 4;
  public static final int MAX_NAME_BYTES = 1024;
  static final int HEADER = 8;

  private Wire() {}

  /** The fields of an id-list message (FETCH or PLAN). */
  record IdList(String dataset, long epoch, long[] ids) {}

  /** Checks the fields of an id-list message of {@code kind} before it is built. */
  static void check(String what, String dataset, long epoch, long[] ids, int maxIds) {
    int len = utf8("dataset name", dataset).length;
    if (len < 1 || len > MAX_NAME_BYTES) {
      throw new IllegalArgumentException("dataset name must be 1.." + MAX_NAME_BYTES + " UTF-8 bytes");
    }
    if (epoch < 0 || epoch > 0xFFFFFFFFL) {
      throw new IllegalArgumentException("epoch " + epoch + " out of range [0, 2^32)");
    }
    if (ids.length < 1 || ids.length > maxIds) {
      throw new IllegalArgumentException(what + " carries 1.." + maxIds + " ids, not " + ids.length);
    }
  }

  static byte[] encodeIds(int kind, String dataset, long epoch, long[] ids) {
    byte[] name = utf8("dataset name", dataset);
    ByteBuffer b = ByteBuffer.allocate(HEADER + name.length + 8 + 8 * ids.length).order(ByteOrder.LITTLE_ENDIAN);
    b.put(MAGIC).put((byte) VERSION).put((byte) kind).putShort((short) name.length).put(name);
    b.putInt((int) epoch).putInt(ids.length);
    for (long id : ids) {
      b.putLong(id);
    }
    return b.array();
  }

  /** Parses an id-list message that must be of {@code kind}; every defect is a {@link MalformedTicketException}. */
  static IdList parseIds(byte[] bytes, int kind, int maxIds) {
    ByteBuffer b = ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN);
    need(b, HEADER, "header");
    byte[] magic = new byte[4];
    b.get(magic);
    if (!Arrays.equals(magic, MAGIC)) {
      throw new MalformedTicketException("bad magic (expected \"UNST\"; is this an unstall ticket?)");
    }
    int version = Byte.toUnsignedInt(b.get());
    if (version != VERSION) {
      throw new MalformedTicketException(
          "unsupported version " + version + " (this sidecar speaks version " + VERSION + ")");
    }
    int got = Byte.toUnsignedInt(b.get());
    if (got != kind) {
      throw new MalformedTicketException(
          (got >= KIND_FETCH && got <= KIND_PEER ? "kind " + got + " is not valid here" : "unknown kind " + got)
              + " (expected " + kind + "; 1 = FETCH, 2 = PLAN, 3 = PREP, 4 = PEER)");
    }
    int nameLen = Short.toUnsignedInt(b.getShort());
    if (nameLen < 1 || nameLen > MAX_NAME_BYTES) {
      throw new MalformedTicketException("dataset name length " + nameLen + " not in 1.." + MAX_NAME_BYTES);
    }
    need(b, nameLen, "dataset name");
    byte[] name = new byte[nameLen];
    b.get(name);
    need(b, 8, "epoch and id count");
    String dataset = utf8("dataset name", name);
    long epoch = Integer.toUnsignedLong(b.getInt());
    long n = Integer.toUnsignedLong(b.getInt());
    if (n < 1 || n > maxIds) {
      throw new MalformedTicketException("id count " + n + " not in 1.." + maxIds);
    }
    need(b, 8 * n, n + " ids");
    long[] ids = new long[(int) n];
    for (int i = 0; i < n; i++) {
      ids[i] = b.getLong();
    }
    if (b.hasRemaining()) {
      int extra = b.remaining();
      throw new MalformedTicketException(extra + " trailing byte" + (extra == 1 ? "" : "s") + " after the ids");
    }
    return new IdList(dataset, epoch, ids);
  }

  /**
   * Decodes a name strictly, as Python's {@code bytes.decode("utf-8")} does: bytes that are not well-formed
   * UTF-8 (a stray continuation byte, an overlong form, an encoded surrogate, a cut sequence) are a
   * {@link MalformedTicketException}, never replaced by U+FFFD (a lenient decoder would accept a name Python
   * rejects, and two different names would decode to one).
   */
  static String utf8(String what, byte[] bytes) {
    ByteBuffer in = ByteBuffer.wrap(bytes);
    CharBuffer out = CharBuffer.allocate(bytes.length); // UTF-8 never decodes to more chars than bytes
    CharsetDecoder d = StandardCharsets.UTF_8.newDecoder()
        .onMalformedInput(CodingErrorAction.REPORT)
        .onUnmappableCharacter(CodingErrorAction.REPORT);
    CoderResult r = d.decode(in, out, true);
    if (!r.isError()) {
      r = d.flush(out);
    }
    if (r.isError()) {
      throw new MalformedTicketException(what + " is not UTF-8 (invalid sequence of " + r.length() + " byte"
          + (r.length() == 1 ? "" : "s") + " at byte " + in.position() + ")");
    }
    return out.flip().toString();
  }

  /** Encodes a name strictly: a string with an unpaired surrogate has no UTF-8 form (Python's encode refuses it). */
  static byte[] utf8(String what, String name) {
    try {
      ByteBuffer b = StandardCharsets.UTF_8.newEncoder()
          .onMalformedInput(CodingErrorAction.REPORT)
          .onUnmappableCharacter(CodingErrorAction.REPORT)
          .encode(CharBuffer.wrap(name));
      return Arrays.copyOf(b.array(), b.limit());
    } catch (CharacterCodingException e) {
      throw new IllegalArgumentException(what + " is not valid Unicode (it has an unpaired surrogate)");
    }
  }

  /** The id count an id-list message of {@code kind} declares in its header, or -1 if the header is malformed. */
  static long declaredCount(byte[] bytes, int kind) {
    if (!isKind(bytes, kind) || bytes.length < HEADER) {
      return -1;
    }
    ByteBuffer b = ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN);
    int at = HEADER + Short.toUnsignedInt(b.getShort(HEADER - 2)) + 4;
    return at + 4 <= bytes.length ? Integer.toUnsignedLong(b.getInt(at)) : -1;
  }

  /** True when {@code bytes} start with the magic, version 1 and {@code kind}. */
  static boolean isKind(byte[] bytes, int kind) {
    return bytes.length >= 6 && Arrays.equals(bytes, 0, 4, MAGIC, 0, 4) && bytes[4] == VERSION && bytes[5] == kind;
  }

  static void need(ByteBuffer b, long n, String what) {
    if (b.remaining() < n) {
      throw new MalformedTicketException(
          "truncated at byte " + b.position() + ": " + what + " needs " + n + " bytes, " + b.remaining() + " left");
    }
  }
}
