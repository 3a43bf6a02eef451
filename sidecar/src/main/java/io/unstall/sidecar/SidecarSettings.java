package io.unstall.sidecar;

import io.unstall.flight.Bounds;
import io.unstall.flight.cluster.ClusterSettings;
import java.nio.file.Path;
import java.util.List;

/** Validated settings of a sidecar. {@code decodeMemory} 0: the default (a quarter of the streams budget). */
public record SidecarSettings(
    String bind,
    int port,
    int controlPort,
    long cacheCapacity,
    long memoryBudget,
    Path stateFile,
    Path tokenFile,
    Path tlsCert,
    Path tlsKey,
    long batchTimeoutSeconds,
    String cachePolicy,
    Path diskCacheDir,
    long diskCacheCapacity,
    long prefetchWindowBytes,
    int prefetchWindowSamples,
    int prefetchThreads,
    long storageBandwidth,
    boolean sharedMemory,
    long maxDecodePixels,
    double maxDecodeAspectRatio,
    long decodeMemory,
    long reindexMemory, // --reindex-memory; -1: the default (a quarter of the streams budget)
    Bounds bounds,
    Path home,
    List<Path> allowRoots,
    ClusterSettings cluster, // null: a sidecar on its own
    boolean prepWorker) {} // --prep-worker: enlist in the cluster's prep groups
