package io.unstall.flight.dataset;

import io.unstall.flight.cache.Digest;
import io.unstall.flight.format.SampleIndex;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;

/**
 * Digest manifests: a dataset's sample id -> content digest map, as a file. The sidecar persists them next to
 * the disk tier so a restarted sidecar finds its cached entries without rereading storage (only while the
 * dataset's fingerprint - files, sizes, versions - is unchanged); users export them to share cache entries
 * with another dataset of the same content (holding the manifest is the capability to read those entries).
 *
 * <pre>"UNSM" u8 version=1 | fingerprint[32] | u32 n | n x (u8 known | u32 length | digest[32])</pre>
 */
public final class Manifests {
  private static final byte[] MAGIC = {'U', 'N', 'S', 'M'};
  private static final int ROW = 1 + 4 + Digest.BYTES;

  private Manifests() {}

  /** What identifies a dataset's content without reading it: format, location, files, sizes, versions. */
  public static byte[] fingerprint(Dataset d) throws IOException {
    MessageDigest md;
    try {
      md = MessageDigest.getInstance("SHA-256");
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
    SampleIndex idx = d.index();
    md.update((d.format().name() + "\n" + d.storage().uri() + "\n").getBytes(StandardCharsets.UTF_8));
    for (String f : idx.files()) {
      md.update((f + "\t" + d.storage().version(f) + "\n").getBytes(StandardCharsets.UTF_8));
    }
    ByteBuffer rows = ByteBuffer.allocate(12 * Math.min(idx.size(), 1 << 16));
    for (int i = 0; i < idx.size(); i++) {
      if (!rows.hasRemaining()) {
        md.update(rows.flip());
        rows.clear();
      }
      rows.putLong(idx.offset(i)).putInt(idx.length(i));
    }
    md.update(rows.flip());
    return md.digest();
  }

  /** Writes the known digests of {@code d} (mode 0600, atomically); returns how many were known. */
  public static int write(Dataset d, Path file) throws IOException {
    int n = d.size();
    ByteBuffer b = ByteBuffer.allocate(4 + 1 + 32 + 4 + n * ROW).order(ByteOrder.LITTLE_ENDIAN);
    b.put(MAGIC).put((byte) 1).put(fingerprint(d)).putInt(n);
    int known = 0;
    ByteBuffer digest = ByteBuffer.allocate(Digest.BYTES);
    for (int i = 0; i < n; i++) {
      Digest dg = d.digest(i);
      b.put((byte) (dg == null ? 0 : 1)).putInt(d.length(i));
      digest.clear();
      if (dg != null) {
        dg.write(digest);
        known++;
      }
      b.put(digest.array());
    }
    Path dir = file.toAbsolutePath().getParent();
    Files.createDirectories(dir);
    Path tmp = Files.createTempFile(dir, ".manifest-", "", PosixFilePermissions.asFileAttribute(
        PosixFilePermissions.fromString("rw-------")));
    try {
      Files.write(tmp, b.array());
      Files.move(tmp, file, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
    } finally {
      Files.deleteIfExists(tmp);
    }
    return known;
  }

  /**
   * Loads digests from {@code file} into {@code d}. With {@code requireSameFingerprint} (a persisted manifest)
   * a changed dataset makes this return -1 and load nothing; otherwise (an imported manifest) the sample count
   * and every sample length must match, or it is an error naming the first difference.
   */
  public static int load(Dataset d, Path file, boolean requireSameFingerprint) throws IOException {
    ByteBuffer b = ByteBuffer.wrap(Files.readAllBytes(file)).order(ByteOrder.LITTLE_ENDIAN);
    byte[] magic = new byte[4];
    if (b.remaining() < 4 + 1 + 32 + 4 || !java.util.Arrays.equals(get(b, magic), MAGIC) || b.get() != 1) {
      throw new IllegalArgumentException("manifest " + file + " is not an unstall manifest (version 1)");
    }
    byte[] fp = get(b, new byte[32]);
    if (requireSameFingerprint && !java.util.Arrays.equals(fp, fingerprint(d))) {
      return -1;
    }
    int n = b.getInt();
    if (n != d.size() || b.remaining() != (long) n * ROW) {
      throw new IllegalArgumentException(
          "manifest " + file + " describes " + n + " samples but dataset '" + d.name() + "' has " + d.size());
    }
    Digest[] loaded = new Digest[n];
    for (int i = 0; i < n; i++) {
      boolean known = b.get() == 1;
      int length = b.getInt();
      if (length != d.length(i)) {
        throw new IllegalArgumentException(
            "manifest " + file + " says sample " + i + " has " + length + " bytes but in dataset '" + d.name()
                + "' it has " + d.length(i) + ": not the same content");
      }
      Digest dg = Digest.fromBytes(b);
      loaded[i] = known ? dg : null;
    }
    int count = 0;
    for (int i = 0; i < n; i++) {
      if (loaded[i] != null) {
        d.recordDigest(i, loaded[i]);
        count++;
      }
    }
    return count;
  }

  private static byte[] get(ByteBuffer b, byte[] into) {
    b.get(into);
    return into;
  }
}
