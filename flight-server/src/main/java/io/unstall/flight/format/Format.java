package io.unstall.flight.format;

import io.unstall.flight.storage.Storage;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.List;
import java.util.function.LongConsumer;

/**
 * How samples are laid out in storage. A format indexes a storage location into stable sample ids once, at
 * registration, and later reads one sample's bytes. A format is made per dataset from its registration options
 * ({@link FormatOptions}) and registers in {@link Formats}; what a client needs to decode its samples goes in the
 * index's {@linkplain SampleIndex#layout() layout}.
 */
public interface Format extends AutoCloseable {

  /** The name users pass at registration, e.g. {@code imagefolder}. */
  String name();

  /**
   * Indexes the dataset. {@code progress} receives the number of files indexed so far, for progress
   * reporting on large datasets.
   */
  SampleIndex index(Storage storage, LongConsumer progress) throws IOException;

  /**
   * Whether the index is worth keeping next to the dataset's persisted manifest (indexing reads inside the files:
   * headers, rows, members), so that a later registration of unchanged files loads it instead.
   */
  default boolean persistsIndex() {
    return false;
  }

  /**
   * Gives a format that decodes units larger than a sample (a Parquet row group, an HDF5 chunk) the allocator its
   * decoded units may hold, for dataset {@code dataset}; it frees them in {@link #close}. Called once, before
   * {@link #index}. Other formats ignore it.
   */
  default void decodeIn(String dataset, org.apache.arrow.memory.BufferAllocator memory) {}

  /**
   * Whether a sample's index offset and length are a byte range of its file that may be read together with its
   * neighbours' ({@link #extract}); false where a sample is decoded from a larger unit by {@link #read}.
   */
  default boolean coalesces() {
    return true;
  }

  /** Frees what the format holds for its dataset (decoded units). */
  @Override
  default void close() {}

  /** Class names by label, for formats with labels; empty otherwise. */
  default List<String> classes(Storage storage) throws IOException {
    return List.of();
  }

  /** A stable human-readable key of a sample: where it lives. */
  default String key(SampleIndex index, int id) {
    return index.file(id);
  }

  /**
   * Reads sample {@code id} into {@code dst} ({@code index.length(id)} bytes remaining), verifying it where
   * the format carries checksums. Errors name the file and byte offset.
   */
  default void read(Storage storage, SampleIndex index, int id, ByteBuffer dst) throws IOException {
    storage.readFully(index.file(id), index.offset(id), dst);
  }

  /**
   * Bytes past a sample's data that a read must also fetch to verify it (a trailing checksum); 0 by default.
   * Readers coalesce neighbouring samples of one file into one ranged request over data and framing alike.
   */
  default int trailer() {
    return 0;
  }

  /**
   * Takes sample {@code id} out of {@code run}, which holds the bytes of its file from offset {@code runStart}
   * (at least up to its data's end plus {@link #trailer()}), into {@code dst}, verifying it like {@link #read}.
   */
  default void extract(Storage storage, SampleIndex index, int id, ByteBuffer run, long runStart, ByteBuffer dst)
      throws IOException {
    int from = (int) (index.offset(id) - runStart);
    dst.put(run.duplicate().position(from).limit(from + index.length(id)));
  }
}
