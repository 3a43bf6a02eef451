package io.unstall.agent.bootstrap;

/** Per stream or channel object: which file it reads and where its position is. */
public final class StreamState {
  /** Shared state for streams we do not profile (no path, excluded path, agent's own files). */
  static final StreamState EXCLUDED = new StreamState(null, 0);

  final FileStats file;
  /** The position the next non-positional read starts at, tracked from reads, seeks and skips. */
  long position;

  StreamState(FileStats file, long position) {
    this.file = file;
    this.position = position;
  }
}
