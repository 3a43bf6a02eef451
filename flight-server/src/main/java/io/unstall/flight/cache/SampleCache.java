package io.unstall.flight.cache;

import io.unstall.flight.shm.ShmRef;
import org.apache.arrow.memory.ArrowBuf;

/**
 * An in-memory cache of sample bytes keyed by content digest, held off-heap. Implementations account every
 * byte to their own allocator and never hold more than their capacity. Thread-safe.
 */
public interface SampleCache extends AutoCloseable {

  /** The policy name reported in stats and chosen by {@code --cache-policy}. */
  String policy();

  long capacityBytes();

  /** Bytes of cached samples. */
  long usedBytes();

  long entries();

  /** Bytes of entries used by more than one dataset (content shared across jobs). */
  long sharedBytes();

  /** Whether {@code key} is cached (a hint: it may be evicted right after, by policies that evict). */
  boolean contains(Digest key);

  /**
   * Copies the cached bytes of {@code key} into {@code dst} at {@code dstIndex} for {@code dataset}; false on
   * a miss.
   */
  boolean copyTo(Digest key, ArrowBuf dst, long dstIndex, String dataset);

  /**
   * Where the cached bytes of {@code key} lie in shared memory, for a client on this host that reads them in
   * place; null on a miss, or when this cache cannot promise the bytes stay put (it is not in shared memory,
   * or it evicts). Counts as a use by {@code dataset}, like {@link #copyTo}.
   */
  default ShmRef locate(Digest key, String dataset) {
    return null;
  }

  /** Offers {@code length} bytes at {@code src[srcIndex]} with digest {@code key}, read for {@code dataset}. */
  Admission admit(Digest key, ArrowBuf src, long srcIndex, int length, String dataset);

  /** What {@link #admit} did. */
  enum Admission {
    ADMITTED,
    /** Already cached (maybe by another dataset: then it is now shared). */
    PRESENT,
    /** No room, and the policy does not evict. */
    REFUSED
  }

  @Override
  void close();
}
