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
  private final TenantTokens tenants; // null: the owner's token only (the cluster's peer port)
  private final String which; // names the token in errors, never its value

  /** The data plane's: the owner's token and the tenant tokens the owner issued. */
  public BearerTokenAuthenticator(String token, TenantTokens tenants) {
    this(token, tenants, "the sidecar's token file");
  }

  /** One token only; {@code which} says where it comes from (for the error a caller without it gets). */
  public BearerTokenAuthenticator(String token, String which) {
    this(token, null, which);
  }

  private BearerTokenAuthenticator(String token, TenantTokens tenants, String which) {
    if (token == null || token.length() < 16) {
      throw new IllegalArgumentException("the bearer token (" + which + ") must be at least 16 characters");
    }
    this.token = token.getBytes(StandardCharsets.UTF_8);
    this.tenants = tenants;
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
    if (MessageDigest.isEqual(given, token)) {
      return OWNER;
    }
    Principal tenant = tenants == null ? null : tenants.authenticate(given);
    if (tenant == null && tenants == null) {
      throw CallStatus.UNAUTHENTICATED.withDescription("wrong bearer token (expected the one in " + which + ")")
          .toRuntimeException();
    }
    if (tenant == null) {
      throw CallStatus.UNAUTHENTICATED
          .withDescription(
              "wrong bearer token: neither the sidecar's token nor a tenant token it issued and has not revoked")
          .toRuntimeException();
    }
    String identity = tenant.identity();
    return () -> identity;
  }
}
