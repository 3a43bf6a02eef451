package io.unstall.flight;

import java.io.IOException;

/** A sample whose file disappeared after registration. */
public final class SampleNotFoundException extends IOException {
  SampleNotFoundException(String message, Throwable cause) {
    super(message, cause);
  }
}
