package io.unstall.flight.protocol;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import org.apache.arrow.flight.Ticket;

/**
 * Wire version 1 id lists: a DoGet ticket (kind FETCH: a batch of samples of one dataset by id) and the body
 * of the {@code prefetch} action (kind PLAN: the whole epoch's order). Layout (little-endian), documented in
 * protocol/README.md and pinned by golden fixtures shared with the Python shim:
 *
 * <pre>"UNST" u8 version u8 kind u16 nameLen name[nameLen] u32 epoch u32 n u64 ids[n]</pre>
 */
public final class FetchTicket {
  public static final byte[] MAGIC = {'U', 'N', 'S', 'T'};
  public static final int VERSION = 1;
  public static final int KIND_FETCH = 1;
  public static final int KIND_PLAN = 2;
  public static final int MAX_NAME_BYTES = 1024;
  public static final int MAX_IDS = 65536;
  public static final int MAX_PLAN_IDS = 1 << 28;
  private static final int HEADER = 8;

  private final int kind;
  private final String dataset;
  private final long epoch;
  private final long[] ids;

  public FetchTicket(String dataset, long epoch, long[] ids) {
    this(KIND_FETCH, dataset, epoch, ids);
  }

  public FetchTicket(int kind, String dataset, long epoch, long[] ids) {
    byte[] name = dataset.getBytes(StandardCharsets.UTF_8);
    if (name.length < 1 || name.length > MAX_NAME_BYTES) {
      throw new IllegalArgumentException("dataset name must be 1.." + MAX_NAME_BYTES + " UTF-8 bytes");
    }
    if (epoch < 0 || epoch > 0xFFFFFFFFL) {
      throw new IllegalArgumentException("epoch " + epoch + " out of range [0, 2^32)");
    }
    if (kind != KIND_FETCH && kind != KIND_PLAN) {
      throw new IllegalArgumentException("unknown kind " + kind);
    }
    if (ids.length < 1 || ids.length > maxIds(kind)) {
      throw new IllegalArgumentException("a ticket carries 1.." + maxIds(kind) + " ids, not " + ids.length);
    }
    this.kind = kind;
    this.dataset = dataset;
    this.epoch = epoch;
    this.ids = ids.clone();
  }

  private static int maxIds(int kind) {
    return kind == KIND_PLAN ? MAX_PLAN_IDS : MAX_IDS;
  }

  public int kind() {
    return kind;
  }

  public String dataset() {
    return dataset;
  }

  public long epoch() {
    return epoch;
  }

  public int size() {
    return ids.length;
  }

  public long id(int i) {
    return ids[i];
  }

  public long[] ids() {
    return ids.clone();
  }

  public byte[] toBytes() {
    byte[] name = dataset.getBytes(StandardCharsets.UTF_8);
    ByteBuffer b = ByteBuffer.allocate(HEADER + name.length + 8 + 8 * ids.length).order(ByteOrder.LITTLE_ENDIAN);
    b.put(MAGIC).put((byte) VERSION).put((byte) kind).putShort((short) name.length).put(name);
    b.putInt((int) epoch).putInt(ids.length);
    for (long id : ids) {
      b.putLong(id);
    }
    return b.array();
  }

  public Ticket toTicket() {
    return new Ticket(toBytes());
  }

  public static FetchTicket from(Ticket ticket) {
    return parse(ticket.getBytes(), KIND_FETCH);
  }

  /** Parses a FETCH ticket; every defect is a {@link MalformedTicketException} saying what is wrong. */
  public static FetchTicket parse(byte[] bytes) {
    return parse(bytes, KIND_FETCH);
  }

  /** Parses a message that must be of {@code expectedKind}. */
  public static FetchTicket parse(byte[] bytes, int expectedKind) {
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
    int kind = Byte.toUnsignedInt(b.get());
    if (kind != expectedKind) {
      throw new MalformedTicketException(
          (kind == KIND_FETCH || kind == KIND_PLAN ? "kind " + kind + " is not valid here" : "unknown kind " + kind)
              + " (expected " + expectedKind + "; 1 = FETCH, 2 = PLAN)");
    }
    int nameLen = Short.toUnsignedInt(b.getShort());
    if (nameLen < 1 || nameLen > MAX_NAME_BYTES) {
      throw new MalformedTicketException("dataset name length " + nameLen + " not in 1.." + MAX_NAME_BYTES);
    }
    need(b, nameLen, "dataset name");
    byte[] name = new byte[nameLen];
    b.get(name);
    need(b, 8, "epoch and id count");
    long epoch = Integer.toUnsignedLong(b.getInt());
    long n = Integer.toUnsignedLong(b.getInt());
    if (n < 1 || n > maxIds(kind)) {
      throw new MalformedTicketException("id count " + n + " not in 1.." + maxIds(kind));
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
    return new FetchTicket(kind, new String(name, StandardCharsets.UTF_8), epoch, ids);
  }

  private static void need(ByteBuffer b, long n, String what) {
    if (b.remaining() < n) {
      throw new MalformedTicketException(
          "truncated at byte " + b.position() + ": " + what + " needs " + n + " bytes, " + b.remaining() + " left");
    }
  }

  @Override
  public String toString() {
    return "FetchTicket{dataset=" + dataset + ", epoch=" + epoch + ", n=" + ids.length + "}";
  }
}
