package io.unstall.flight.storage;

import static org.awaitility.Awaitility.await;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import io.unstall.flight.DataPlane;
import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.format.TfRecords;
import io.unstall.flight.protocol.FetchTicket;
import java.io.EOFException;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.net.URI;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.AccessDeniedException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Random;
import org.apache.arrow.flight.CallHeaders;
import org.apache.arrow.flight.FlightCallHeaders;
import org.apache.arrow.flight.FlightClient;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.flight.FlightStatusCode;
import org.apache.arrow.flight.FlightStream;
import org.apache.arrow.flight.HeaderCallOption;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VarCharVector;
import org.gaul.s3proxy.BlobStores;
import org.gaul.s3proxy.S3Proxy;
import org.gaul.s3proxy.auth.AuthenticationType;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import software.amazon.awssdk.auth.credentials.AwsBasicCredentials;
import software.amazon.awssdk.auth.credentials.StaticCredentialsProvider;
import software.amazon.awssdk.core.sync.RequestBody;
import software.amazon.awssdk.regions.Region;
import software.amazon.awssdk.services.s3.S3Client;

/**
 * S3Storage against a real S3-API server (S3Proxy, embedded, transient blob store, SigV2/V4 auth): datasets
 * registered by {@code s3://} URI through the registry and served through a real Flight client, byte for
 * byte; and the errors a user meets (missing bucket, bad or no credentials, an object deleted mid-epoch).
 *
 * <p>Registration reads its configuration as in production ({@link S3Config#fromEnvironment()}), here
 * from the SDK's system properties ({@code aws.endpointUrlS3}, {@code aws.accessKeyId}, ...), which this class
 * sets and restores; they take precedence over the AWS_* environment variables.
 */
class S3StorageTest {
  static final String AK = "unstall-test-key";
  static final String SK = "unstall-test-secret";
  static final String TOKEN = "0123456789abcdef0123456789abcdef";
  static final String BUCKET = "data";
  static final List<String> PROPS =
      List.of("aws.endpointUrlS3", "aws.accessKeyId", "aws.secretAccessKey", "aws.region", "aws.disableEc2Metadata",
          "aws.sharedCredentialsFile", "aws.configFile", "aws.profile");

  static S3Proxy proxy;
  static URI endpoint;
  static S3Client admin;
  static final Map<String, String> savedProps = new HashMap<>();
  /** Image folder "imgs/": key -> bytes, in torchvision's sample order. */
  static final Map<String, byte[]> images = new java.util.LinkedHashMap<>();
  /** TFRecord shards "tf/": the records of shard-0 then shard-1. */
  static final List<byte[]> records = new ArrayList<>();

  @TempDir Path tmp;
  BufferAllocator root;
  DataPlane plane;
  FlightClient client;
  HeaderCallOption auth;

  @BeforeAll
  static void startS3() throws Exception {
    proxy =
        S3Proxy.builder()
            .blobStore(BlobStores.create("transient", new Properties()))
            .endpoint(URI.create("http://127.0.0.1:0"))
            .awsAuthentication(AuthenticationType.AWS_V2_OR_V4, AK, SK)
            .build();
    proxy.start();
    await("S3Proxy started").atMost(Duration.ofSeconds(5)).until(() -> proxy.getState().equals("STARTED"));
    endpoint = URI.create("http://127.0.0.1:" + proxy.getPort());
    admin =
        S3Client.builder()
            .endpointOverride(endpoint)
            .region(Region.US_EAST_1)
            .forcePathStyle(true)
            .credentialsProvider(StaticCredentialsProvider.create(AwsBasicCredentials.create(AK, SK)))
            .build();
    admin.createBucket(b -> b.bucket(BUCKET));

    Random rnd = new Random(11);
    for (String c : List.of("cat", "dog")) {
      for (int i = 0; i < 6; i++) {
        byte[] b = new byte[500 + rnd.nextInt(3000)];
        rnd.nextBytes(b);
        images.put("imgs/" + c + "/img" + i + ".jpg", b);
      }
    }
    images.put("imgs/dog/sub/deep.png", new byte[] {1, 2, 3}); // torchvision walks subdirectories too
    images.forEach(S3StorageTest::put);
    put("imgs/README.txt", "not an image".getBytes(StandardCharsets.UTF_8)); // skipped: no image extension
    put("imgs/dog/", new byte[0]); // a console "folder" marker: not an object of the dataset

    Path dir = Files.createTempDirectory("s3shards");
    for (int s = 0; s < 2; s++) {
      List<byte[]> recs = new ArrayList<>();
      for (int r = 0; r < 5; r++) {
        byte[] b = new byte[100 + rnd.nextInt(2000)];
        rnd.nextBytes(b);
        recs.add(b);
      }
      records.addAll(recs);
      Path shard = dir.resolve("shard-" + s + ".tfrecord");
      TfRecords.write(shard, recs);
      put("tf/shard-" + s + ".tfrecord", Files.readAllBytes(shard));
    }

    for (String p : PROPS) {
      savedProps.put(p, System.getProperty(p));
    }
  }

  @AfterAll
  static void stopS3() throws Exception {
    for (String p : PROPS) {
      if (savedProps.get(p) == null) {
        System.clearProperty(p);
      } else {
        System.setProperty(p, savedProps.get(p));
      }
    }
    admin.close();
    proxy.stop();
  }

  static void put(String key, byte[] data) {
    admin.putObject(b -> b.bucket(BUCKET).key(key), RequestBody.fromBytes(data));
  }

  /** The configuration a user gives the sidecar, through the SDK's system properties. */
  @BeforeEach
  void configure() throws Exception {
    System.setProperty("aws.endpointUrlS3", endpoint.toString()); // wins over AWS_ENDPOINT_URL[_S3] in our env
    System.setProperty("aws.accessKeyId", AK);
    System.setProperty("aws.secretAccessKey", SK);
    System.setProperty("aws.region", "eu-west-3"); // anything: S3Proxy accepts any signing region
    root = new RootAllocator(64L << 20);
    plane = DataPlane.builder(root, TOKEN).port(0).cacheCapacity(1 << 20).build().start();
    client = FlightClient.builder(root, plane.location()).build();
    CallHeaders h = new FlightCallHeaders();
    h.insert("authorization", "Bearer " + TOKEN);
    auth = new HeaderCallOption(h);
  }

  @AfterEach
  void stop() throws Exception {
    client.close();
    plane.close();
    root.close(); // throws if anything leaked
  }

  record Row(long id, Long label, String key, byte[] payload) {}

  private List<Row> fetch(String dataset, long epoch, long... ids) throws Exception {
    List<Row> out = new ArrayList<>();
    try (FlightStream s = client.getStream(new FetchTicket(dataset, epoch, ids).toTicket(), auth)) {
      while (s.next()) {
        var r = s.getRoot();
        BigIntVector id = (BigIntVector) r.getVector("id");
        BigIntVector label = (BigIntVector) r.getVector("label");
        VarCharVector key = (VarCharVector) r.getVector("key");
        VarBinaryVector payload = (VarBinaryVector) r.getVector("payload");
        for (int i = 0; i < r.getRowCount(); i++) {
          out.add(new Row(id.get(i), label.isNull(i) ? null : label.get(i),
              new String(key.get(i), StandardCharsets.UTF_8), payload.get(i)));
        }
      }
    }
    return out;
  }

  private static long[] shuffled(int n, long seed) {
    List<Long> ids = new ArrayList<>();
    for (long i = 0; i < n; i++) {
      ids.add(i);
    }
    java.util.Collections.shuffle(ids, new Random(seed));
    return ids.stream().mapToLong(Long::longValue).toArray();
  }

  @Test
  void imageFolderOnS3IsServedByteForByteInTorchvisionOrder() throws Exception {
    Dataset d = plane.registry().register("imgs", "imagefolder", "s3://" + BUCKET + "/imgs");
    assertEquals("s3://data/imgs/", d.storage().uri());
    assertEquals(images.size(), d.size());
    List<String> keys = new ArrayList<>(images.keySet());
    long[] ids = shuffled(keys.size(), 3);
    for (int epoch = 0; epoch < 2; epoch++) { // epoch 1 is served (partly) from the cache
      List<Row> rows = fetch("imgs", epoch, ids);
      assertEquals(ids.length, rows.size());
      for (int i = 0; i < ids.length; i++) {
        Row r = rows.get(i);
        String key = keys.get((int) ids[i]);
        assertEquals(ids[i], r.id());
        assertEquals(key.substring("imgs/".length()), r.key());
        assertEquals(key.startsWith("imgs/cat/") ? 0L : 1L, r.label());
        assertArrayEquals(images.get(key), r.payload(), key);
      }
    }
    assertEquals("s3://data/imgs/dog/sub/deep.png", d.fileOf(images.size() - 1));
  }

  @Test
  void tfRecordShardsOnS3AreServedByteForByte() throws Exception {
    plane.registry().register("tf", "tfrecord", "s3://" + BUCKET + "/tf/");
    long[] ids = shuffled(records.size(), 5);
    List<Row> rows = fetch("tf", 0, ids);
    for (int i = 0; i < ids.length; i++) {
      assertArrayEquals(records.get((int) ids[i]), rows.get(i).payload());
      assertEquals(null, rows.get(i).label());
    }
    assertTrue(rows.stream().anyMatch(r -> r.key().equals("shard-1.tfrecord@0")));

    // One shard named by its key is a single-object dataset.
    Dataset one = plane.registry().register("tf1", "tfrecord", "s3://" + BUCKET + "/tf/shard-1.tfrecord");
    assertEquals("s3://data/tf/shard-1.tfrecord", one.storage().uri());
    assertEquals(5, one.size());
    assertArrayEquals(records.get(7), fetch("tf1", 0, 2).get(0).payload());
  }

  @Test
  void anObjectDeletedMidEpochIsNotFoundNamingItsS3UriAndServingGoesOn() throws Exception {
    for (int i = 0; i < 4; i++) {
      put("del/c/x" + i + ".jpg", ("sample " + i).getBytes(StandardCharsets.UTF_8));
    }
    plane.registry().register("del", "imagefolder", "s3://" + BUCKET + "/del");
    assertEquals("sample 0", new String(fetch("del", 0, 0).get(0).payload(), StandardCharsets.UTF_8));
    admin.deleteObject(b -> b.bucket(BUCKET).key("del/c/x2.jpg"));
    FlightRuntimeException e =
        assertThrows(FlightRuntimeException.class, () -> fetch("del", 0, 1, 2));
    assertEquals(FlightStatusCode.NOT_FOUND, e.status().code());
    assertTrue(
        e.getMessage().contains("dataset 'del' sample 2: file 's3://data/del/c/x2.jpg' no longer exists"),
        e.getMessage());
    assertEquals("sample 3", new String(fetch("del", 0, 3).get(0).payload(), StandardCharsets.UTF_8));
  }

  @Test
  void anObjectReplacedAfterRegistrationIsAClearErrorNeverASplice() throws Exception {
    byte[] v1 = "version one of sample 0".getBytes(StandardCharsets.UTF_8);
    put("rep/c/x0.jpg", v1);
    put("rep/c/x1.jpg", "sample 1".getBytes(StandardCharsets.UTF_8));
    plane.registry().register("rep", "imagefolder", "s3://" + BUCKET + "/rep");
    byte[] v2 = v1.clone();
    v2[8] = 'T'; // "version Two": same size, new ETag
    put("rep/c/x0.jpg", v2);
    FlightRuntimeException e = assertThrows(FlightRuntimeException.class, () -> fetch("rep", 0, 0));
    assertTrue(e.getMessage().contains("object 's3://data/rep/c/x0.jpg' changed after registration"), e.getMessage());
    assertTrue(e.getMessage().contains("HTTP 412") && e.getMessage().contains("re-register the dataset"),
        e.getMessage());
    assertEquals("sample 1", new String(fetch("rep", 0, 1).get(0).payload(), StandardCharsets.UTF_8));
  }

  @Test
  void aMissingBucketIsNamedWithTheEndpoint() {
    FileNotFoundException e = assertThrows(FileNotFoundException.class,
        () -> plane.registry().register("x", "imagefolder", "s3://nope/imgs"));
    assertTrue(e.getMessage().startsWith("bucket 'nope' does not exist at " + endpoint), e.getMessage());
  }

  @Test
  void anEmptyPrefixIsNamed() {
    NoSuchFileException e = assertThrows(NoSuchFileException.class,
        () -> plane.registry().register("x", "tfrecord", "s3://data/nothing/here"));
    assertTrue(e.getMessage().startsWith("s3://data/nothing/here: no objects at this location"), e.getMessage());
  }

  @Test
  void badCredentialsAreAccessDeniedNamingTheLocation() {
    System.setProperty("aws.secretAccessKey", "wrong-secret");
    AccessDeniedException e = assertThrows(AccessDeniedException.class,
        () -> plane.registry().register("x", "imagefolder", "s3://data/imgs"));
    assertTrue(e.getMessage().startsWith("s3://data/imgs/: access denied by " + endpoint), e.getMessage());
    assertTrue(e.getMessage().contains("HTTP 403"), e.getMessage());
    assertTrue(e.getMessage().contains("AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE"), e.getMessage());
  }

  @Test
  void noCredentialsAtAllSaysWhatToSet() {
    System.clearProperty("aws.accessKeyId");
    System.clearProperty("aws.secretAccessKey");
    System.setProperty("aws.disableEc2Metadata", "true"); // no instance-metadata probe off EC2
    System.setProperty("aws.sharedCredentialsFile", tmp.resolve("no-credentials").toString());
    System.setProperty("aws.configFile", tmp.resolve("no-config").toString());
    try {
      IOException e =
          assertThrows(IOException.class, () -> plane.registry().register("x", "imagefolder", "s3://data/imgs"));
      assertTrue(
          e.getMessage().startsWith(
              "no AWS credentials for s3://data/imgs: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE"),
          e.getMessage());
    } finally {
      System.clearProperty("aws.disableEc2Metadata");
      System.clearProperty("aws.sharedCredentialsFile");
      System.clearProperty("aws.configFile");
    }
  }

  @Test
  void keysThatNeedPercentEncodingAreReadOnTheSignedLeanPath() throws Exception {
    String[] names = {"a b.jpg", "plus+eq=amp&.jpg", "caf\u00e9 \u732b.jpg", "tilde~(1)[2]*'!.jpg", "pct%20lit.jpg"};
    for (String n : names) {
      put("odd/c/" + n, ("bytes of " + n).getBytes(StandardCharsets.UTF_8));
    }
    try (S3Storage s = S3Storage.open("s3://data/odd")) {
      for (String n : names) {
        byte[] want = ("bytes of " + n).getBytes(StandardCharsets.UTF_8);
        ByteBuffer dst = ByteBuffer.allocate(want.length - 2);
        s.readFully("c/" + n, 2, dst);
        assertArrayEquals(java.util.Arrays.copyOfRange(want, 2, want.length), dst.array(), n);
      }
      assertTrue(s.leanActive(), "every key was signed and answered on the lean path");
    }
  }

  @Test
  void rangedReadsLandInADirectBufferAndAShortObjectIsNamed() throws Exception {
    try (S3Storage s = S3Storage.open("s3://data/imgs")) {
      byte[] img = images.get("imgs/cat/img3.jpg");
      try (ArrowBuf buf = root.buffer(img.length + 16)) {
        ByteBuffer dst = buf.nioBuffer(16, 100); // a slice in the middle of an Arrow buffer, as the assembler passes
        assertTrue(dst.isDirect());
        s.readFully("cat/img3.jpg", 200, dst);
        assertEquals(0, dst.remaining());
        byte[] got = new byte[100];
        buf.getBytes(16, got);
        assertArrayEquals(java.util.Arrays.copyOfRange(img, 200, 300), got);
      }
      assertTrue(s.leanActive(), "the signed lean GET was answered (a refused signature would fall back to the SDK)");
      assertEquals(img.length, s.size("cat/img3.jpg")); // not listed by this storage: a HEAD
      EOFException eof =
          assertThrows(EOFException.class, () -> s.readFully("cat/img3.jpg", img.length - 10, ByteBuffer.allocate(20)));
      assertTrue(eof.getMessage().contains("'s3://data/imgs/cat/img3.jpg' ended at byte " + img.length),
          eof.getMessage());
      NoSuchFileException gone = assertThrows(NoSuchFileException.class, () -> s.size("cat/missing.jpg"));
      assertEquals("s3://data/imgs/cat/missing.jpg", gone.getFile());
      assertTrue(s.version("cat/img3.jpg").endsWith(":" + img.length), s.version("cat/img3.jpg"));
    }
  }

  @Test
  void theEndpointAndRegionMayComeFromTheActiveProfile() throws Exception {
    Path config = tmp.resolve("config");
    Files.writeString(
        config,
        "[profile s3test]\nregion = eu-west-1\nservices = local\n\n[services local]\ns3 =\n  endpoint_url = " + endpoint
            + "\n\n[profile plain]\nendpoint_url = " + endpoint + "\n");
    assumeTrue(
        System.getenv("AWS_ENDPOINT_URL_S3") == null && System.getenv("AWS_ENDPOINT_URL") == null
            && System.getenv("AWS_REGION") == null,
        "the environment's AWS_ENDPOINT_URL/AWS_REGION would win over the profile");
    System.clearProperty("aws.endpointUrlS3");
    System.clearProperty("aws.region");
    System.setProperty("aws.configFile", config.toString());
    System.setProperty("aws.sharedCredentialsFile", tmp.resolve("no-credentials").toString());
    try {
      System.setProperty("aws.profile", "s3test");
      S3Config c = S3Config.fromEnvironment();
      assertEquals(endpoint, c.endpoint());
      assertEquals(Region.EU_WEST_1, c.region());
      assertTrue(c.forcePathStyle(), "a custom endpoint is addressed path-style");
      assertEquals(List.of("cat", "dog"), new S3Storage("s3://data/imgs", c).listDirectories(""));
      System.setProperty("aws.profile", "plain");
      assertEquals(endpoint, S3Config.fromEnvironment().endpoint());
      assertEquals(Region.US_EAST_1, S3Config.fromEnvironment().region(), "no region anywhere: us-east-1");
    } finally {
      System.clearProperty("aws.profile");
      System.clearProperty("aws.configFile");
      System.clearProperty("aws.sharedCredentialsFile");
    }
  }

  @Test
  void listingsFollowContinuationTokens() throws Exception {
    S3Storage s = new S3Storage("s3://data/imgs", S3Config.fromEnvironment());
    s.pageSize = 2;
    assertEquals(List.of("cat", "dog"), s.listDirectories(""));
    List<String> all = s.listObjects("");
    assertEquals(images.size() + 1, all.size(), all.toString()); // + README.txt; not the "dog/" marker
    assertEquals(List.of("README.txt", "cat/img0.jpg"), all.subList(0, 2));
    assertEquals(List.of("dog/sub"), s.listDirectories("dog")); // root-relative, as LocalStorage
  }
}
