package io.unstall.flight.cluster;

/** Which sidecar of the cluster owns a sample: the one whose memory cache admits it and serves it to the others. */
public interface Ownership {
  /** A sidecar on its own owns everything. */
  Ownership SOLO = (dataset, id) -> Peer.SELF;

  /** The owner of sample {@code id} of {@code dataset}: {@link Peer#SELF}, a remote peer, or {@link Peer#UNDECIDED}. */
  Peer ownerOf(String dataset, int id);
}
