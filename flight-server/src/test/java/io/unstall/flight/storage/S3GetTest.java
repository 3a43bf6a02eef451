package io.unstall.flight.storage;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.net.URI;
import java.time.Clock;
import java.time.Instant;
import java.time.ZoneOffset;
import org.apache.hc.client5.http.classic.methods.HttpGet;
import org.junit.jupiter.api.Test;
import software.amazon.awssdk.auth.credentials.AwsBasicCredentials;
import software.amazon.awssdk.auth.credentials.AwsSessionCredentials;
import software.amazon.awssdk.auth.credentials.StaticCredentialsProvider;
import software.amazon.awssdk.http.SdkHttpFullRequest;
import software.amazon.awssdk.http.SdkHttpMethod;
import software.amazon.awssdk.http.auth.aws.signer.AwsV4HttpSigner;
import software.amazon.awssdk.http.auth.spi.signer.HttpSigner;
import software.amazon.awssdk.http.auth.spi.signer.SignedRequest;
import software.amazon.awssdk.identity.spi.AwsCredentialsIdentity;

/** {@link S3Get}'s SigV4 against the AWS SDK's own signer (the oracle), and its key encoding. */
class S3GetTest {
  private static final Instant NOW = Instant.parse("2026-11-23T04:05:06Z");

  private static String sdkAuthorization(URI url, AwsCredentialsIdentity id, String region) {
    SdkHttpFullRequest.Builder req = SdkHttpFullRequest.builder().method(SdkHttpMethod.GET).uri(url)
        .putHeader("x-amz-content-sha256", S3Get.EMPTY_SHA256);
    SignedRequest signed = AwsV4HttpSigner.create().sign(r -> r
        .identity(id)
        .request(req.build())
        .putProperty(AwsV4HttpSigner.SERVICE_SIGNING_NAME, "s3")
        .putProperty(AwsV4HttpSigner.REGION_NAME, region)
        .putProperty(AwsV4HttpSigner.DOUBLE_URL_ENCODE, false)
        .putProperty(AwsV4HttpSigner.NORMALIZE_PATH, false)
        .putProperty(AwsV4HttpSigner.PAYLOAD_SIGNING_ENABLED, true)
        .putProperty(HttpSigner.SIGNING_CLOCK, Clock.fixed(NOW, ZoneOffset.UTC)));
    return signed.request().firstMatchingHeader("Authorization").orElseThrow();
  }

  private static String ours(URI url, software.amazon.awssdk.auth.credentials.AwsCredentials c, String region) {
    try (S3Get get = new S3Get(StaticCredentialsProvider.create(c), region, 1)) {
      HttpGet req = new HttpGet(url);
      get.sign(req, url, NOW);
      return req.getFirstHeader("Authorization").getValue();
    } catch (java.io.IOException e) {
      throw new java.io.UncheckedIOException(e);
    }
  }

  @Test
  void signaturesMatchTheSdkSigner() {
    var basic = AwsBasicCredentials.create("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY");
    for (String u : new String[] {
        "http://127.0.0.1:9000/bucket/dir/img0001.jpg",
        "https://examplebucket.s3.eu-west-3.amazonaws.com/a%20b/caf%C3%A9%2B%3D.jpg",
        "https://s3.amazonaws.com/b/k"}) {
      URI url = URI.create(u);
      assertEquals(sdkAuthorization(url, AwsCredentialsIdentity.create(basic.accessKeyId(), basic.secretAccessKey()),
          "eu-west-3"), ours(url, basic, "eu-west-3"), u);
    }
  }

  @Test
  void sessionCredentialsSignTheTokenToo() {
    var session = AwsSessionCredentials.create("ASIAEXAMPLE", "secret/key", "token+with/odd=chars");
    URI url = URI.create("http://localhost:8333/bucket/k.jpg");
    assertEquals(
        sdkAuthorization(url, software.amazon.awssdk.identity.spi.AwsSessionCredentialsIdentity.create(
            session.accessKeyId(), session.secretAccessKey(), session.sessionToken()), "us-east-1"),
        ours(url, session, "us-east-1"));
  }

  @Test
  void keysArePercentEncodedAsS3ExpectsWithSlashesKept() {
    assertEquals("dir/a%20b.jpg", S3Get.encodeKey("dir/a b.jpg"));
    assertEquals("plus%2Beq%3Damp%26~_-.jpg", S3Get.encodeKey("plus+eq=amp&~_-.jpg"));
    assertEquals("caf%C3%A9/%E7%8C%AB", S3Get.encodeKey("caf\u00e9/\u732b"));
    assertEquals("pct%2520", S3Get.encodeKey("pct%20"));
  }
}
