package io.unstall.sidecar;

import io.unstall.flight.Bounds;
import io.unstall.flight.prep.PrepPipeline;
import io.unstall.flight.cluster.ClusterSettings;
import java.net.InetAddress;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.Callable;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

/** {@code serve}: run the sidecar until SIGTERM (or a control-plane shutdown). */
@Command(
    name = "serve",
    mixinStandardHelpOptions = true,
    description = "Start the Flight data plane and the Py4J control plane and serve until stopped.")
public final class ServeCommand implements Callable<Integer> {

  @Option(names = "--config", paramLabel = "FILE",
      description = "Properties file with these options as keys (cache-capacity=4GiB); flags override it.")
  Path config;

  @Option(names = "--bind", defaultValue = "${env:UNSTALL_BIND:-127.0.0.1}",
      description = "Address to listen on (default ${DEFAULT-VALUE}). A non-loopback address requires"
          + " --tls-cert/--tls-key.")
  String bind;

  @Option(names = "--port", defaultValue = "${env:UNSTALL_FLIGHT_PORT:-8815}",
      description = "Flight port (default ${DEFAULT-VALUE}; 0 picks a free one).")
  int port;

  @Option(names = "--control-port", defaultValue = "${env:UNSTALL_CONTROL_PORT:-0}",
      description = "Py4J control-plane port, always on loopback (default ${DEFAULT-VALUE}: a free one).")
  int controlPort;

  @Option(names = "--cache-capacity", defaultValue = "${env:UNSTALL_CACHE_CAPACITY:-1GiB}", paramLabel = "SIZE",
      description = "Bytes the never-evict cache may hold (default ${DEFAULT-VALUE}; 0 disables it).")
  String cacheCapacity;

  @Option(names = "--memory-budget", defaultValue = "${env:UNSTALL_MEMORY_BUDGET:-2GiB}", paramLabel = "SIZE",
      description = "Off-heap bytes the sidecar may use in all: the cache plus batches in flight"
          + " (default ${DEFAULT-VALUE}).")
  String memoryBudget;

  @Option(names = "--home", defaultValue = "${env:UNSTALL_HOME:-${sys:user.home}/.unstall}",
      description = "Directory of the state and token files (default ${DEFAULT-VALUE}).")
  Path home;

  @Option(names = "--state-file", description = "Where to write the discovery file (default HOME/sidecar.json).")
  Path stateFile;

  @Option(names = "--token-file", description = "The token file, created (mode 0600) if missing (default HOME/token).")
  Path tokenFile;

  @Option(names = "--tls-cert", description = "PEM certificate chain; enables TLS on the Flight port.")
  Path tlsCert;

  @Option(names = "--tls-key", description = "PEM private key for --tls-cert.")
  Path tlsKey;

  @Option(names = "--cache-policy", defaultValue = "${env:UNSTALL_CACHE_POLICY:-minio}",
      description = "minio (admit until full, never evict; default) or lru (for comparison).")
  String cachePolicy;

  @Option(names = "--disk-cache-dir", paramLabel = "DIR",
      description = "Directory of the disk cache tier (never evicts, checksummed, survives restarts); off if unset.")
  Path diskCacheDir;

  @Option(names = "--disk-cache-capacity", defaultValue = "${env:UNSTALL_DISK_CACHE_CAPACITY:-10GiB}",
      paramLabel = "SIZE",
      description = "Bytes the disk tier may hold (default ${DEFAULT-VALUE}).")
  String diskCacheCapacity;

  @Option(names = "--prefetch-window-bytes", defaultValue = "${env:UNSTALL_PREFETCH_WINDOW_BYTES:-auto}",
      paramLabel = "SIZE",
      description = "Memory for samples read ahead of consumption (default ${DEFAULT-VALUE}: 1/8 of the memory"
          + " budget; 0 disables prefetch).")
  String prefetchWindowBytes;

  @Option(names = "--prefetch-window", defaultValue = "1024", paramLabel = "SAMPLES",
      description = "How many samples ahead of consumption prefetch may run (default ${DEFAULT-VALUE}).")
  int prefetchWindowSamples;

  @Option(names = "--prefetch-threads", defaultValue = "8",
      description = "Parallel storage reads for prefetch (default ${DEFAULT-VALUE}).")
  int prefetchThreads;

  @Option(names = "--storage-bandwidth", defaultValue = "0", paramLabel = "SIZE",
      description = "Throttle storage reads to SIZE per second, as a slow link to remote storage would (0: off).")
  String storageBandwidth;

  @Option(names = "--batch-timeout", defaultValue = "60", paramLabel = "SECONDS",
      description = "How long a fetch may wait for memory under load before RESOURCE_EXHAUSTED"
          + " (default ${DEFAULT-VALUE}).")
  long batchTimeoutSeconds;

  @Option(names = "--max-decode-pixels", defaultValue = "89478485", paramLabel = "PIXELS",
      description = "Prep: refuse images whose header declares more pixels, before decoding (default ${DEFAULT-VALUE},"
          + " PIL's MAX_IMAGE_PIXELS; a pipeline's decode max_pixels overrides it).")
  long maxDecodePixels;

  @Option(names = "--max-decode-aspect-ratio", defaultValue = "100", paramLabel = "RATIO",
      description = "Prep: refuse images whose longer side exceeds RATIO times the shorter, before decoding"
          + " (default ${DEFAULT-VALUE}; a pipeline's decode max_aspect_ratio overrides it).")
  double maxDecodeAspectRatio;

  @Option(names = "--decode-memory", defaultValue = "auto", paramLabel = "SIZE",
      description = "Prep: native memory that decodes in progress may hold at once, within --memory-budget"
          + " (default ${DEFAULT-VALUE}: a quarter of what the cache and prefetch leave); decodes wait for it.")
  String decodeMemory;

  @Option(names = "--reindex-memory", defaultValue = "${env:UNSTALL_REINDEX_MEMORY:-auto}", paramLabel = "SIZE",
      description = "Prep: memory for restart-indexed copies of JPEGs, made on a sample's first decode and never"
          + " evicted, from which later crops decode only the part they keep, within --memory-budget (default"
          + " ${DEFAULT-VALUE}: a quarter of what the cache and prefetch leave; 0 turns them off).")
  String reindexMemory;
  @Option(names = "--flight-threads", defaultValue = "" + Bounds.FLIGHT_THREADS,
      description = "Flight executor threads; a quarter of them serve only calls that never wait, and a call that"
          + " would wait beyond the rest is refused with RESOURCE_EXHAUSTED (default ${DEFAULT-VALUE}).")
  int flightThreads;

  @Option(names = "--flight-queue", defaultValue = "" + Bounds.FLIGHT_QUEUE,
      description = "Flight tasks that may wait for a thread (default ${DEFAULT-VALUE}).")
  int flightQueue;

  @Option(names = "--local-connections", defaultValue = "" + Bounds.LOCAL_CONNECTIONS,
      description = "Same-host socket connections, one thread each; more are refused with RESOURCE_EXHAUSTED"
          + " (default ${DEFAULT-VALUE}).")
  int localConnections;

  @Option(names = "--wait-timeout", defaultValue = "120", paramLabel = "SECONDS",
      description = "How long a call waits inside the sidecar for a prep batch or claim, staging room, storage"
          + " bandwidth or its client before it fails with TIMED_OUT (default ${DEFAULT-VALUE}).")
  long waitTimeoutSeconds;

  @Option(names = "--max-plan-ids", defaultValue = "" + Bounds.MAX_PLAN_IDS,
      description = "Ids in one prefetch plan (also at most the dataset's sample count) (default ${DEFAULT-VALUE}).")
  int maxPlanIds;

  @Option(names = "--stats-epochs", defaultValue = "" + Bounds.STATS_EPOCHS,
      description = "Epochs whose counters each dataset keeps in stats, the latest begun (default ${DEFAULT-VALUE}).")
  int statsEpochs;

  @Option(names = "--prep-groups", defaultValue = "" + Bounds.PREP_GROUPS,
      description = "Open coordinated-prep groups, two producer threads each (default ${DEFAULT-VALUE}).")
  int prepGroups;

  @Option(names = "--prep-threads", defaultValue = "auto",
      description = "Decode threads of the prep pool, shared by all groups (default ${DEFAULT-VALUE}: one per core).")
  String prepThreads;

  @Option(names = "--prep-claim-timeout", defaultValue = "120", paramLabel = "SECONDS",
      description = "How long a member of a Python-side prep group may take to upload a batch it claimed before the"
          + " claim goes to another member (default ${DEFAULT-VALUE}).")
  long prepClaimTimeoutSeconds;

  @Option(names = "--no-shm", defaultValue = "${env:UNSTALL_NO_SHM:-false}",
      description = "No shared-memory data plane: clients on this host fetch over Flight too (default: on where"
          + " /dev/shm is writable).")
  boolean noShm;

  @Option(names = "--allow-root", paramLabel = "DIR",
      description = "A directory whose datasets may be registered although the sidecar's user does not own them"
          + " (a shared data directory), and where manifests may be read and written; repeatable.")
  List<Path> allowRoots = new ArrayList<>();
  @Option(names = "--cluster-members", defaultValue = "${env:UNSTALL_CLUSTER_MEMBERS:-}",
      paramLabel = "HOST[:PORT],...",
      description = "Join the partitioned cache of these sidecars (TCP seeds; 'auto': SLURM_JOB_NODELIST or"
          + " MASTER_ADDR; 'k8s:SERVICE': the pods behind a Kubernetes Service). Off if unset.")
  String clusterMembers;

  @Option(names = "--cluster-bind", defaultValue = "${env:UNSTALL_CLUSTER_BIND:-}", paramLabel = "ADDRESS",
      description = "This node's address on the cluster's private interface: the member and the peer port listen"
          + " there.")
  String clusterBind;

  @Option(names = "--cluster-port", defaultValue = "5701",
      description = "The cluster member's port (default ${DEFAULT-VALUE}), also the default port of --cluster-members.")
  int clusterPort;

  @Option(names = "--cluster-name", defaultValue = "${env:UNSTALL_CLUSTER_NAME:-unstall}",
      description = "Only sidecars of the same cluster name join each other (default ${DEFAULT-VALUE}).")
  String clusterName;

  @Option(names = "--cluster-token", paramLabel = "FILE",
      description = "A file (mode 0600) holding the cluster token, the same on every node; it authenticates peer"
          + " fetches.")
  Path clusterToken;

  @Option(names = "--peer-port", defaultValue = "8816",
      description = "Port of the peer Flight server on --cluster-bind (default ${DEFAULT-VALUE}; 0 picks a free one).")
  int peerPort;

  @Option(names = "--peer-tls-cert",
      description = "PEM certificate chain of the peer port (signed by the cluster's CA).")
  Path peerTlsCert;

  @Option(names = "--peer-tls-key", description = "PEM private key for --peer-tls-cert.")
  Path peerTlsKey;

  @Option(names = "--prep-worker", defaultValue = "${env:UNSTALL_PREP_WORKER:-false}",
      description = "Prepare batches for the cluster's prep groups (a CPU node for other sidecars' jobs): enlist in"
          + " every group another sidecar announces, leave when it closes. Its dataset is registered here under the"
          + " same name and location, which must be readable from this node. Needs --cluster-members.")
  boolean prepWorker;
  @Option(names = "--peer-tls-ca", description = "PEM CA certificate(s) peers' certificates must chain to.")
  Path peerTlsCa;

  @Override
  public Integer call() throws Exception {
    SidecarSettings s = settings();
    try (Sidecar sidecar = Sidecar.start(s)) {
      sidecar.awaitShutdown();
    }
    return 0;
  }

  /** Validates the options into settings; every problem names the option. */
  SidecarSettings settings() throws Exception {
    long capacity = size("--cache-capacity", cacheCapacity);
    long budget = size("--memory-budget", memoryBudget);
    checkPort("--port", port);
    checkPort("--control-port", controlPort);
    if ((tlsCert == null) != (tlsKey == null)) {
      throw new IllegalArgumentException("--tls-cert and --tls-key go together");
    }
    InetAddress addr;
    try {
      addr = InetAddress.getByName(bind);
    } catch (java.net.UnknownHostException e) {
      throw new IllegalArgumentException("--bind: cannot resolve '" + bind + "'");
    }
    if (!addr.isLoopbackAddress() && tlsCert == null) {
      throw new IllegalArgumentException(
          "--bind " + bind + " exposes the sidecar beyond this machine; that requires TLS (--tls-cert and --tls-key)");
    }
    if (prefetchWindowSamples < 0 || prefetchThreads < 1) {
      throw new IllegalArgumentException("--prefetch-window must be >= 0 and --prefetch-threads >= 1");
    }
    if (maxDecodePixels < 1 || maxDecodePixels > PrepPipeline.DecodeLimits.MAX_PIXELS) {
      throw new IllegalArgumentException("invalid value for option '--max-decode-pixels': " + maxDecodePixels
          + " not in 1.." + PrepPipeline.DecodeLimits.MAX_PIXELS + " (OpenCV's own limit)");
    }
    if (!(maxDecodeAspectRatio >= 1) || Double.isInfinite(maxDecodeAspectRatio)) {
      throw new IllegalArgumentException("invalid value for option '--max-decode-aspect-ratio': " + maxDecodeAspectRatio
          + " (the longer side over the shorter: a number >= 1)");
    }
    long decodeBytes = decodeMemory.equals("auto") ? 0 : size("--decode-memory", decodeMemory);
    if (!decodeMemory.equals("auto") && decodeBytes < 1) {
      throw new IllegalArgumentException("invalid value for option '--decode-memory': it must be above 0 (or auto)");
    }
    long reindexBytes = reindexMemory.equals("auto") ? -1 : size("--reindex-memory", reindexMemory);
    Bounds bounds = new Bounds(flightThreads, flightQueue, localConnections, seconds("--wait-timeout",
        waitTimeoutSeconds), maxPlanIds, statsEpochs, prepGroups, prepThreads(), seconds("--prep-claim-timeout",
        prepClaimTimeoutSeconds));
    Path h = home.toAbsolutePath();
    List<Path> roots = new ArrayList<>();
    for (Path r : allowRoots) {
      roots.add(PathPolicy.realDirectory("--allow-root", r));
    }
    ClusterSettings cluster = cluster();
    if (prepWorker && cluster == null) {
      throw new IllegalArgumentException(
          "--prep-worker needs --cluster-members: a prep worker serves the cluster's groups");
    }
    return new SidecarSettings(
        bind, port, controlPort, capacity, budget,
        stateFile != null ? stateFile : h.resolve("sidecar.json"),
        tokenFile != null ? tokenFile : h.resolve("token"),
        tlsCert, tlsKey, batchTimeoutSeconds, cachePolicy,
        diskCacheDir == null ? null : diskCacheDir.toAbsolutePath(), size("--disk-cache-capacity", diskCacheCapacity),
        prefetchWindowBytes.equals("auto") ? budget / 8 : size("--prefetch-window-bytes", prefetchWindowBytes),
        prefetchWindowSamples, prefetchThreads,
        size("--storage-bandwidth", storageBandwidth), !noShm,
        maxDecodePixels, maxDecodeAspectRatio, decodeBytes, reindexBytes, bounds, h, List.copyOf(roots), cluster,
        prepWorker);
  }

  private int prepThreads() {
    if (prepThreads.equals("auto")) {
      return Bounds.defaultPrepThreads();
    }
    try {
      return Integer.parseInt(prepThreads);
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException(
          "invalid value for option '--prep-threads': '" + prepThreads + "' (a number of threads, or auto)");
    }
  }

  private static Duration seconds(String option, long s) {
    if (s < 1) {
      throw new IllegalArgumentException(
          "invalid value for option '" + option + "': " + s + " (must be at least 1 second)");
    }
    return Duration.ofSeconds(s);
  }

  /** The cluster options, or null when --cluster-members is unset (a sidecar on its own, as before). */
  private ClusterSettings cluster() throws Exception {
    if (clusterMembers == null || clusterMembers.isBlank()) {
      return null;
    }
    checkPort("--cluster-port", clusterPort);
    checkPort("--peer-port", peerPort);
    if (clusterBind == null || clusterBind.isBlank()) {
      throw new IllegalArgumentException(
          "--cluster-members needs --cluster-bind: this node's address on the cluster's private interface");
    }
    InetAddress addr;
    try {
      addr = InetAddress.getByName(clusterBind);
    } catch (java.net.UnknownHostException e) {
      throw new IllegalArgumentException("--cluster-bind: cannot resolve '" + clusterBind + "'");
    }
    if (clusterToken == null) {
      throw new IllegalArgumentException(
          "--cluster-members needs --cluster-token FILE (the same token on every node; it authenticates peer fetches)");
    }
    if (!addr.isLoopbackAddress() && peerTlsCert == null) {
      throw new IllegalArgumentException("--cluster-bind " + clusterBind + " exposes the peer port beyond this machine;"
          + " that requires TLS (--peer-tls-cert, --peer-tls-key and --peer-tls-ca)");
    }
    String kubernetes = ClusterMembers.kubernetesService(clusterMembers);
    return new ClusterSettings(clusterName, addr.getHostAddress(), clusterPort,
        kubernetes != null ? List.of() : ClusterMembers.resolve(clusterMembers, clusterPort, System.getenv()),
        kubernetes, peerPort,
        Secrets.readToken(clusterToken, "cluster token file"), peerTlsCert, peerTlsKey, peerTlsCa,
        ClusterSettings.PEER_TIMEOUT, ClusterSettings.FAILURE_TIMEOUT);
  }

  private static long size(String option, String value) {
    try {
      return Sizes.parse(value);
    } catch (IllegalArgumentException e) {
      throw new IllegalArgumentException("invalid value for option '" + option + "': " + e.getMessage());
    }
  }

  private static void checkPort(String option, int p) {
    if (p < 0 || p > 65535) {
      throw new IllegalArgumentException("invalid value for option '" + option + "': port " + p + " not in 0..65535");
    }
  }
}
