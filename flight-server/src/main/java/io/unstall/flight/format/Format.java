package io.unstall.flight.format;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.storage.Storage;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.List;
import java.util.function.LongConsumer;

/**
 * How samples are laid out in storage. A format indexes a storage location into stable sample ids once, at
 * registration, and later reads one sample's bytes. New formats implement this and register in {@link
 * Formats}. A format that takes options, or keeps per-dataset state (footers, chunk tables, decoded units),
 * returns a fresh instance from {@link #open}: one per dataset, closed with it.
 */
public interface Format extends AutoCloseable {

  /** The name users pass at registration, e.g. {@code imagefolder}. */
  String name();

  /**
   * This format for one dataset, configured by the registration's {@code options} (a JSON object; errors name
   * the option). {@code memory} is the allocator its decoded units (a Parquet row group, an HDF5 chunk) may
   * hold; the format closes what it allocates there in {@link #close}. By default a format takes no options.
   */
  default Format open(String dataset, JsonNode options, org.apache.arrow.memory.BufferAllocator memory) {
    if (options != null && options.size() > 0) {
      throw new IllegalArgumentException(
          "dataset '" + dataset + "': format '" + name() + "' takes no options, got "
              + String.join(", ", (Iterable<String>) options::fieldNames));
    }
    return this;
  }

  /**
   * What a client needs to decode this dataset's payloads (an Arrow schema, a dtype and shape), added to the
   * dataset's description as {@code format_info}; null when the payload is the stored bytes.
   */
  default ObjectNode info() {
    return null;
  }

  /**
   * Whether a sample's index offset and length are a byte range of its file that may be read together with its
   * neighbours' ({@link #extract}); false where a sample is decoded from a larger unit by {@link #read}.
   */
  default boolean coalesces() {
    return true;
  }

  /**
   * Whether the registry should save this format's index next to the dataset's manifest and load it when the
   * same, unchanged dataset is registered again (with a disk tier): for formats whose indexing reads the data.
   */
  default boolean persistsIndex() {
    return false;
  }

  /**
   * Takes a saved {@code index} of an unchanged dataset instead of {@link #index}: rebuilds what this instance
   * keeps besides it (footers, schemas) from metadata only.
   */
  default void restore(Storage storage, SampleIndex index) throws IOException {
    throw new UnsupportedOperationException(name() + " does not restore saved indexes");
  }

  /** Frees what {@link #open} made for one dataset. */
  @Override
  default void close() {}

  /**
   * Indexes the dataset. {@code progress} receives the number of files indexed so far, for progress
   * reporting on large datasets.
   */
  SampleIndex index(Storage storage, LongConsumer progress) throws IOException;

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
