package io.unstall.flight;

import io.unstall.flight.cache.MinioCache;
import io.unstall.flight.cache.SampleCache;
import io.unstall.flight.dataset.DatasetRegistry;
import java.io.File;
import java.io.IOException;
import java.net.BindException;
import java.net.InetAddress;
import java.util.concurrent.TimeUnit;
import org.apache.arrow.flight.FlightServer;
import org.apache.arrow.flight.Location;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.util.AutoCloseables;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The Flight data plane: the dataset registry, the cache and the Flight server, with their allocators. It
 * takes a parent allocator (the process's root, owned by main) and creates and closes its own children:
 * "cache" (the cache's capacity) and "streams" (batches in flight: the rest of the budget).
 */
public final class DataPlane implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(DataPlane.class);

  private final DatasetRegistry registry = new DatasetRegistry();
  private final SampleCache cache;
  private final BufferAllocator streams;
  private final UnstallProducer producer;
  private final FlightServer server;
  private final boolean tls;

  private DataPlane(Builder b) throws IOException {
    long budget = b.parent.getLimit();
    long cacheReserve = (b.cacheCapacity + MinioCache.PAGE - 1) / MinioCache.PAGE * MinioCache.PAGE;
    if (cacheReserve >= budget) {
      throw new IllegalArgumentException(
          "--cache-capacity (" + b.cacheCapacity + " bytes) must be below --memory-budget (" + budget
              + " bytes): the rest carries batches in flight");
    }
    this.tls = b.tls;
    this.cache = new MinioCache(b.parent, b.cacheCapacity);
    this.streams = b.parent.newChildAllocator("streams", 0, budget - cacheReserve);
    this.producer =
        new UnstallProducer(registry, cache, streams, new StreamBudget(streams, b.budgetTimeoutSeconds, TimeUnit.SECONDS));
    Location location = b.tls ? Location.forGrpcTls(b.host, b.port) : Location.forGrpcInsecure(b.host, b.port);
    FlightServer.Builder sb =
        FlightServer.builder(streams, location, producer)
            .headerAuthenticator(new BearerTokenAuthenticator(b.token));
    if (b.tls) {
      sb.useTls(b.certChain, b.privateKey);
    }
    this.server = sb.build();
  }

  public static Builder builder(BufferAllocator parent, String token) {
    return new Builder(parent, token);
  }

  /** Starts listening; a taken port is a {@link BindException} that names it. */
  public DataPlane start() throws IOException {
    try {
      server.start();
    } catch (IOException e) {
      if (isBindFailure(e)) {
        BindException be = new BindException("Flight port " + server.getLocation().getUri().getPort() + " on "
            + server.getLocation().getUri().getHost() + " is already in use (another sidecar? pick --port)");
        be.initCause(e);
        throw be;
      }
      throw e;
    }
    return this;
  }

  private static boolean isBindFailure(Throwable e) {
    for (Throwable t = e; t != null; t = t.getCause()) {
      if (t instanceof BindException || (t.getMessage() != null && t.getMessage().contains("Address already in use"))) {
        return true;
      }
    }
    return false;
  }

  public int port() {
    return server.getPort();
  }

  public Location location() {
    String host = server.getLocation().getUri().getHost();
    return tls ? Location.forGrpcTls(host, port()) : Location.forGrpcInsecure(host, port());
  }

  public DatasetRegistry registry() {
    return registry;
  }

  public UnstallProducer producer() {
    return producer;
  }

  public SampleCache cache() {
    return cache;
  }

  /** Stops serving (waiting for calls in progress), logs final stats, frees memory. */
  @Override
  public void close() throws Exception {
    try {
      server.shutdown();
      if (!server.awaitTermination(10, TimeUnit.SECONDS)) {
        LOG.warn("Flight calls still running after 10 s; closing anyway");
      }
      server.close();
    } finally {
      producer.logStats();
      AutoCloseables.close(registry, cache, streams);
    }
  }

  /** Data-plane settings. */
  public static final class Builder {
    private final BufferAllocator parent;
    private final String token;
    private String host = InetAddress.getLoopbackAddress().getHostAddress();
    private int port;
    private long cacheCapacity;
    private long budgetTimeoutSeconds = 60;
    private boolean tls;
    private File certChain;
    private File privateKey;

    private Builder(BufferAllocator parent, String token) {
      this.parent = parent;
      this.token = token;
    }

    public Builder host(String host) {
      this.host = host;
      return this;
    }

    public Builder port(int port) {
      this.port = port;
      return this;
    }

    public Builder cacheCapacity(long bytes) {
      this.cacheCapacity = bytes;
      return this;
    }

    public Builder budgetTimeoutSeconds(long seconds) {
      this.budgetTimeoutSeconds = seconds;
      return this;
    }

    public Builder tls(File certChain, File privateKey) {
      this.tls = true;
      this.certChain = certChain;
      this.privateKey = privateKey;
      return this;
    }

    public DataPlane build() throws IOException {
      return new DataPlane(this);
    }
  }
}
