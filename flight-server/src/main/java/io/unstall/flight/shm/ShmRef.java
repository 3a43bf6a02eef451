package io.unstall.flight.shm;

/** Where a sample's bytes are in shared memory: a file of the sidecar's directory, an offset, a length. */
public record ShmRef(String file, long offset, int length) {}
