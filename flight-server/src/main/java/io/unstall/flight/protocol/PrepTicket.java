package io.unstall.flight.protocol;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import org.apache.arrow.flight.Ticket;

/**
 * A DoGet ticket of kind 3 = PREP (protocol/README.md, "Coordinated prep"): one batch of a prep group, for
 * one member. Layout (little-endian):
 *
 * <pre>
 * "UNST" u8 version=1 u8 kind=3 u16 L group[L] u64 member u32 epoch u32 batch
 *     [f64 decode_s_per_sample f64 step_s]
 * </pre>
 *
 * The bracketed tail is optional: a hybrid member over Flight sends its measured {@link PrepRates} with each read,
 * as a shared-memory member does with {@code prep.next}; {@code rates} is null without it.
 */
public record PrepTicket(String group, long member, long epoch, long batch, PrepRates rates) {
  public static final int KIND_PREP = Wire.KIND_PREP;
  private static final int HEADER = Wire.HEADER;
  /** The optional rates tail: two f64. */
  private static final int RATES_BYTES = 16;

  public PrepTicket {
    int len = Wire.utf8("group id", group).length;
    if (len < 1 || len > Wire.MAX_NAME_BYTES) {
      throw new IllegalArgumentException("group id must be 1.." + Wire.MAX_NAME_BYTES + " UTF-8 bytes");
    }
    if (epoch < 0 || epoch > 0xFFFFFFFFL || batch < 0 || batch > 0xFFFFFFFFL) {
      throw new IllegalArgumentException("epoch and batch must be in [0, 2^32)");
    }
  }

  /** A ticket without rates. */
  public PrepTicket(String group, long member, long epoch, long batch) {
    this(group, member, epoch, batch, null);
  }

  /** True when {@code bytes} carry the unstall magic, version 1 and kind PREP; everything else goes to FETCH. */
  public static boolean isPrep(byte[] bytes) {
    return Wire.isKind(bytes, KIND_PREP);
  }

  public byte[] toBytes() {
    byte[] name = Wire.utf8("group id", group);
    int size = HEADER + name.length + 16 + (rates == null ? 0 : RATES_BYTES);
    ByteBuffer b = ByteBuffer.allocate(size).order(ByteOrder.LITTLE_ENDIAN);
    b.put(Wire.MAGIC).put((byte) Wire.VERSION).put((byte) KIND_PREP).putShort((short) name.length);
    b.put(name).putLong(member).putInt((int) epoch).putInt((int) batch);
    if (rates != null) {
      b.putDouble(rates.decodePerSample()).putDouble(rates.step());
    }
    return b.array();
  }

  public Ticket toTicket() {
    return new Ticket(toBytes());
  }

  public static PrepTicket parse(byte[] bytes) {
    if (!isPrep(bytes)) {
      throw new MalformedTicketException("not a PREP ticket (magic \"UNST\", version 1, kind 3)");
    }
    ByteBuffer b = ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN);
    if (bytes.length < HEADER) {
      throw new MalformedTicketException("truncated at byte " + bytes.length + ": header needs " + HEADER + " bytes");
    }
    b.position(6);
    int len = Short.toUnsignedInt(b.getShort());
    if (len < 1 || len > Wire.MAX_NAME_BYTES) {
      throw new MalformedTicketException("group id length " + len + " not in 1.." + Wire.MAX_NAME_BYTES);
    }
    int expected = HEADER + len + 16;
    if (bytes.length < expected) {
      throw new MalformedTicketException(
          "truncated at byte " + bytes.length + ": a PREP ticket with a " + len + "-byte group id is " + expected
              + " bytes");
    }
    int tail = bytes.length - expected;
    if (tail > 0 && tail < RATES_BYTES) {
      throw new MalformedTicketException("truncated at byte " + bytes.length + ": the rates after the batch index are "
          + RATES_BYTES + " bytes (two f64), " + tail + " present");
    }
    if (tail > RATES_BYTES) {
      int extra = tail - RATES_BYTES;
      throw new MalformedTicketException(extra + " trailing byte" + (extra == 1 ? "" : "s")
          + " after the rates, at byte " + (expected + RATES_BYTES));
    }
    byte[] name = new byte[len];
    b.get(name);
    long member = b.getLong();
    long epoch = Integer.toUnsignedLong(b.getInt());
    long batch = Integer.toUnsignedLong(b.getInt());
    PrepRates rates = tail == 0 ? null : new PrepRates(seconds(b, PrepRates.DECODE), seconds(b, PrepRates.STEP));
    return new PrepTicket(Wire.utf8("group id", name), member, epoch, batch, rates);
  }

  private static double seconds(ByteBuffer b, String field) {
    int at = b.position();
    double v = b.getDouble();
    if (!PrepRates.isSeconds(v)) {
      throw new MalformedTicketException("at byte " + at + ": rates." + PrepRates.required(field, v));
    }
    return v;
  }

  public static PrepTicket from(Ticket t) {
    return parse(t.getBytes());
  }
}
