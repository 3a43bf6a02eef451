package io.unstall.flight.auth;

/** A valid token that may not do this: Flight's UNAUTHORIZED (gRPC PERMISSION_DENIED). */
public final class PermissionDeniedException extends RuntimeException {
  public PermissionDeniedException(String message) {
    super(message);
  }
}
