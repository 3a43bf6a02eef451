package io.unstall.flight.dataset;

import io.unstall.flight.cache.Digest;
import io.unstall.flight.format.SampleIndex;
import io.unstall.flight.fs.DurableFiles;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.zip.CRC32C;

/**
 * Digest manifests: a dataset's sample id -> content digest map, as a file. A manifest holds only digests the
 * dataset computed from its own bytes. The sidecar persists them next to the disk tier so a restarted sidecar
 * finds its cached entries without rereading storage (only while the dataset's fingerprint - files, sizes,
 * versions - is unchanged: {@link #restore}); users export them for another dataset of the same content, which
 * imports them as claims, each checked against that dataset's own bytes on first read ({@link #importClaims}):
 * a manifest alone never lets a dataset be served an entry. Files are replaced atomically and durably
 * ({@link DurableFiles}) and end with a CRC32C of what precedes it, so a torn or corrupt one is recognised
 * ({@link CorruptManifestException}); version 1 files (no CRC) still load.
 *
 * <pre>"UNSM" u8 version=2 | fingerprint[32] | u32 n | n x (u8 known | u32 length | digest[32]) | u32 crc32c</pre>
 */
public final class Manifests {
  private static final byte[] MAGIC = {'U', 'N', 'S', 'M'};
  private static final int ROW = 1 + 4 + Digest.BYTES;
  private static final int HEAD = 4 + 1 + 32 + 4;
  private static final byte VERSION = 2;

  private Manifests() {}

  /**
   * What identifies a dataset's content without reading it: format, location, files, sizes, versions (as
   * pinned at indexing). {@link Dataset#fingerprint()} computes it once.
   */
  static byte[] fingerprint(Dataset d) throws IOException {
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

  /**
   * Writes the digests {@code d} computed from its own bytes (mode 0600, atomically; pending imported claims are
   * not written); returns how many it wrote.
   */
  public static int write(Dataset d, Path file) throws IOException {
    int n = d.size();
    ByteBuffer b = ByteBuffer.allocate(HEAD + n * ROW + 4).order(ByteOrder.LITTLE_ENDIAN);
    b.put(MAGIC).put(VERSION).put(d.fingerprint()).putInt(n);
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
    b.putInt(crc(b.array(), b.position()));
    Files.createDirectories(file.toAbsolutePath().getParent());
    DurableFiles.writeAtomically(file, b.flip());
    return known;
  }

  private static int crc(byte[] b, int len) {
    CRC32C c = new CRC32C();
    c.update(b, 0, len);
    return (int) c.getValue();
  }

  /** A manifest file that is not one, or is torn or corrupt: its bytes are not to be trusted. */
  public static final class CorruptManifestException extends IOException {
    CorruptManifestException(Path file, String what) {
      super("manifest " + file + " " + what);
    }
  }

  /**
   * Loads a persisted manifest of {@code d} (one this sidecar wrote for it): its digests are trusted, being
   * computed from the dataset's own bytes, but only while its fingerprint is unchanged; a changed dataset makes
   * this return -1 and load nothing. Returns how many digests were restored.
   */
  public static int restore(Dataset d, Path file) throws IOException {
    Digest[] loaded = read(d, file, true);
    if (loaded == null) {
      return -1;
    }
    int count = 0;
    for (int i = 0; i < loaded.length; i++) {
      if (loaded[i] != null) {
        d.restore(i, loaded[i]);
        count++;
      }
    }
    return count;
  }

  /**
   * Imports a manifest exported from another dataset as claims: the sample count and every sample length must
   * match (else an error naming the first difference), and each digest is checked against {@code d}'s own bytes
   * on the sample's first read before any cache entry is served under it ({@link Dataset#learn}). Returns how
   * many claims are pending.
   */
  public static int importClaims(Dataset d, Path file) throws IOException {
    return d.claim(read(d, file, false), file.toString());
  }

  /**
   * The digests of {@code file} by sample id (null where unknown), or null when a fingerprint must match and does
   * not.
   */
  private static Digest[] read(Dataset d, Path file, boolean requireSameFingerprint) throws IOException {
    byte[] bytes = Files.readAllBytes(file);
    ByteBuffer b = ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN);
    byte[] magic = new byte[4];
    if (b.remaining() < HEAD || !java.util.Arrays.equals(get(b, magic), MAGIC)) {
      throw new CorruptManifestException(file, "is not an unstall manifest");
    }
    byte version = b.get();
    if (version != 1 && version != VERSION) {
      throw new CorruptManifestException(file, "has version " + version + " (this sidecar reads 1 and 2)");
    }
    int rows = bytes.length;
    if (version == VERSION) {
      rows -= 4;
      if (rows < HEAD || crc(bytes, rows) != b.getInt(rows)) {
        throw new CorruptManifestException(file, "is torn or corrupt (its CRC32C does not match)");
      }
    }
    byte[] fp = get(b, new byte[32]);
    if (requireSameFingerprint && !java.util.Arrays.equals(fp, d.fingerprint())) {
      return null;
    }
    int n = b.getInt();
    if (rows - HEAD != (long) n * ROW) {
      throw new CorruptManifestException(file, "is torn (" + (rows - HEAD) + " bytes of rows for " + n + " samples)");
    }
    if (n != d.size()) {
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
    return loaded;
  }

  private static byte[] get(ByteBuffer b, byte[] into) {
    b.get(into);
    return into;
  }
}
