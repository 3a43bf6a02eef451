package io.unstall.flight.format;

import io.unstall.flight.protocol.DataError;
import java.io.IOException;

/**
 * Stored bytes that fail the format's checks: bad data, not a bug. The message names the file and byte offset;
 * {@link #dataError()} carries them as fields for the client (protocol/README.md, "Errors").
 */
public final class CorruptRecordException extends IOException {
  private final DataError error;

  /** {@code offset}: where in {@code file} (as storage describes it) the bad bytes lie, -1 when unknown. */
  public CorruptRecordException(String file, long offset, String message) {
    super(message); // no cause yet: formats may initCause the library error
    this.error = new DataError(null, -1, null, file, offset, message);
  }

  private CorruptRecordException(String message, DataError error, Throwable cause) {
    super(message, cause);
    this.error = error;
  }

  /** The same failure, named with the dataset and the sample it was read for. */
  public CorruptRecordException inSample(String dataset, long sample, String key) {
    return new CorruptRecordException("dataset '" + dataset + "' sample " + sample + " ('" + key + "'): "
        + getMessage(), error.inSample(dataset, sample, key), this);
  }

  /** The same failure, named with the dataset whose indexing it stopped. */
  public CorruptRecordException inDataset(String dataset) {
    return new CorruptRecordException(getMessage(), error.inDataset(dataset), this);
  }

  public DataError dataError() {
    return error;
  }
}
