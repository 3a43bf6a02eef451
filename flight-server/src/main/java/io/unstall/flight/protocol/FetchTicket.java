package io.unstall.flight.protocol;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import org.apache.arrow.flight.Ticket;

/**
 * A DoGet ticket, wire version 1: fetch a batch of samples of one dataset by id. Layout (little-endian),
 * documented in protocol/README.md and pinned by golden fixtures shared with the Python shim:
 *
 * <pre>"UNST" u8 version u8 kind u16 nameLen name[nameLen] u32 epoch u32 n u64 ids[n]</pre>
 */
public final class FetchTicket {
  public static final byte[] MAGIC = {'U', 'N', 'S', 'T'};
  public static final int VERSION = 1;
  public static final int KIND_FETCH = 1;
  public static final int MAX_NAME_BYTES = 1024;
  public static final int MAX_IDS = 65536;
  private static final int HEADER = 8;

  private final String dataset;
  private final long epoch;
  private final long[] ids;

  public FetchTicket(String dataset, long epoch, long[] ids) {
    byte[] name = dataset.getBytes(StandardCharsets.UTF_8);
    if (name.length < 1 || name.length > MAX_NAME_BYTES) {
      throw new IllegalArgumentException("dataset name must be 1.." + MAX_NAME_BYTES + " UTF-8 bytes");
    }
    if (epoch < 0 || epoch > 0xFFFFFFFFL) {
      throw new IllegalArgumentException("epoch " + epoch + " out of range [0, 2^32)");
    }
    if (ids.length < 1 || ids.length > MAX_IDS) {
      throw new IllegalArgumentException("a ticket carries 1.." + MAX_IDS + " ids, not " + ids.length);
    }
    this.dataset = dataset;
    this.epoch = epoch;
    this.ids = ids.clone();
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
    b.put(MAGIC).put((byte) VERSION).put((byte) KIND_FETCH).putShort((short) name.length).put(name);
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
    return parse(ticket.getBytes());
  }

  /** Parses a ticket; every defect is a {@link MalformedTicketException} saying what is wrong. */
  public static FetchTicket parse(byte[] bytes) {
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
    if (kind != KIND_FETCH) {
      throw new MalformedTicketException("unknown kind " + kind + " (1 = FETCH)");
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
    if (n < 1 || n > MAX_IDS) {
      throw new MalformedTicketException("id count " + n + " not in 1.." + MAX_IDS);
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
    return new FetchTicket(new String(name, StandardCharsets.UTF_8), epoch, ids);
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
