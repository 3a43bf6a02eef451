package io.unstall.flight.storage;

import java.io.IOException;
import java.io.InputStream;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.security.InvalidKeyException;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.time.Instant;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.HexFormat;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;
import org.apache.hc.client5.http.classic.methods.HttpGet;
import org.apache.hc.client5.http.config.ConnectionConfig;
import org.apache.hc.client5.http.impl.classic.CloseableHttpClient;
import org.apache.hc.core5.http.ClassicHttpResponse;
import org.apache.hc.client5.http.impl.classic.HttpClients;
import org.apache.hc.client5.http.impl.io.PoolingHttpClientConnectionManagerBuilder;
import org.apache.hc.core5.http.HttpEntity;
import org.apache.hc.core5.http.io.entity.EntityUtils;
import org.apache.hc.core5.util.Timeout;
import software.amazon.awssdk.auth.credentials.AwsCredentials;
import software.amazon.awssdk.auth.credentials.AwsCredentialsProvider;
import software.amazon.awssdk.auth.credentials.AwsSessionCredentials;

/**
 * The hot path of {@link S3Storage}: one ranged GET, signed with SigV4 and sent on a pooled HTTP/1.1
 * connection, its body streamed to the caller. Nothing else: no interceptors, endpoint rules, auth-scheme
 * resolution, metrics or checksum stages per request, where most of the AWS SDK's CPU per small GET goes (a JFR
 * profile of {@code benchmarks/probe_s3_cpu.py}: benchmarks/results/). The SDK still resolves the bucket's base
 * URL once ({@code S3Utilities.getUrl}), lists, HEADs, and takes over any request this class does not answer
 * itself ({@link #open} returns null): redirects, throttling, errors, so that retries and messages stay the
 * SDK's.
 *
 * <p>Signing follows the AWS Signature Version 4 specification for a GET without a body: signed headers
 * {@code host}, {@code x-amz-content-sha256} (the empty payload's hash), {@code x-amz-date} and, with session
 * credentials, {@code x-amz-security-token}; the signing key is derived once per (key id, day, region).
 * {@code S3GetTest} checks the signature against the SDK's own signer.
 */
final class S3Get implements AutoCloseable {
  static final String EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
  private static final DateTimeFormatter AMZ_DATE =
      DateTimeFormatter.ofPattern("yyyyMMdd'T'HHmmss'Z'").withZone(ZoneOffset.UTC);
  private static final HexFormat HEX = HexFormat.of();

  private final CloseableHttpClient http;
  private final AwsCredentialsProvider credentials;
  private final String region;
  private volatile SigningKey signingKey;

  private record SigningKey(String accessKeyId, String day, byte[] key) {}

  /** A GET's outcome other than a body: the status, for the caller to map. */
  record Status(int code) {}

  S3Get(AwsCredentialsProvider credentials, String region, int maxConnections) {
    this.credentials = credentials;
    this.region = region;
    this.http = HttpClients.custom()
        .setConnectionManager(PoolingHttpClientConnectionManagerBuilder.create()
            .setMaxConnTotal(maxConnections)
            .setMaxConnPerRoute(maxConnections)
            .setDefaultConnectionConfig(ConnectionConfig.custom()
                .setConnectTimeout(Timeout.ofSeconds(5))
                .setSocketTimeout(Timeout.ofSeconds(60))
                .build())
            .build())
        .disableAutomaticRetries()
        .disableRedirectHandling()
        .disableCookieManagement()
        .disableAuthCaching()
        .disableContentCompression()
        .setUserAgent("unstall-s3get")
        .build();
  }

  /**
   * Sends {@code GET url} for bytes [from, to] (inclusive), with {@code If-Match: eTag} when eTag is not
   * null. Returns the open response when the server answered 206 with exactly that range's length; the
   * caller reads {@link Body#in} and closes it. Any other answer is returned as a {@link Status} (the body
   * discarded), and an I/O failure before the headers is thrown.
   */
  Object open(URI url, long from, long to, String eTag) throws IOException {
    HttpGet get = new HttpGet(url);
    get.setHeader("Range", "bytes=" + from + "-" + to);
    if (eTag != null) {
      get.setHeader("If-Match", eTag);
    }
    sign(get, url, Instant.now());
    ClassicHttpResponse response = http.executeOpen(null, get, null);
    int code = response.getCode();
    HttpEntity entity = response.getEntity();
    if (code == 206 && entity != null && entity.getContentLength() == to - from + 1) {
      return new Body(response, entity.getContent());
    }
    try {
      EntityUtils.consume(entity); // an error document is small: keep the connection
    } finally {
      response.close();
    }
    return new Status(code);
  }

  /** An open 206 response. Closing the stream (read to its end) returns the connection to the pool. */
  record Body(ClassicHttpResponse response, InputStream in) implements AutoCloseable {
    @Override
    public void close() throws IOException {
      try {
        in.close();
      } finally {
        response.close();
      }
    }
  }

  void sign(HttpGet get, URI url, Instant now) {
    AwsCredentials c = credentials.resolveCredentials();
    String amzDate = AMZ_DATE.format(now);
    String day = amzDate.substring(0, 8);
    String token = c instanceof AwsSessionCredentials s ? s.sessionToken() : null;
    String host = url.getPort() < 0 ? url.getHost() : url.getHost() + ":" + url.getPort();
    get.setHeader("x-amz-date", amzDate);
    get.setHeader("x-amz-content-sha256", EMPTY_SHA256);
    if (token != null) {
      get.setHeader("x-amz-security-token", token);
    }
    String signedHeaders = token == null ? "host;x-amz-content-sha256;x-amz-date"
        : "host;x-amz-content-sha256;x-amz-date;x-amz-security-token";
    String canonical = "GET\n" + url.getRawPath() + "\n" + (url.getRawQuery() == null ? "" : url.getRawQuery()) + "\n"
        + "host:" + host + "\n"
        + "x-amz-content-sha256:" + EMPTY_SHA256 + "\n"
        + "x-amz-date:" + amzDate + "\n"
        + (token == null ? "" : "x-amz-security-token:" + token + "\n")
        + "\n" + signedHeaders + "\n" + EMPTY_SHA256;
    String scope = day + "/" + region + "/s3/aws4_request";
    String toSign = "AWS4-HMAC-SHA256\n" + amzDate + "\n" + scope + "\n" + HEX.formatHex(sha256(canonical));
    String signature = HEX.formatHex(hmac(key(c, day), toSign));
    get.setHeader("Authorization", "AWS4-HMAC-SHA256 Credential=" + c.accessKeyId() + "/" + scope
        + ", SignedHeaders=" + signedHeaders + ", Signature=" + signature);
  }

  private byte[] key(AwsCredentials c, String day) {
    SigningKey k = signingKey;
    if (k == null || !k.day().equals(day) || !k.accessKeyId().equals(c.accessKeyId())) {
      byte[] kDate = hmac(("AWS4" + c.secretAccessKey()).getBytes(StandardCharsets.UTF_8), day);
      byte[] kRegion = hmac(kDate, region);
      byte[] kService = hmac(kRegion, "s3");
      k = new SigningKey(c.accessKeyId(), day, hmac(kService, "aws4_request"));
      signingKey = k;
    }
    return k.key();
  }

  /**
   * The path of {@code key} as S3 expects it in a URL and in the canonical request: every byte of the UTF-8
   * key percent-encoded except the unreserved characters and '/'.
   */
  static String encodeKey(String key) {
    StringBuilder sb = new StringBuilder(key.length() + 16);
    for (byte b : key.getBytes(StandardCharsets.UTF_8)) {
      int c = b & 0xff;
      if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
          || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
        sb.append((char) c);
      } else {
        sb.append('%').append(Character.toUpperCase(Character.forDigit(c >> 4, 16)))
            .append(Character.toUpperCase(Character.forDigit(c & 0xf, 16)));
      }
    }
    return sb.toString();
  }

  private static byte[] sha256(String s) {
    try {
      return MessageDigest.getInstance("SHA-256").digest(s.getBytes(StandardCharsets.UTF_8));
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }

  private static byte[] hmac(byte[] key, String data) {
    try {
      Mac mac = Mac.getInstance("HmacSHA256");
      mac.init(new SecretKeySpec(key, "HmacSHA256"));
      return mac.doFinal(data.getBytes(StandardCharsets.UTF_8));
    } catch (NoSuchAlgorithmException | InvalidKeyException e) {
      throw new IllegalStateException(e);
    }
  }

  @Override
  public void close() throws IOException {
    http.close();
  }
}
