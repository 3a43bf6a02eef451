package io.unstall.flight.cluster;

import org.apache.arrow.flight.Location;

/**
 * A sidecar of the cluster as an owner of samples: its member id and the address of its peer port (where it
 * answers PEER tickets). {@link #SELF} and {@link #UNDECIDED} are the two answers that are not another sidecar.
 */
public record Peer(String member, String host, int port) {
  /** This sidecar owns the sample. */
  public static final Peer SELF = new Peer("self", "", 0);
  /** No owner yet (partitions being assigned): read from storage, admit nowhere. */
  public static final Peer UNDECIDED = new Peer("undecided", "", 0);

  /** Another sidecar (not {@link #SELF}, not {@link #UNDECIDED}). */
  public boolean remote() {
    return this != SELF && this != UNDECIDED;
  }

  public String address() {
    return host + ":" + port;
  }

  public Location location(boolean tls) {
    return tls ? Location.forGrpcTls(host, port) : Location.forGrpcInsecure(host, port);
  }

  /** Parses the {@code host:port} a member publishes (IPv6 hosts in brackets). */
  static Peer parse(String member, String address) {
    int colon = address.lastIndexOf(':');
    if (colon <= 0 || colon == address.length() - 1) {
      throw new IllegalArgumentException("member " + member + " publishes a bad peer address '" + address + "'");
    }
    String host = address.substring(0, colon);
    if (host.startsWith("[") && host.endsWith("]")) {
      host = host.substring(1, host.length() - 1);
    }
    return new Peer(member, host, Integer.parseInt(address.substring(colon + 1)));
  }
}
