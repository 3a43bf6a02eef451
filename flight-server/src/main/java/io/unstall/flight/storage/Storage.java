package io.unstall.flight.storage;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.List;

/**
 * Where a dataset's bytes live. Paths are relative to the storage root and use '/' separators.
 * Implementations are thread-safe. Errors name the file (and offset where it matters).
 */
public interface Storage extends AutoCloseable {

  /** A human-readable location of the root, for messages and descriptions (e.g. {@code file:///data/imgs}). */
  String uri();

  /** Whether the root is a single object (a file) rather than a directory. */
  boolean isSingleObject();

  /** Immediate children of {@code dir} ("" is the root) that are directories, sorted by name. */
  List<String> listDirectories(String dir) throws IOException;

  /** Every regular object below {@code dir}, recursively, as sorted relative paths. */
  List<String> listObjects(String dir) throws IOException;

  /** The size in bytes of an object. */
  long size(String path) throws IOException;

  /**
   * Pins the object as it is now and returns its size. Formats call this (not {@link #size}) once per file
   * while indexing; every later read of a pinned object checks, cheaply, that it is still that version and
   * fails with {@link SourceChangedException} naming it otherwise, so a rewritten or replaced object is never
   * served or cached as a splice of two versions. Without pinning support this is {@link #size}.
   */
  default long pin(String path) throws IOException {
    return size(path);
  }

  /** Reads exactly {@code dst.remaining()} bytes at {@code offset}; a short object is an error naming it. */
  void readFully(String path, long offset, ByteBuffer dst) throws IOException;

  /**
   * A version of the object that changes when its content does (locally the mtime, edge CRCs, inode and ctime;
   * the ETag on S3), or "" if unknown: the pinned one for a pinned object. Used to decide whether a persisted
   * digest manifest still describes the dataset, so it must change even where a user restored size and mtime.
   */
  default String version(String path) throws IOException {
    return "";
  }

  /** The absolute location of {@code path}, for messages. */
  String describe(String path);

  @Override
  default void close() throws IOException {}
}
