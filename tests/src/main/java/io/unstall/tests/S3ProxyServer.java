package io.unstall.tests;

import java.net.URI;
import java.util.Properties;
import org.gaul.s3proxy.BlobStores;
import org.gaul.s3proxy.S3Proxy;
import org.gaul.s3proxy.auth.AuthenticationType;

/**
 * A real S3-API server (S3Proxy) as its own process, for tests/python/test_s3.py:
 *
 * <pre>java -cp tests/target/classes:$(cat tests/target/s3proxy.classpath) io.unstall.tests.S3ProxyServer \
 *     [--host 127.0.0.1] [--port 0] [--identity ID] [--credential SECRET] [--basedir DIR]</pre>
 *
 * Listens on {@code --host} (127.0.0.1 by default; port 0: a free one) with SigV2/V4 authentication, keeps
 * objects in memory (or under {@code --basedir}), prints {@code S3PROXY READY http://<host>:<port>} once it
 * serves, and runs until killed.
 */
public final class S3ProxyServer {
  public static final String READY = "S3PROXY READY ";

  private S3ProxyServer() {}

  public static void main(String[] args) throws Exception {
    System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn"); // before the first logger exists
    String host = "127.0.0.1";
    int port = 0;
    String identity = "unstall";
    String credential = "unstall-secret";
    String basedir = null;
    for (int i = 0; i < args.length; i++) {
      String value = i + 1 < args.length ? args[i + 1] : null;
      switch (args[i]) {
        case "--host" -> host = required(args[i], value);
        case "--port" -> port = Integer.parseInt(required(args[i], value));
        case "--identity" -> identity = required(args[i], value);
        case "--credential" -> credential = required(args[i], value);
        case "--basedir" -> basedir = required(args[i], value);
        default -> {
          System.err.println(
              "unknown option '" + args[i] + "'; use --host, --port, --identity, --credential, --basedir");
          System.exit(2);
        }
      }
      i++;
    }
    Properties props = new Properties();
    if (basedir != null) {
      props.setProperty("jclouds.filesystem.basedir", basedir);
    }
    S3Proxy proxy =
        S3Proxy.builder()
            .blobStore(BlobStores.create(basedir == null ? "transient" : "filesystem", props))
            .endpoint(URI.create("http://" + host + ":" + port))
            .awsAuthentication(AuthenticationType.AWS_V2_OR_V4, identity, credential)
            .build();
    proxy.start();
    while (!proxy.getState().equals("STARTED")) {
      if (proxy.getState().equals("FAILED")) {
        System.err.println("S3Proxy failed to start on " + host + ":" + port);
        System.exit(1);
      }
      Thread.sleep(10);
    }
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      try {
        proxy.stop();
      } catch (Exception e) {
        // exiting anyway
      }
    }));
    System.out.println(READY + "http://" + host + ":" + proxy.getPort());
    System.out.flush();
    Thread.currentThread().join();
  }

  private static String required(String option, String value) {
    if (value == null) {
      System.err.println("option " + option + " needs a value");
      System.exit(2);
    }
    return value;
  }
}
