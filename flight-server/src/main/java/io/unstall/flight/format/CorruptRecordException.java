package io.unstall.flight.format;

import java.io.IOException;

/** Stored bytes that fail the format's checks. The message names the file and byte offset. */
public final class CorruptRecordException extends IOException {
  public CorruptRecordException(String message) {
    super(message);
  }
}
