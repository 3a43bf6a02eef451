package io.unstall.flight.auth;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.dataset.DatasetRegistry;
import io.unstall.flight.fs.DurableFiles;
import io.unstall.flight.fs.FileOwners;
import java.io.IOException;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.PosixFilePermission;
import java.nio.file.attribute.PosixFilePermissions;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.security.SecureRandom;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.TreeSet;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The tokens the owner issued to tenants, in {@code $UNSTALL_HOME/tenants.json} (mode 0600, owned by the
 * sidecar's user): per token an id, a name, the granted datasets and the SHA-256 of the token, never the token
 * itself. The file is the truth: every tenant authentication checks whether it changed (a stat) and reloads
 * it, so a token issued or revoked by {@code unstall-sidecar token ...} or the control plane counts from the
 * next call. Writers (this class, in any process) hold an fcntl lock on {@code tenants.json.lock}.
 */
public final class TenantTokens {
  private static final Logger LOG = LoggerFactory.getLogger(TenantTokens.class);
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final SecureRandom RANDOM = new SecureRandom();
  private static final Object WRITING = new Object(); // one writer per JVM: a second FileLock would throw
  public static final String FILE_NAME = "tenants.json";

  /** One issued token, as stored. */
  public record Tenant(String id, String name, List<String> datasets, String created, String sha256) {}

  /** A new token: the only time it exists in plaintext is in this value, handed to the owner. */
  public record Issued(Tenant tenant, String token) {
    @Override
    public String toString() { // never the token
      return "Issued[" + tenant.id() + "]";
    }
  }

  /**
   * The file's identity and change time: a rename (a new inode), a write and a chmod or chown (the ctime) all
   * make it differ, so each is seen at the next call.
   */
  private record Stamp(Object dev, Object ino, Object ctime, Object size) {
    static Stamp of(Map<String, Object> unix) {
      return new Stamp(unix.get("dev"), unix.get("ino"), unix.get("ctime"), unix.get("size"));
    }
  }

  /** What the file held at one stamp. */
  private record Snapshot(Stamp stamp, Map<String, Tenant> byHash, Map<String, Tenant> byId) {
    static final Snapshot EMPTY = new Snapshot(null, Map.of(), Map.of());

    boolean sameFile(Stamp s) {
      return s != null && s.equals(stamp);
    }
  }

  private final Path file; // null: no tenants at all
  private volatile Snapshot current = Snapshot.EMPTY;
  private volatile String lastProblem;

  private TenantTokens(Path file) {
    this.file = file;
  }

  /** No tenants: only the owner's token is accepted (a data plane without a sidecar home, in tests). */
  public static TenantTokens none() {
    return new TenantTokens(null);
  }

  /** The tenants of {@code file}, which need not exist yet; one that others may read or write is refused. */
  public static TenantTokens open(Path file) throws IOException {
    TenantTokens t = new TenantTokens(file.toAbsolutePath());
    Stamp a = t.stamp();
    if (a != null) {
      t.current = t.load(a); // at start a bad file is an error, later it disables tenants until fixed
    }
    return t;
  }

  public Path file() {
    return file;
  }

  /** The tenant whose token this is, or null: none issued, or revoked. */
  public Principal authenticate(byte[] presented) {
    if (file == null) {
      return null;
    }
    Tenant t = refresh().byHash.get(sha256(presented));
    return t == null ? null : Principal.tenant(t);
  }

  /** The principal of a Flight peer identity ({@link Principal#identity()}), as of the last authentication. */
  public Principal principal(String identity) {
    if (identity == null || identity.equals(Principal.OWNER_ID)) {
      return Principal.OWNER; // null: a data plane without authentication (never built by DataPlane)
    }
    String id = identity.startsWith(Principal.TENANT_PREFIX) ? identity.substring(Principal.TENANT_PREFIX.length())
        : identity;
    Tenant t = current.byId.get(id);
    return t == null ? Principal.revoked(id) : Principal.tenant(t);
  }

  /** The issued tokens (without their hashes' use: ids, names, grants, creation times). */
  public List<Tenant> list() {
    return file == null ? List.of() : new ArrayList<>(refresh().byId.values());
  }

  /** Issues a token granting {@code datasets} (names, registered or not yet). */
  public Issued issue(Collection<String> datasets, String name) throws IOException {
    if (datasets == null || datasets.isEmpty()) {
      throw new IllegalArgumentException("a tenant token needs at least one dataset to grant (--dataset NAME)");
    }
    Set<String> grants = new TreeSet<>();
    for (String d : datasets) {
      DatasetRegistry.checkName(d);
      grants.add(d);
    }
    String label = name == null ? "" : name.strip();
    if (label.length() > 64 || !label.chars().allMatch(c -> c >= 0x20 && c < 0x7f)) {
      throw new IllegalArgumentException("tenant name '" + label + "': use at most 64 printable ASCII characters");
    }
    byte[] raw = new byte[32];
    RANDOM.nextBytes(raw);
    String token = HexFormat.of().formatHex(raw);
    return update(tenants -> {
      String id;
      do {
        byte[] idBytes = new byte[4];
        RANDOM.nextBytes(idBytes);
        id = HexFormat.of().formatHex(idBytes);
      } while (tenants.containsKey(id));
      Tenant t = new Tenant(id, label, List.copyOf(grants), Instant.now().truncatedTo(ChronoUnit.SECONDS).toString(),
          sha256(token.getBytes(StandardCharsets.UTF_8)));
      tenants.put(id, t);
      LOG.info("issued tenant token {}{} for datasets {}", id, label.isEmpty() ? "" : " (" + label + ")", grants);
      return new Issued(t, token);
    });
  }

  /** Revokes token {@code id}: refused from the next call on. */
  public Tenant revoke(String id) throws IOException {
    return update(tenants -> {
      Tenant t = tenants.remove(id);
      if (t == null) {
        throw new IllegalArgumentException("no tenant token has id '" + id + "'"
            + (tenants.isEmpty() ? "; none is issued" : "; issued: " + String.join(", ", tenants.keySet())));
      }
      LOG.info("revoked tenant token {}", id);
      return t;
    });
  }

  private interface Change<T> {
    T apply(Map<String, Tenant> tenants) throws IOException;
  }

  /** Read, change and write the file under its lock (within this JVM and across processes). */
  private <T> T update(Change<T> change) throws IOException {
    if (file == null) {
      throw new IllegalStateException("this data plane has no tenants file (no sidecar home)");
    }
    synchronized (WRITING) {
      Path lock = file.resolveSibling(file.getFileName() + ".lock");
      try (FileChannel ch = FileChannel.open(lock, Set.of(StandardOpenOption.CREATE, StandardOpenOption.WRITE),
              PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rw-------")));
          FileLock held = ch.lock()) {
        Stamp a = stamp();
        Map<String, Tenant> tenants = new LinkedHashMap<>(a == null ? Map.of() : load(a).byId);
        T out = change.apply(tenants);
        DurableFiles.writeAtomically(file, StandardCharsets.UTF_8.encode(toJson(tenants)));
        current = load(stamp());
        return out;
      }
    }
  }

  /** The current snapshot: reloaded when the file changed since (a stat per call). */
  private Snapshot refresh() {
    Snapshot s = current;
    Stamp a;
    try {
      a = stamp();
    } catch (IOException e) {
      return problem(e.getMessage());
    }
    if (a == null) {
      if (s != Snapshot.EMPTY) {
        current = Snapshot.EMPTY;
      }
      return Snapshot.EMPTY;
    }
    if (s.sameFile(a)) {
      return s;
    }
    synchronized (this) {
      if (!current.sameFile(a)) {
        try {
          current = load(a);
          lastProblem = null;
        } catch (IOException | IllegalArgumentException e) {
          return problem(e.getMessage());
        }
      }
      return current;
    }
  }

  /** A file that cannot be trusted or read: no tenant is accepted until it is fixed (logged once). */
  private Snapshot problem(String message) {
    if (!Objects.equals(message, lastProblem)) {
      lastProblem = message;
      LOG.warn("tenant tokens are refused until {} is fixed: {}", file, message);
    }
    current = Snapshot.EMPTY;
    return Snapshot.EMPTY;
  }

  /** The file's stamp (one stat, no user-name lookups), or null when it does not exist. */
  private Stamp stamp() throws IOException {
    try {
      return Stamp.of(Files.readAttributes(file, "unix:dev,ino,ctime,size"));
    } catch (NoSuchFileException e) {
      return null;
    }
  }

  private Snapshot load(Stamp a) throws IOException {
    Set<PosixFilePermission> perms = Files.getPosixFilePermissions(file);
    if (perms.stream().anyMatch(p -> p.name().startsWith("GROUP") || p.name().startsWith("OTHERS"))) {
      throw new IllegalArgumentException("tenants file " + file + " is open to others ("
          + PosixFilePermissions.toString(perms) + "); run: chmod 600 " + file);
    }
    if (FileOwners.uidOf(file) != FileOwners.processUid()) {
      throw new IllegalArgumentException("tenants file " + file + " belongs to user " + FileOwners.userOf(file)
          + ", not to the sidecar's user " + FileOwners.processUser());
    }
    JsonNode doc;
    try {
      doc = JSON.readTree(Files.readAllBytes(file));
    } catch (IOException e) {
      throw new IllegalArgumentException("tenants file " + file + " is not valid JSON: " + e.getMessage());
    }
    if (doc == null || doc.path("v").asInt() != 1 || !doc.path("tenants").isArray()) {
      throw new IllegalArgumentException("tenants file " + file + " is not {\"v\":1,\"tenants\":[...]}");
    }
    Map<String, Tenant> byId = new LinkedHashMap<>();
    Map<String, Tenant> byHash = new LinkedHashMap<>();
    for (JsonNode n : doc.get("tenants")) {
      List<String> ds = new ArrayList<>();
      n.path("datasets").forEach(d -> ds.add(d.asText()));
      Tenant t = new Tenant(n.path("id").asText(), n.path("name").asText(""), List.copyOf(ds),
          n.path("created").asText(""), n.path("sha256").asText());
      if (t.id().isEmpty() || t.sha256().length() != 64) {
        throw new IllegalArgumentException("tenants file " + file + ": an entry lacks its id or sha256");
      }
      byId.put(t.id(), t);
      byHash.put(t.sha256(), t);
    }
    return new Snapshot(a, Map.copyOf(byHash), java.util.Collections.unmodifiableMap(byId));
  }

  private static String toJson(Map<String, Tenant> tenants) {
    ObjectNode o = JSON.createObjectNode().put("v", 1);
    ArrayNode arr = o.putArray("tenants");
    for (Tenant t : tenants.values()) {
      ObjectNode n = arr.addObject().put("id", t.id()).put("name", t.name());
      t.datasets().forEach(n.putArray("datasets")::add);
      n.put("created", t.created()).put("sha256", t.sha256());
    }
    return o.toPrettyString() + "\n";
  }

  /** The stored form of a token: tokens are 256 random bits, so a plain SHA-256 cannot be reversed. */
  static String sha256(byte[] token) {
    try {
      return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(token));
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }
}
