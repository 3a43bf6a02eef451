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
  private final String which; // names the token in errors, never its value

  public BearerTokenAuthenticator(String token) {
    this(token, "the sidecar's token file");
  }

  /** {@code which} says where the expected token comes from (for the error a caller without it gets). */
  public BearerTokenAuthenticator(String token, String which) {
    if (token == null || token.length() < 16) {
      throw new IllegalArgumentException("the bearer token (" + which + ") must be at least 16 characters");
    }
    this.token = token.getBytes(StandardCharsets.UTF_8);
    this.which = which;
  }

  @Override
  public AuthResult authenticate(CallHeaders headers) {
    String h = headers.get("authorization");
    if (h == null || !h.startsWith(PREFIX)) {
      throw CallStatus.UNAUTHENTICATED
          .withDescription("missing 'authorization: Bearer <token>' header (the token is in " + which + ")")
          .toRuntimeException();
    }
    byte[] given = h.substring(PREFIX.length()).getBytes(StandardCharsets.UTF_8);
    if (!MessageDigest.isEqual(given, token)) {
      throw CallStatus.UNAUTHENTICATED.withDescription("wrong bearer token").toRuntimeException();
    }
    return () -> "unstall-client";
  }
}
