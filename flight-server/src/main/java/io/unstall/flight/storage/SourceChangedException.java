package io.unstall.flight.storage;

import java.io.IOException;

/**
 * A file or object differs from the version pinned when the dataset was indexed ({@link Storage#pin}): it was
 * rewritten or replaced after registration. Reads of it fail with this rather than serve (or cache) a splice
 * of two versions. The message names it and says what to do.
 */
public final class SourceChangedException extends IOException {
  public SourceChangedException(String location, String how) {
    super(location + " changed after registration (" + how + "); re-register the dataset to read the new content"
        + " (under a new name, or after restarting the sidecar)");
  }
}
