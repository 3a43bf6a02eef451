package io.unstall.flight.auth;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import org.apache.arrow.flight.CallHeaders;
import org.apache.arrow.flight.CallStatus;
import org.apache.arrow.flight.auth2.CallHeaderAuthenticator;

/**
 * Authenticates every Flight call by its {@code authorization: Bearer <token>} header: the sidecar's own token
 * makes the owner, a token the owner issued (and has not revoked) makes that tenant. The peer identity handed
 * to the producer ({@link Principal#identity()}) says which; {@link TenantTokens#principal} turns it back.
 */
public final class BearerTokenAuthenticator implements CallHeaderAuthenticator {
  private static final String PREFIX = "Bearer ";
  private static final AuthResult OWNER = () -> Principal.OWNER_ID;
  private final byte[] token;
  private final TenantTokens tenants;

  public BearerTokenAuthenticator(String token, TenantTokens tenants) {
    if (token == null || token.length() < 16) {
      throw new IllegalArgumentException("the sidecar token must be at least 16 characters");
    }
    this.token = token.getBytes(StandardCharsets.UTF_8);
    this.tenants = tenants;
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
    if (MessageDigest.isEqual(given, token)) {
      return OWNER;
    }
    Principal tenant = tenants.authenticate(given);
    if (tenant == null) {
      throw CallStatus.UNAUTHENTICATED
          .withDescription("wrong bearer token: neither the sidecar's token nor a tenant token it issued and has not revoked")
          .toRuntimeException();
    }
    String identity = tenant.identity();
    return () -> identity;
  }
}
