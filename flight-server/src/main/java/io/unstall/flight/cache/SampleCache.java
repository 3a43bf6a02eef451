package io.unstall.flight.cache;

import org.apache.arrow.memory.ArrowBuf;

/**
 * A cache of sample bytes held off-heap. Implementations account every byte to their own allocator and never
 * hold more than their capacity. Thread-safe.
 */
public interface SampleCache extends AutoCloseable {

  /** The policy name reported in stats, e.g. {@code minio}. */
  String policy();

  long capacityBytes();

  /** Bytes of cached samples. */
  long usedBytes();

  long entries();

  /** Copies the cached bytes of {@code key} into {@code dst} at {@code dstIndex}; false on a miss. */
  boolean copyTo(CacheKey key, ArrowBuf dst, long dstIndex);

  /** Offers {@code length} bytes at {@code src[srcIndex]} for {@code key}; returns whether they were admitted. */
  boolean admit(CacheKey key, ArrowBuf src, long srcIndex, int length);

  @Override
  void close();
}
