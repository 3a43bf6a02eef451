package io.unstall.sidecar;

import java.nio.file.Path;
import java.util.List;

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
    Path home,
    List<Path> allowRoots) {}
