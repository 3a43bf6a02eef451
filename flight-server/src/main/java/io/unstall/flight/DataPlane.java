package io.unstall.flight;

import io.unstall.flight.auth.BearerTokenAuthenticator;
import io.unstall.flight.auth.TenantTokens;
import io.unstall.flight.cache.DiskTier;
import io.unstall.flight.cache.LruCache;
import io.unstall.flight.cache.MinioCache;
import io.unstall.flight.cache.SampleCache;
import io.unstall.flight.cluster.ClusterSettings;
import io.unstall.flight.cluster.HazelcastCluster;
import io.unstall.flight.cluster.PeerClients;
import io.unstall.flight.cluster.PrepDirectory;
import io.unstall.flight.dataset.DatasetRegistry;
import io.unstall.flight.local.LocalServer;
import io.unstall.flight.local.LocalService;
import io.unstall.flight.prep.PrepPipeline;
import io.unstall.flight.prep.PrepService;
import io.unstall.flight.prep.PrepWorker;
import io.unstall.flight.session.Sessions;
import io.unstall.flight.shm.SharedMemory;
import java.io.File;
import java.io.IOException;
import java.net.BindException;
import java.net.InetAddress;
import java.nio.file.Path;
import io.unstall.flight.storage.Throttle;
import java.util.concurrent.TimeUnit;
import org.apache.arrow.flight.FlightServer;
import org.apache.arrow.flight.Location;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.util.AutoCloseables;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The data plane's composition root: it builds every service and child allocator, and closes them in
 * reverse. It takes a parent allocator (the process's root, owned by main) and creates its children:
 * "cache" (the cache's capacity), "prefetch" (the prefetch window) and "streams" (batches in flight, local
 * staging and prep staging: the rest of the budget). Clients reach it over Flight (any host) and, on this
 * host, over the local socket that hands out shared-memory references ({@code SharedMemory}). Flight accepts
 * the owner's token and the tenant tokens of {@link TenantTokens} (each tenant limited to its datasets); the
 * local socket only the owner, by its uid (in a 0700 directory, checked with SO_PEERCRED) and its token.
 * In a cluster (the partitioned cache) it also serves a peer port to the other sidecars and joins their
 * Hazelcast cluster.
 */
public final class DataPlane implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(DataPlane.class);
  /** The sidecar's shared-memory directory is /dev/shm/unstall-<pid>; the local socket lives in it. */
  public static final String SHM_PREFIX = "unstall-";
  public static final String SOCKET = "data.sock";

  private final DatasetRegistry registry = new DatasetRegistry();
  private final SampleCache cache;
  private final DiskTier disk;
  private final SharedMemory shm; // null: no same-host plane
  private final Sessions sessions;
  private final LocalServer local; // null with shm
  private final BatchAssembler assembler;
  private final BufferAllocator cacheMemory; // "cache": the memory cache's arena (limit: the capacity)
  private final BufferAllocator prefetchMemory; // "prefetch": the prefetch window's staging
  // "streams": batches in flight, same-host staging; parent of the prep allocators below
  private final BufferAllocator streams;
  private final BufferAllocator prepMemory; // "prep": prep staging (each group opens its child in it)
  private final BufferAllocator decodeMemory; // "decode": the decode budget (reservations only)
  private final BufferAllocator reindexMemory; // "reindexed": restart-indexed JPEG copies, never evicted
  private final BufferAllocator peerMemory; // "peer-clients": batches from peers; null without a cluster
  private final BufferAllocator formatMemory; // "formats": decoded Parquet row groups, HDF5 chunks
  private final UnstallProducer producer;
  private final FlightCalls calls;
  private final FlightServer server;
  private final boolean tls;
  private final TenantTokens tenants;
  private final ClusterSettings clusterSettings; // null: a sidecar on its own
  private final FlightServer peerServer; // null without a cluster
  private final FlightCalls peerCalls; // the peer server's bounded executor; null without a cluster
  private final PeerClients peerClients; // null without a cluster
  private volatile HazelcastCluster cluster; // joined in start()
  private volatile PrepDirectory prepDirectory; // the cluster's directory of prep groups; null without a cluster

  private DataPlane(Builder b) throws IOException {
    long budget = b.parent.getLimit();
    long cacheReserve = (b.cacheCapacity + MinioCache.PAGE - 1) / MinioCache.PAGE * MinioCache.PAGE;
    if (cacheReserve >= budget) {
      throw new IllegalArgumentException(
          "--cache-capacity (" + b.cacheCapacity + " bytes) must be below --memory-budget (" + budget
              + " bytes): the rest carries batches in flight");
    }
    if (cacheReserve + b.prefetchWindowBytes >= budget) {
      throw new IllegalArgumentException(
          "--cache-capacity plus --prefetch-window-bytes (" + (cacheReserve + b.prefetchWindowBytes)
              + " bytes) must be below --memory-budget (" + budget + " bytes)");
    }
    long streamsLimit = budget - cacheReserve - b.prefetchWindowBytes;
    long decodeBytes = b.decodeMemory > 0 ? b.decodeMemory : PrepService.defaultDecodeMemory(streamsLimit);
    if (decodeBytes > streamsLimit) {
      throw new IllegalArgumentException("--decode-memory (" + decodeBytes + " bytes) must be in 1.."
          + streamsLimit + ", the memory left for batches in flight");
    }
    long reindexBytes = b.reindexMemory >= 0 ? b.reindexMemory : PrepService.defaultReindexMemory(streamsLimit);
    if (reindexBytes > streamsLimit / 2) {
      throw new IllegalArgumentException("--reindex-memory (" + reindexBytes + " bytes) must be at most "
          + streamsLimit / 2 + ", half the memory left for batches in flight (" + streamsLimit + " bytes)");
    }
    Bounds bounds = new Bounds(b.flightThreads, b.flightQueue, b.localConnections, b.waitTimeout, b.maxPlanIds,
        b.statsEpochs, b.prepGroups, b.prepThreads, b.prepClaimTimeout);
    // Every allocator below the root is built here, handed to the one service that draws from it, and closed
    // here after that service (close()): services never create or close one, except the per-group children a
    // prep group opens in "prep".
    this.cacheMemory = b.parent.newChildAllocator("cache", 0, cacheReserve);
    this.prefetchMemory = b.parent.newChildAllocator("prefetch", 0, Math.max(0, b.prefetchWindowBytes));
    this.streams = b.parent.newChildAllocator("streams", 0, streamsLimit);
    this.prepMemory = streams.newChildAllocator("prep", 0, streams.getLimit() / 2);
    this.decodeMemory = streams.newChildAllocator("decode", 0, decodeBytes);
    this.reindexMemory = streams.newChildAllocator("reindexed", 0, reindexBytes);
    this.peerMemory = b.cluster == null ? null : streams.newChildAllocator("peer-clients", 0, Long.MAX_VALUE);
    this.formatMemory = streams.newChildAllocator("formats", 0, streams.getLimit() / 4);
    try {
      registry.decodeFormatsIn(formatMemory);
      this.tls = b.tls;
      registry.keepStatsEpochs(bounds.statsEpochs());
      this.tenants = b.tenants;
      this.shm = b.sharedMemory && SharedMemory.available() ? SharedMemory.create(SHM_PREFIX) : null;
      this.cache = switch (b.cachePolicy) {
        case "minio" -> new MinioCache(cacheMemory, b.cacheCapacity, shm);
        case "lru" -> new LruCache(cacheMemory, b.cacheCapacity);
        default -> throw new IllegalArgumentException(
            "invalid value for option '--cache-policy': '" + b.cachePolicy + "' (choose minio or lru)");
      };
      DiskTier diskTier = null;
      if (b.diskDir != null) {
        diskTier = new DiskTier(b.diskDir, b.diskCapacity);
        registry.persistManifestsIn(b.diskDir.resolve("manifests"), diskTier, b.checkpointEvery);
      }
      this.disk = diskTier;
      if (b.storageBandwidth > 0) {
        registry.throttleStorage(new Throttle(b.storageBandwidth, bounds.waitTimeout()));
      }
      this.assembler = new BatchAssembler(cache, disk, prefetchMemory, b.prefetchWindowSamples, b.prefetchThreads);
      StreamBudget streamBudget = new StreamBudget(streams, b.budgetTimeoutSeconds, TimeUnit.SECONDS);
      this.sessions = new Sessions(s -> assembler.prefetcher().cancel(s.owner()));
      this.calls = new FlightCalls(bounds);
      this.producer = new UnstallProducer(registry, cache, disk, assembler, streams, streamBudget,
          new PrepService(registry, assembler, prepMemory, decodeMemory, reindexMemory, bounds, b.decodeLimits,
              b.budgetTimeoutSeconds),
          sessions, calls, bounds, tenants);
      this.local = shm == null ? null : new LocalServer(shm.resolve(SOCKET),
          new LocalService(b.token, registry, sessions, assembler, streams, streamBudget, shm, bounds, producer.prep()),
          bounds.localConnections());
      Location location = b.tls ? Location.forGrpcTls(b.host, b.port) : Location.forGrpcInsecure(b.host, b.port);
      // A message no call could use is refused by gRPC before it is buffered: the longest is a PLAN at the bound or
      // an upload of a prepared batch (at most the prep staging, half the streams budget).
      long maxMessage = Math.max(64L * 1024 + 8L * bounds.maxPlanIds(), streams.getLimit() / 2 + (1 << 20));
      FlightServer.Builder sb =
          FlightServer.builder(streams, location, producer)
              .executor(calls.executor())
              .maxInboundMessageSize((int) Math.min(Integer.MAX_VALUE, maxMessage))
              .headerAuthenticator(new BearerTokenAuthenticator(b.token, tenants));
      if (b.tls) {
        sb.useTls(b.certChain, b.privateKey);
      }
      this.server = sb.build();
      this.clusterSettings = b.cluster;
      this.peerCalls = b.cluster == null ? null : new FlightCalls(bounds);
      if (b.cluster != null) {
        producer.reportCluster(() -> cluster);
        ClusterSettings c = b.cluster;
        Location peerLocation =
            c.tls() ? Location.forGrpcTls(c.bind(), c.peerPort()) : Location.forGrpcInsecure(c.bind(), c.peerPort());
        FlightServer.Builder pb = FlightServer.builder(streams, peerLocation,
                new PeerProducer(registry, assembler, streams, streamBudget, bounds.waitTimeout(), producer.prep()))
            .executor(peerCalls.executor()) // its own bounded pool: peers never take the clients' threads
            .maxInboundMessageSize((int) Math.min(Integer.MAX_VALUE, maxMessage)) // a remote worker's batch at most
            .headerAuthenticator(new BearerTokenAuthenticator(c.token(), "the cluster token file, --cluster-token"));
        if (c.tls()) {
          pb.useTls(c.tlsCert().toFile(), c.tlsKey().toFile());
        }
        this.peerServer = pb.build();
        this.peerClients = new PeerClients(peerMemory, c);
      } else {
        this.peerServer = null;
        this.peerClients = null;
      }
    } catch (Throwable t) { // no allocator of a failed start stays open: the root must close cleanly
      try {
        AutoCloseables.close(java.util.Arrays.asList(formatMemory, peerMemory, reindexMemory, decodeMemory,
            prepMemory, streams, prefetchMemory, cacheMemory));
      } catch (Exception e) {
        t.addSuppressed(e);
      }
      throw t;
    }
  }

  public static Builder builder(BufferAllocator parent, String token) {
    return new Builder(parent, token);
  }

  /** Starts listening; a taken port is a {@link BindException} that names it. */
  public DataPlane start() throws IOException {
    try {
      server.start();
      if (local != null) {
        local.start();
        producer.prep().localSocket(local.path()); // same-host members ask prep.next on it, not over gRPC
      }
      if (clusterSettings != null) {
        startCluster();
      }
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

  /** Opens the peer port, then joins the cluster publishing it; until then every sample is this sidecar's. */
  private void startCluster() throws IOException {
    try {
      peerServer.start();
    } catch (IOException e) {
      if (isBindFailure(e)) {
        BindException be = new BindException("peer port " + clusterSettings.peerPort() + " on "
            + clusterSettings.bind() + " is already in use (pick --peer-port)");
        be.initCause(e);
        throw be;
      }
      throw e;
    }
    String host = clusterSettings.bind().contains(":") ? "[" + clusterSettings.bind() + "]" : clusterSettings.bind();
    String self = host + ":" + peerServer.getPort();
    HazelcastCluster c = HazelcastCluster.join(clusterSettings, self, p -> {
      peerClients.drop(p);
      PrepDirectory d = prepDirectory;
      if (d != null) {
        d.forget(p);
      }
    });
    cluster = c;
    prepDirectory = c.prepDirectory(self);
    producer.prep().announceIn(prepDirectory); // groups this sidecar prepares take remote prep workers
    assembler.joinCluster(c, peerClients);
  }

  /** The cluster's directory of prep groups that take remote prep workers, or null without a cluster. */
  public PrepDirectory prepDirectory() {
    return prepDirectory;
  }

  /** The cluster this sidecar joined, or null. */
  public HazelcastCluster cluster() {
    return cluster;
  }

  /**
   * Enlists this sidecar as a remote prep worker of prep group {@code group} owned by the sidecar whose peer port is
   * {@code ownerPeer} ({@code host:port}, same cluster token); it prepares that group's batches until the returned
   * worker is closed (it leaves) or the group closes. Needs a cluster (the peer port and token).
   */
  public PrepWorker enlistPrepWorker(String ownerPeer, String group) throws Exception {
    if (peerClients == null) {
      throw new IllegalStateException("a remote prep worker needs a cluster (--cluster-members, --cluster-token)");
    }
    String me = clusterSettings.bind() + ":" + peerPort();
    return producer.prep().enlist(peerClients.client(ownerPeer), ownerPeer, peerClients.callOptions(), group, me);
  }

  /** The peer port, or -1 without a cluster. */
  public int peerPort() {
    return peerServer == null ? -1 : peerServer.getPort();
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

  /** The local socket of same-host clients, or null when there is no shared-memory plane. */
  public Path localEndpoint() {
    return local == null ? null : local.path();
  }

  /** The tenant tokens Flight accepts besides the owner's. */
  public TenantTokens tenants() {
    return tenants;
  }

  public Sessions sessions() {
    return sessions;
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

  /** The disk tier, or null. */
  public DiskTier disk() {
    return disk;
  }

  public Prefetcher prefetcher() {
    return assembler.prefetcher();
  }

  /** The Flight executor and its admission of calls that wait. */
  public FlightCalls flightCalls() {
    return calls;
  }

  /** The same-host socket server, or null when there is no shared-memory plane. */
  public LocalServer localServer() {
    return local;
  }

  /** Stops serving (waiting for calls in progress), logs final stats, frees memory. */
  @Override
  public void close() throws Exception {
    try {
      if (cluster != null) {
        cluster.close(); // leave first: the others take over this sidecar's partitions while it stops
      }
      if (peerServer != null) {
        peerServer.shutdown();
        if (!peerServer.awaitTermination(10, TimeUnit.SECONDS)) {
          LOG.warn("peer calls still running after 10 s; closing anyway");
        }
        peerServer.close();
      }
      server.shutdown();
      if (!server.awaitTermination(10, TimeUnit.SECONDS)) {
        LOG.warn("Flight calls still running after 10 s; closing anyway");
      }
      server.close();
    } finally {
      producer.logStats();
      try {
        AutoCloseables.close(calls, peerCalls, local, producer.prep(), assembler::close, peerClients, registry, cache,
            disk, formatMemory, peerMemory, reindexMemory, decodeMemory, prepMemory, streams, prefetchMemory,
            cacheMemory);
      } finally {
        if (shm != null) {
          shm.remove();
        }
      }
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
    private PrepPipeline.DecodeLimits decodeLimits = PrepPipeline.DecodeLimits.DEFAULT;
    private long decodeMemory; // 0: PrepService's default
    private long reindexMemory = -1; // -1: PrepService's default
    private String cachePolicy = "minio";
    private Path diskDir;
    private long diskCapacity;
    private java.time.Duration checkpointEvery = DatasetRegistry.CHECKPOINT_EVERY;
    private long prefetchWindowBytes;
    private int prefetchWindowSamples = 1024;
    private int prefetchThreads = 8;
    private long storageBandwidth;
    private boolean tls;
    private boolean sharedMemory = true;
    private TenantTokens tenants = TenantTokens.none();
    private File certChain;
    private File privateKey;
    private int flightThreads = Bounds.FLIGHT_THREADS;
    private int flightQueue = Bounds.FLIGHT_QUEUE;
    private int localConnections = Bounds.LOCAL_CONNECTIONS;
    private java.time.Duration waitTimeout = Bounds.WAIT_TIMEOUT;
    private int maxPlanIds = Bounds.MAX_PLAN_IDS;
    private int statsEpochs = Bounds.STATS_EPOCHS;
    private int prepGroups = Bounds.PREP_GROUPS;
    private int prepThreads = Bounds.defaultPrepThreads();
    private java.time.Duration prepClaimTimeout = Bounds.PREP_CLAIM_TIMEOUT;
    private ClusterSettings cluster;

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

    /** {@code minio} (never evict, the default) or {@code lru}. */
    public Builder cachePolicy(String policy) {
      this.cachePolicy = policy;
      return this;
    }

    /**
     * A disk tier of {@code capacity} bytes in {@code dir}; it persists across restarts, checkpointed with the
     * manifests every {@code checkpointEvery} (by default {@link DatasetRegistry#CHECKPOINT_EVERY}).
     */
    public Builder diskTier(Path dir, long capacity) {
      this.diskDir = dir;
      this.diskCapacity = capacity;
      return this;
    }

    public Builder checkpointEvery(java.time.Duration every) {
      this.checkpointEvery = every;
      return this;
    }

    /** Prefetch at most {@code samples} ahead of consumption, staging at most {@code bytes}; 0 disables. */
    public Builder prefetch(long bytes, int samples, int threads) {
      this.prefetchWindowBytes = bytes;
      this.prefetchWindowSamples = samples;
      this.prefetchThreads = threads;
      return this;
    }

    /** Throttle storage reads to {@code bytesPerSecond} (0: unthrottled), as a slow remote link would. */
    public Builder storageBandwidth(long bytesPerSecond) {
      this.storageBandwidth = bytesPerSecond;
      return this;
    }

    /** Whether clients on this host get the shared-memory plane (the local socket); on by default. */
    /**
     * Prep decoding: the caps of pipelines that name none ({@code --max-decode-pixels},
     * {@code --max-decode-aspect-ratio}) and the native memory decodes may hold at once ({@code --decode-memory};
     * 0: a quarter of the streams budget).
     */
    public Builder decode(long maxPixels, double maxAspectRatio, long memoryBytes) {
      this.decodeLimits = new PrepPipeline.DecodeLimits(maxPixels, maxAspectRatio);
      this.decodeMemory = memoryBytes;
      return this;
    }

    /**
     * Memory for restart-indexed JPEG copies ({@code --reindex-memory}; -1: a quarter of the streams budget; 0:
     * none).
     */
    public Builder reindexMemory(long bytes) {
      this.reindexMemory = bytes;
      return this;
    }

    public Builder sharedMemory(boolean on) {
      this.sharedMemory = on;
      return this;
    }

    /** Tokens the owner issued to tenants (data plane only, granted datasets only); none by default. */
    public Builder tenants(TenantTokens tenants) {
      this.tenants = tenants;
      return this;
    }

    public Builder budgetTimeoutSeconds(long seconds) {
      this.budgetTimeoutSeconds = seconds;
      return this;
    }

    /** Every bound at once (the sidecar's {@code serve} options); the setters below set one each. */
    public Builder bounds(Bounds bounds) {
      flightThreads(bounds.flightThreads(), bounds.flightQueue());
      localConnections(bounds.localConnections());
      waitTimeout(bounds.waitTimeout());
      maxPlanIds(bounds.maxPlanIds());
      statsEpochs(bounds.statsEpochs());
      return prep(bounds.prepGroups(), bounds.prepThreads(), bounds.prepClaimTimeout());
    }

    /**
     * The Flight executor's threads and queue ({@code --flight-threads}, {@code --flight-queue}); see
     * {@link FlightCalls}.
     */
    public Builder flightThreads(int threads, int queue) {
      this.flightThreads = threads;
      this.flightQueue = queue;
      return this;
    }

    /** Same-host socket connections, one thread each ({@code --local-connections}). */
    public Builder localConnections(int connections) {
      this.localConnections = connections;
      return this;
    }

    /**
     * How long a call waits inside the sidecar for a prep batch, staging, storage or its client
     * ({@code --wait-timeout}).
     */
    public Builder waitTimeout(java.time.Duration timeout) {
      this.waitTimeout = timeout;
      return this;
    }

    /** Ids in one prefetch plan ({@code --max-plan-ids}). */
    public Builder maxPlanIds(int ids) {
      this.maxPlanIds = ids;
      return this;
    }

    /** Epochs whose counters each dataset keeps in stats ({@code --stats-epochs}). */
    public Builder statsEpochs(int epochs) {
      this.statsEpochs = epochs;
      return this;
    }

    /**
     * Open prep groups ({@code --prep-groups}), the prep pool's threads ({@code --prep-threads}) and how long an
     * external group's member may hold a claim ({@code --prep-claim-timeout}).
     */
    public Builder prep(int groups, int threads, java.time.Duration claimTimeout) {
      this.prepGroups = groups;
      this.prepThreads = threads;
      this.prepClaimTimeout = claimTimeout;
      return this;
    }

    public Builder tls(File certChain, File privateKey) {
      this.tls = true;
      this.certChain = certChain;
      this.privateKey = privateKey;
      return this;
    }

    /** Joins the cluster of {@code settings} (the partitioned cache); off by default. */
    public Builder cluster(ClusterSettings settings) {
      this.cluster = settings;
      return this;
    }

    public DataPlane build() throws IOException {
      return new DataPlane(this);
    }
  }
}
