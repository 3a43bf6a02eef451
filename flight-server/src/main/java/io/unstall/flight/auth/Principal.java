package io.unstall.flight.auth;

import java.util.Set;

/**
 * Who makes a call: the sidecar's owner (the token in {@code $UNSTALL_HOME/token}: everything) or a tenant (a
 * token the owner issued: the data plane, for the datasets granted to it). A revoked tenant keeps its id, for
 * messages, and may read nothing.
 */
public record Principal(String id, String name, boolean owner, Set<String> datasets, boolean revoked) {
  /** The Flight peer identity of the owner; a tenant's is {@code tenant:<id>}. */
  public static final String OWNER_ID = "owner";
  static final String TENANT_PREFIX = "tenant:";

  public static final Principal OWNER = new Principal(OWNER_ID, "", true, Set.of(), false);

  static Principal tenant(TenantTokens.Tenant t) {
    return new Principal(t.id(), t.name(), false, Set.copyOf(t.datasets()), false);
  }

  static Principal revoked(String id) {
    return new Principal(id, "", false, Set.of(), true);
  }

  /** The peer identity Flight's authenticator hands to the producer. */
  public String identity() {
    return owner ? OWNER_ID : TENANT_PREFIX + id;
  }

  public boolean mayRead(String dataset) {
    return owner || (!revoked && datasets.contains(dataset));
  }

  /** Refuses a dataset this principal was not granted, naming that dataset only (never the others). */
  public void checkRead(String dataset) {
    if (!mayRead(dataset)) {
      throw new PermissionDeniedException(this + " is not granted dataset '" + dataset + "'");
    }
  }

  /** Names the principal in messages: never the token itself. */
  @Override
  public String toString() {
    if (owner) {
      return "the owner's token";
    }
    return "tenant token " + id + (name.isEmpty() ? "" : " (" + name + ")") + (revoked ? ", revoked," : "");
  }
}
