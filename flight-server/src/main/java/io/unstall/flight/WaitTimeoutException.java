package io.unstall.flight;

/**
 * A call waited inside the sidecar longer than its bound (for storage bandwidth, a prep batch or claim, staging
 * room, its client): TIMED_OUT, with a message naming what it waited for and the option that sets the bound.
 */
public final class WaitTimeoutException extends RuntimeException {
  public WaitTimeoutException(String message) {
    super(message);
  }
}
