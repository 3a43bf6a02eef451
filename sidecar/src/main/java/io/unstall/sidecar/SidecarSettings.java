package io.unstall.sidecar;

import io.unstall.flight.cluster.ClusterSettings;
import java.nio.file.Path;

/** Validated settings of a sidecar. */
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
    ClusterSettings cluster) {} // null: a sidecar on its own
