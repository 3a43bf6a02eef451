package io.unstall.sidecar;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.DataPlane;
import io.unstall.flight.auth.TenantTokens;
import io.unstall.flight.fs.FileOwners;
import io.unstall.flight.fs.LockFile;
import io.unstall.flight.shm.SharedMemory;
import java.io.IOException;
import java.net.BindException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import py4j.GatewayServer;

/**
 * A running sidecar: owns the process's one root allocator (limited to the memory budget), the data plane,
 * the Py4J control plane and the state file. Closing it (SIGTERM, or {@code shutdown()} from the control
 * plane) stops serving, logs the final stats, frees all memory and removes the state file.
 */
public final class Sidecar implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(Sidecar.class);

  private final SidecarSettings settings;
  private final BufferAllocator root;
  private final DataPlane dataPlane;
  private final GatewayServer gateway;
  private final CountDownLatch stopped = new CountDownLatch(1);
  private final AtomicBoolean closed = new AtomicBoolean();
  private final Thread hook;
  private final LockFile homeLock;
  private final PrepVolunteer volunteer; // --prep-worker; null otherwise

  private Sidecar(SidecarSettings s, LockFile homeLock, BufferAllocator root, DataPlane dataPlane,
      GatewayServer gateway, PrepVolunteer volunteer) {
    this.settings = s;
    this.volunteer = volunteer;
    this.homeLock = homeLock;
    this.root = root;
    this.dataPlane = dataPlane;
    this.gateway = gateway;
    this.hook = new Thread(this::closeQuietly, "unstall-sigterm");
  }

  /** Starts everything or nothing: on failure whatever was started is closed again. */
  public static Sidecar start(SidecarSettings s) throws Exception {
    // A MinIO cache in shared memory is mapped files, not direct memory: only the rest of the budget needs it.
    boolean shmCache = s.sharedMemory() && "minio".equals(s.cachePolicy()) && SharedMemory.available();
    checkDirectMemory(s.memoryBudget() - (shmCache ? s.cacheCapacity() : 0), shmCache);
    LockFile homeLock = lockHome(s);
    BufferAllocator root = null;
    DataPlane dp = null;
    GatewayServer gw = null;
    PrepVolunteer volunteer = null;
    try {
      String token = Secrets.readOrCreateToken(s.tokenFile());
      Path home = Secrets.privateDirectory(s.home());
      TenantTokens tenants = TenantTokens.open(home.resolve(TenantTokens.FILE_NAME));
      PathPolicy paths = new PathPolicy(home, s.allowRoots(), FileOwners.processUid());
      root = new RootAllocator(s.memoryBudget());
      DataPlane.Builder b =
          DataPlane.builder(root, token).host(s.bind()).port(s.port()).cacheCapacity(s.cacheCapacity())
              .budgetTimeoutSeconds(s.batchTimeoutSeconds())
              .cachePolicy(s.cachePolicy())
              .prefetch(s.prefetchWindowBytes(), s.prefetchWindowSamples(), s.prefetchThreads())
              .storageBandwidth(s.storageBandwidth())
              .sharedMemory(s.sharedMemory())
              .decode(s.maxDecodePixels(), s.maxDecodeAspectRatio(), s.decodeMemory())
              .reindexMemory(s.reindexMemory())
              .bounds(s.bounds())
              .tenants(tenants);
      if (s.diskCacheDir() != null) {
        b.diskTier(s.diskCacheDir(), s.diskCacheCapacity());
      }
      if (s.tlsCert() != null) {
        b.tls(s.tlsCert().toFile(), s.tlsKey().toFile());
      }
      if (s.cluster() != null) {
        b.cluster(s.cluster());
      }
      dp = b.build().start();
      Sidecar[] self = new Sidecar[1];
      ControlPlane control = new ControlPlane(dp, paths, () -> self[0].closeQuietly());
      gw = ControlGateway.build(control, token, s.controlPort());
      try {
        gw.start();
      } catch (py4j.Py4JNetworkException e) {
        throw new BindException(
            "control port " + s.controlPort() + " on 127.0.0.1 is already in use; pick --control-port");
      }
      if (s.prepWorker()) {
        volunteer = new PrepVolunteer(control, dp.prepDirectory());
      }
      Sidecar sidecar = new Sidecar(s, homeLock, root, dp, gw, volunteer);
      self[0] = sidecar;
      sidecar.writeStateFile();
      Runtime.getRuntime().addShutdownHook(sidecar.hook);
      LOG.info(
          "unstall sidecar listening: flight={} local={} control=127.0.0.1:{} cache={} capacity={} memory-budget={}"
              + " state={} tenants={} allow-roots={}",
          dp.location().getUri(), dp.localEndpoint() == null ? "off" : dp.localEndpoint(), gw.getListeningPort(),
          s.cachePolicy(), Sizes.format(s.cacheCapacity()),
          Sizes.format(s.memoryBudget()), s.stateFile(), tenants.list().size(), paths.allowRoots());
      if (s.cluster() != null) {
        LOG.info("partitioned cache: cluster '{}' member {}:{}, peer port {}:{} ({}), seeds {}", s.cluster().name(),
            s.cluster().bind(), s.cluster().port(), s.cluster().bind(), dp.peerPort(),
            s.cluster().tls() ? "TLS" : "plaintext, loopback", s.cluster().members());
      }
      return sidecar;
    } catch (Exception e) {
      if (volunteer != null) {
        volunteer.close();
      }
      if (gw != null) {
        gw.shutdown();
      }
      if (dp != null) {
        dp.close();
      }
      if (root != null) {
        root.close();
      }
      homeLock.close();
      throw e;
    }
  }

  /**
   * One serve per home (the state file's directory) at a time: a second one would overwrite the first's state
   * file, and clients would find only one of them. The lock is {@code <state file>.lock}; the kernel releases
   * it if this process dies.
   */
  private static LockFile lockHome(SidecarSettings s) throws IOException {
    Path state = s.stateFile().toAbsolutePath();
    Secrets.privateDirectory(state.getParent());
    return LockFile.acquire(state.resolveSibling(state.getFileName() + ".lock"), "sidecar home " + state.getParent(),
        "stop that sidecar (or attach to it), or give this one another --home (UNSTALL_HOME)");
  }

  /** The netty allocator Arrow uses is bounded by the JVM's direct-memory limit: what it may allocate must fit. */
  private static void checkDirectMemory(long direct, boolean shmCache) {
    long max = io.netty.util.internal.PlatformDependent.maxDirectMemory();
    if (direct > max) {
      throw new IllegalArgumentException(
          "--memory-budget" + (shmCache ? " less --cache-capacity (the cache is in shared memory)" : "") + ", "
              + Sizes.format(direct) + ", exceeds the JVM's direct-memory limit " + Sizes.format(max)
              + "; start java with -XX:MaxDirectMemorySize=" + (direct / (1 << 20) + 256) + "m");
    }
  }

  private void writeStateFile() throws IOException {
    ObjectNode o = new ObjectMapper().createObjectNode();
    o.put("v", 1);
    o.put("pid", ProcessHandle.current().pid());
    o.put("flight", dataPlane.location().getUri().toString());
    o.put("control_port", gateway.getListeningPort());
    o.put("token_file", settings.tokenFile().toAbsolutePath().toString());
    if (dataPlane.localEndpoint() != null) {
      o.put("local", dataPlane.localEndpoint().toString());
    }
    Secrets.writePrivate(settings.stateFile(), o.toString() + "\n");
  }

  public DataPlane dataPlane() {
    return dataPlane;
  }

  public int controlPort() {
    return gateway.getListeningPort();
  }

  public void awaitShutdown() throws InterruptedException {
    stopped.await();
  }

  private void closeQuietly() {
    try {
      close();
    } catch (Exception e) {
      LOG.warn("error while stopping: {}", e.toString());
    }
  }

  @Override
  public void close() throws Exception {
    if (!closed.compareAndSet(false, true)) {
      stopped.await();
      return;
    }
    LOG.info("unstall sidecar stopping");
    try {
      Files.deleteIfExists(settings.stateFile());
      if (volunteer != null) {
        volunteer.close();
      }
      gateway.shutdown();
      dataPlane.close();
      root.close();
    } finally {
      homeLock.close();
      stopped.countDown();
      if (Thread.currentThread() != hook) {
        try {
          Runtime.getRuntime().removeShutdownHook(hook);
        } catch (IllegalStateException shuttingDown) {
          // already in shutdown: nothing to remove
        }
      }
      LOG.info("unstall sidecar stopped");
    }
  }
}
