package io.unstall.flight.cluster;

import java.nio.file.Path;
import java.time.Duration;
import java.util.List;

/**
 * How a sidecar joins its cluster (the partitioned cache). {@code bind} is the address on the cluster's private
 * interface: the Hazelcast member listens there on {@code port}, and the peer Flight server on {@code peerPort}
 * (0: a free one). {@code members} are {@code host[:port]} seeds of the TCP join (multicast is never used).
 * {@code token} authenticates every peer fetch; with {@code tlsCert}/{@code tlsKey} the peer port serves TLS and
 * peers are trusted by {@code tlsCa} (the cluster's CA). {@code peerTimeout} bounds one peer fetch.
 */
public record ClusterSettings(
    String name, String bind, int port, List<String> members, String kubernetesService, int peerPort, String token,
    Path tlsCert, Path tlsKey, Path tlsCa, Duration peerTimeout, Duration failureTimeout) {
  public static final String DEFAULT_NAME = "unstall";
  public static final int DEFAULT_PORT = 5701;
  public static final Duration PEER_TIMEOUT = Duration.ofSeconds(10);
  /** A member silent this long is declared dead and its partitions reassigned. */
  public static final Duration FAILURE_TIMEOUT = Duration.ofSeconds(10);

  public ClusterSettings {
    members = List.copyOf(members);
    if (kubernetesService != null && (kubernetesService.isBlank() || !members.isEmpty())) {
      throw new IllegalArgumentException("--cluster-members k8s:SERVICE names one Kubernetes Service and no address");
    }
    if (members.isEmpty() && kubernetesService == null) {
      throw new IllegalArgumentException("a cluster needs at least one member address (--cluster-members)");
    }
    if (token == null || token.length() < 16) {
      throw new IllegalArgumentException("the cluster token (--cluster-token) must be at least 16 characters");
    }
    if ((tlsCert == null) != (tlsKey == null) || (tlsCert != null && tlsCa == null)) {
      throw new IllegalArgumentException("--peer-tls-cert, --peer-tls-key and --peer-tls-ca go together");
    }
  }

  /** A TCP join from {@code members}, without Kubernetes. */
  public ClusterSettings(
      String name, String bind, int port, List<String> members, int peerPort, String token, Path tlsCert,
      Path tlsKey, Path tlsCa, Duration peerTimeout, Duration failureTimeout) {
    this(name, bind, port, members, null, peerPort, token, tlsCert, tlsKey, tlsCa, peerTimeout, failureTimeout);
  }

  public boolean tls() {
    return tlsCert != null;
  }
}
