package io.unstall.flight.storage;

import java.io.EOFException;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InputStream;
import java.io.InterruptedIOException;
import java.net.URI;
import java.nio.ByteBuffer;
import java.nio.channels.Channels;
import java.nio.channels.ReadableByteChannel;
import java.nio.file.AccessDeniedException;
import java.nio.file.NoSuchFileException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import software.amazon.awssdk.awscore.retry.AwsRetryStrategy;
import software.amazon.awssdk.core.exception.SdkClientException;
import software.amazon.awssdk.core.exception.SdkException;
import software.amazon.awssdk.http.apache5.Apache5HttpClient;
import software.amazon.awssdk.services.s3.S3Client;
import software.amazon.awssdk.services.s3.model.CommonPrefix;
import software.amazon.awssdk.services.s3.model.GetObjectRequest;
import software.amazon.awssdk.services.s3.model.HeadObjectResponse;
import software.amazon.awssdk.services.s3.model.ListObjectsV2Request;
import software.amazon.awssdk.services.s3.model.ListObjectsV2Response;
import software.amazon.awssdk.services.s3.model.NoSuchBucketException;
import software.amazon.awssdk.services.s3.model.NoSuchKeyException;
import software.amazon.awssdk.services.s3.model.S3Exception;
import software.amazon.awssdk.services.s3.model.S3Object;

/**
 * An S3 bucket (or any S3-API server) through the AWS SDK for Java v2: {@code s3://bucket/prefix} is the
 * directory {@code prefix/}, or the one object {@code prefix} when no key lies below it. Configured like the
 * AWS CLI (see {@link S3Config#fromEnvironment()}). Samples are ranged GETs streamed straight into the batch's
 * buffer; listings are paginated ListObjectsV2 calls whose sizes answer {@link #size} without a HEAD.
 * {@link #pin} keeps the ETag a listing gave (or a HEAD, for a single object), and every ranged GET of a pinned
 * object carries it as {@code If-Match}: an object replaced after registration answers 412, which becomes a
 * {@link SourceChangedException} naming it, never bytes of the new version spliced to the old.
 *
 * <p>SDK clients are shared per configuration for the life of the process (as the SDK recommends): a storage
 * opened and dropped without {@link #close()} (a repeated registration) then leaks no pool or thread.
 */
public final class S3Storage implements Storage {
  /** Attempts per request, the first included (the SDK's standard strategy: exponential backoff, jitter). */
  static final int MAX_ATTEMPTS = 5;
  private static final int MAX_CONNECTIONS = 64;
  /** Extra attempts when a response body breaks off mid-read (the SDK retries only until the headers). */
  private static final int BODY_RETRIES = 3;

  private static final Map<S3Config, S3Client> CLIENTS = new ConcurrentHashMap<>();
  /** The lean GET path per configuration (see {@link S3Get}); absent without explicit credentials. */
  private static final Map<S3Config, S3Get> LEAN = new ConcurrentHashMap<>();

  private final S3Client s3;
  /** Ranged GETs go through this unless it is null or turned off ({@link #leanBase} null). */
  private final S3Get lean;
  /** The bucket's URL with a trailing '/' (path-style or virtual-hosted, as the SDK resolves it), or null. */
  private volatile String leanBase;
  private final String endpoint;
  private final String bucket;
  /** The root's key prefix: "" (the bucket), "dir/", or the single object's key. */
  private final String root;
  /** Set when the location is one object: its name relative to the root's parent, like LocalStorage. */
  private final String only;
  /** Objects as the last listings saw them, taken by {@link #size} or {@link #pin} (indexing asks once each). */
  private final Map<String, Listed> listed = new ConcurrentHashMap<>();
  /** ETag and size of each pinned object. */
  private final Map<String, Listed> pins = new ConcurrentHashMap<>();

  private record Listed(String eTag, long size) {}
  /** Keys per ListObjectsV2 page (S3's maximum; tests lower it to exercise continuation tokens). */
  int pageSize = 1000;
  /** {@link #version}'s last listed directory (a key prefix) and the versions of the objects in it. */
  private String versionsDir;
  private Map<String, String> versions = Map.of();

  /** Opens {@code uri} configured from the environment ({@link S3Config#fromEnvironment()}). */
  public static S3Storage open(String uri) throws IOException {
    return new S3Storage(uri, S3Config.fromEnvironment());
  }

  /**
   * Opens {@code s3://bucket[/prefix]}: checks the credentials, the bucket and that something lies there, so
   * that a bad location fails at registration with a message that names it.
   */
  public S3Storage(String uri, S3Config config) throws IOException {
    if (uri == null || !uri.startsWith("s3://")) {
      throw new IllegalArgumentException("not an S3 location: '" + uri + "' (expected s3://bucket/prefix)");
    }
    String rest = uri.substring("s3://".length());
    int slash = rest.indexOf('/');
    this.bucket = slash < 0 ? rest : rest.substring(0, slash);
    if (bucket.isEmpty()) {
      throw new IllegalArgumentException("no bucket in '" + uri + "' (expected s3://bucket/prefix)");
    }
    String prefix = slash < 0 ? "" : rest.substring(slash + 1).replaceAll("/{2,}", "/");
    this.endpoint = config.endpointName();
    String display = "s3://" + bucket + "/" + prefix;
    if (config.credentials() != null) {
      try {
        config.credentials().resolveCredentials();
      } catch (SdkClientException e) {
        throw new IOException(
            "no AWS credentials for " + display + ": set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE ("
                + firstLine(e.getMessage()) + ")");
      }
    }
    this.s3 = CLIENTS.computeIfAbsent(config, S3Storage::client);
    this.lean = config.credentials() == null ? null
        : LEAN.computeIfAbsent(config, c -> new S3Get(c.credentials(), c.region().id(), MAX_CONNECTIONS));
    this.leanBase = lean == null ? null : bucketUrl(s3, bucket);

    String dir = prefix.isEmpty() || prefix.endsWith("/") ? prefix : prefix + "/";
    if (!listPage(dir, 1).contents().isEmpty()) {
      this.root = dir;
      this.only = null;
    } else if (!prefix.isEmpty() && !prefix.endsWith("/") && head(prefix) != null) {
      this.root = prefix;
      this.only = prefix.substring(prefix.lastIndexOf('/') + 1);
    } else {
      throw new NoSuchFileException(
          display, null, "no objects at this location (bucket '" + bucket + "' at " + endpoint + ")");
    }
  }

  private static S3Client client(S3Config c) {
    var b =
        S3Client.builder()
            .region(c.region())
            .forcePathStyle(c.forcePathStyle())
            .httpClientBuilder(
                Apache5HttpClient.builder().maxConnections(MAX_CONNECTIONS).connectionTimeout(Duration.ofSeconds(5)))
            .overrideConfiguration(
                o -> o.retryStrategy(
                    AwsRetryStrategy.standardRetryStrategy().toBuilder().maxAttempts(MAX_ATTEMPTS).build()));
    if (c.credentials() != null) {
      b.credentialsProvider(c.credentials());
    }
    if (c.endpoint() != null) {
      b.endpointOverride(c.endpoint());
    } else {
      b.crossRegionAccessEnabled(true); // a bucket in another region than AWS_REGION still works
    }
    return b.build();
  }

  @Override
  public String uri() {
    return "s3://" + bucket + "/" + root;
  }

  @Override
  public boolean isSingleObject() {
    return only != null;
  }

  @Override
  public List<String> listDirectories(String dir) throws IOException {
    if (only != null) {
      return List.of();
    }
    String base = dirKey(dir);
    List<String> out = new ArrayList<>();
    String token = null;
    do {
      ListObjectsV2Response page = list(base, "/", token, pageSize);
      for (CommonPrefix p : page.commonPrefixes()) {
        String rel = p.prefix().substring(root.length());
        out.add(rel.substring(0, rel.length() - 1));
      }
      token = page.isTruncated() ? page.nextContinuationToken() : null;
    } while (token != null);
    out.sort(null);
    return out;
  }

  @Override
  public List<String> listObjects(String dir) throws IOException {
    if (only != null) {
      return List.of(only);
    }
    String base = dirKey(dir);
    List<String> out = new ArrayList<>();
    String token = null;
    do {
      ListObjectsV2Response page = list(base, null, token, pageSize);
      for (S3Object o : page.contents()) {
        if (o.key().endsWith("/")) {
          continue; // a "folder" marker made by consoles, not an object of the dataset
        }
        String rel = o.key().substring(root.length());
        out.add(rel);
        listed.put(rel, new Listed(o.eTag(), o.size()));
      }
      token = page.isTruncated() ? page.nextContinuationToken() : null;
    } while (token != null);
    out.sort(null);
    return out;
  }

  @Override
  public long size(String path) throws IOException {
    return listedOrHead(path).size();
  }

  @Override
  public long pin(String path) throws IOException {
    Listed l = listedOrHead(path);
    pins.put(path, l);
    return l.size();
  }

  private Listed listedOrHead(String path) throws IOException {
    Listed l = listed.remove(path);
    if (l != null) {
      return l;
    }
    HeadObjectResponse h = head(key(path));
    if (h == null) {
      throw new NoSuchFileException(describe(path), null, "object does not exist");
    }
    return new Listed(h.eTag(), h.contentLength());
  }

  @Override
  public void readFully(String path, long offset, ByteBuffer dst) throws IOException {
    int want = dst.remaining();
    if (want == 0) {
      return;
    }
    String key = key(path);
    Listed pin = pins.get(path);
    String eTag = pin == null ? null : pin.eTag();
    long end = offset + want; // exclusive
    for (int attempt = 0; ; attempt++) {
      long pos = end - dst.remaining();
      InputStream in = open(path, key, pos, end, eTag); // errors here are final: the SDK has retried them
      try (in; ReadableByteChannel ch = Channels.newChannel(in)) {
        while (dst.hasRemaining()) {
          if (ch.read(dst) < 0) {
            throw truncated(path, end - dst.remaining(), end);
          }
        }
        return;
      } catch (EOFException | InterruptedIOException e) {
        throw e;
      } catch (IOException e) {
        if (attempt >= BODY_RETRIES) {
          throw new IOException(
              "reading " + describe(path) + " from " + endpoint + " broke off at byte " + (end - dst.remaining())
                  + " after " + (attempt + 1) + " attempts: " + e.getMessage(), e);
        }
        backoff(attempt);
      }
    }
  }

  /**
   * The body of bytes [pos, end) of {@code key}: through {@link S3Get} when it answers 206, else through the
   * SDK (its retries, redirects and error translation). A 412 or 416 means the same on either path.
   */
  private InputStream open(String path, String key, long pos, long end, String eTag) throws IOException {
    String base = leanBase;
    if (base != null) {
      Object r;
      try {
        r = lean.open(URI.create(base + S3Get.encodeKey(key)), pos, end - 1, eTag);
      } catch (InterruptedIOException e) {
        throw e;
      } catch (IOException e) {
        r = null; // the connection failed before an answer: the SDK retries with its backoff
      }
      if (r instanceof S3Get.Body body) {
        return new java.io.FilterInputStream(body.in()) {
          @Override
          public void close() throws IOException {
            body.close();
          }
        };
      }
      if (r instanceof S3Get.Status st) {
        if (st.code() == 412) {
          throw changed(path, eTag);
        }
        if (st.code() == 416) {
          throw truncated(path, pos, end);
        }
        int c = st.code();
        if (c == 200 || c == 400 || c == 501 || (c >= 300 && c < 400)) {
          leanBase = null; // a redirect, a region mismatch, a server without ranges: this bucket stays on the SDK
        }
      }
    }
    GetObjectRequest.Builder req =
        GetObjectRequest.builder().bucket(bucket).key(key).range("bytes=" + pos + "-" + (end - 1));
    if (eTag != null) {
      req.ifMatch(eTag);
    }
    try {
      return s3.getObject(req.build());
    } catch (SdkException e) {
      if (e instanceof S3Exception s && s.statusCode() == 416) {
        throw truncated(path, pos, end);
      }
      if (e instanceof S3Exception s && s.statusCode() == 412) {
        throw changed(path, eTag);
      }
      throw translate(e, describe(path));
    }
  }

  /** Whether ranged GETs still take the lean path (tests: a bad signature would silently fall back). */
  boolean leanActive() {
    return leanBase != null;
  }

  private SourceChangedException changed(String path, String eTag) {
    return new SourceChangedException("object '" + describe(path) + "'",
        "its ETag is no longer " + eTag + ": " + endpoint + " answered HTTP 412 to If-Match");
  }

  /** The bucket's base URL as the SDK would address it, with a trailing '/'. */
  private static String bucketUrl(S3Client s3, String bucket) {
    String url = s3.utilities().getUrl(b -> b.bucket(bucket).key("k")).toExternalForm();
    return url.substring(0, url.length() - 1);
  }

  /**
   * The object's ETag and size. Callers ask for every file in index order, so a miss lists the file's whole
   * directory once (one request per 1000 keys, not a HEAD per file) and later calls are answered from it.
   */
  @Override
  public synchronized String version(String path) throws IOException {
    Listed pin = pins.get(path);
    if (pin != null) {
      return pin.eTag() + ":" + pin.size();
    }
    String key = key(path);
    String dir = key.substring(0, key.lastIndexOf('/') + 1);
    if (!dir.equals(versionsDir)) {
      Map<String, String> found = new HashMap<>();
      String token = null;
      do {
        ListObjectsV2Response page = list(dir, "/", token, pageSize);
        for (S3Object o : page.contents()) {
          found.put(o.key(), o.eTag() + ":" + o.size());
        }
        token = page.isTruncated() ? page.nextContinuationToken() : null;
      } while (token != null);
      versions = found;
      versionsDir = dir;
    }
    String v = versions.get(key);
    if (v == null) {
      throw new NoSuchFileException(describe(path), null, "object no longer exists (deleted after registration?)");
    }
    return v;
  }

  @Override
  public String describe(String path) {
    return "s3://" + bucket + "/" + key(path);
  }

  /** The shared client outlives this storage (see the class comment): nothing to release. */
  @Override
  public synchronized void close() {
    listed.clear();
    pins.clear();
    versions = Map.of();
    versionsDir = null;
  }

  // -- helpers -------------------------------------------------------------------------------------

  private String key(String path) {
    if (only != null) {
      if (!path.equals(only)) {
        throw new IllegalArgumentException("'" + path + "' is not the object " + uri());
      }
      return root;
    }
    return root + path;
  }

  private String dirKey(String dir) {
    return dir.isEmpty() ? root : root + (dir.endsWith("/") ? dir : dir + "/");
  }

  private ListObjectsV2Response listPage(String prefix, int max) throws IOException {
    return list(prefix, null, null, max);
  }

  private ListObjectsV2Response list(String prefix, String delimiter, String token, int max) throws IOException {
    ListObjectsV2Request.Builder req = ListObjectsV2Request.builder().bucket(bucket).prefix(prefix).maxKeys(max);
    if (delimiter != null) {
      req.delimiter(delimiter);
    }
    if (token != null) {
      req.continuationToken(token);
    }
    try {
      return s3.listObjectsV2(req.build());
    } catch (SdkException e) {
      throw translate(e, "s3://" + bucket + "/" + prefix);
    }
  }

  /** The object's HEAD, or null when there is no such key. */
  private HeadObjectResponse head(String key) throws IOException {
    try {
      return s3.headObject(b -> b.bucket(bucket).key(key));
    } catch (NoSuchKeyException e) {
      return null;
    } catch (SdkException e) {
      if (e instanceof S3Exception s && s.statusCode() == 404) {
        return null;
      }
      throw translate(e, "s3://" + bucket + "/" + key);
    }
  }

  /** An SDK failure as an IOException that names the location, the endpoint and what to do. */
  private IOException translate(SdkException e, String what) {
    if (e instanceof NoSuchBucketException) {
      return new FileNotFoundException(
          "bucket '" + bucket + "' does not exist at " + endpoint + " (reading " + what + ")");
    }
    if (e instanceof NoSuchKeyException) {
      return new NoSuchFileException(what, null, "object no longer exists (deleted after registration?)");
    }
    if (e instanceof S3Exception s) {
      String code = s.awsErrorDetails() == null ? null : s.awsErrorDetails().errorCode();
      String msg = s.awsErrorDetails() == null ? null : s.awsErrorDetails().errorMessage();
      String detail = "HTTP " + s.statusCode() + (code == null ? "" : " " + code) + (msg == null ? "" : ": " + msg);
      if (s.statusCode() == 403 || "InvalidAccessKeyId".equals(code) || "SignatureDoesNotMatch".equals(code)) {
        return new AccessDeniedException(
            what, null,
            "access denied by " + endpoint + " (" + detail + "); check the credentials (AWS_ACCESS_KEY_ID/"
                + "AWS_SECRET_ACCESS_KEY or AWS_PROFILE) and the bucket's policy");
      }
      if (s.statusCode() == 404) {
        return new NoSuchFileException(what, null, "not found at " + endpoint + " (" + detail + ")");
      }
      return new IOException("S3 request for " + what + " failed at " + endpoint + " (" + detail + ")", e);
    }
    return new IOException(
        "cannot reach S3 at " + endpoint + " for " + what + " after " + MAX_ATTEMPTS + " attempts: "
            + firstLine(e.getMessage()), e);
  }

  private EOFException truncated(String path, long at, long end) {
    return new EOFException(
        "object '" + describe(path) + "' ended at byte " + at + " but the index expects " + (end - at)
            + " more bytes (truncated or changed after registration)");
  }

  private static void backoff(int attempt) throws InterruptedIOException {
    try {
      Thread.sleep(100L << attempt);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new InterruptedIOException("interrupted while retrying an S3 read");
    }
  }

  private static String firstLine(String s) {
    if (s == null) {
      return "";
    }
    int nl = s.indexOf('\n');
    return nl < 0 ? s : s.substring(0, nl);
  }
}
