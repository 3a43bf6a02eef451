package io.unstall.flight.cache;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HexFormat;

/**
 * The SHA-256 of a sample's bytes: the cache's content address (Quiver). Two datasets that hold the same
 * bytes share one entry, and only a party that knows the digest (it read the bytes, or holds the dataset's
 * manifest) can name the entry.
 */
public record Digest(long a, long b, long c, long d) {
  public static final int BYTES = 32;
  private static final ThreadLocal<MessageDigest> SHA256 =
      ThreadLocal.withInitial(
          () -> {
            try {
              return MessageDigest.getInstance("SHA-256");
            } catch (NoSuchAlgorithmException e) {
              throw new IllegalStateException(e);
            }
          });

  /** Digests the remaining bytes of {@code data} without moving its position. */
  public static Digest of(ByteBuffer data) {
    MessageDigest md = SHA256.get();
    md.reset();
    md.update(data.duplicate());
    return fromBytes(ByteBuffer.wrap(md.digest()));
  }

  /** Reads the 32 digest bytes at the buffer's position, whatever the buffer's byte order. */
  public static Digest fromBytes(ByteBuffer b) {
    ByteBuffer be = b.slice().order(ByteOrder.BIG_ENDIAN);
    b.position(b.position() + BYTES);
    return new Digest(be.getLong(), be.getLong(), be.getLong(), be.getLong());
  }

  /** Writes the 32 digest bytes at the buffer's position, whatever the buffer's byte order. */
  public void write(ByteBuffer b) {
    b.slice().order(ByteOrder.BIG_ENDIAN).putLong(a).putLong(this.b).putLong(c).putLong(d);
    b.position(b.position() + BYTES);
  }

  public String hex() {
    ByteBuffer b = ByteBuffer.allocate(BYTES);
    write(b);
    return HexFormat.of().formatHex(b.array());
  }

  @Override
  public String toString() {
    return hex().substring(0, 16);
  }
}
