package io.unstall.flight;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import org.apache.arrow.flight.CallHeaders;
import org.apache.arrow.flight.CallStatus;
import org.apache.arrow.flight.auth2.CallHeaderAuthenticator;

/** Accepts calls whose {@code authorization} header is {@code Bearer <the sidecar's token>}. */
public final class BearerTokenAuthenticator implements CallHeaderAuthenticator {
  private static final String PREFIX = "Bearer ";
  private final byte[] token;

  public BearerTokenAuthenticator(String token) {
    if (token == null || token.length() < 16) {
      throw new IllegalArgumentException("the sidecar token must be at least 16 characters");
    }
    this.token = token.getBytes(StandardCharsets.UTF_8);
  }

  @Override
  public AuthResult authenticate(CallHeaders headers) {
    String h = headers.get("authorization");
    if (h == null || !h.startsWith(PREFIX)) {
      throw CallStatus.UNAUTHENTICATED
          .withDescription("missing 'authorization: Bearer <token>' header (the token is in the sidecar's token file)")
          .toRuntimeException();
    }
    byte[] given = h.substring(PREFIX.length()).getBytes(StandardCharsets.UTF_8);
    if (!MessageDigest.isEqual(given, token)) {
      throw CallStatus.UNAUTHENTICATED.withDescription("wrong bearer token").toRuntimeException();
    }
    return () -> "unstall-client";
  }
}
