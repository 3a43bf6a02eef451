package io.unstall.flight.protocol;

/**
 * A DoGet ticket of kind PEER: one sidecar asks the sidecar that owns samples (the partitioned cache,
 * {@code io.unstall.flight.cluster}) for them by id. The id-list layout of {@link Wire}; it is accepted only on
 * the peer port, authenticated with the cluster token, and answered with a batch of {@link BatchSchema}.
 * Pinned by {@code protocol/fixtures/peer-ticket-v1.*}.
 */
public final class PeerTicket extends IdListTicket {
  public PeerTicket(String dataset, long epoch, long[] ids) {
    super(Wire.KIND_PEER, "a peer ticket", dataset, epoch, ids);
  }

  /** Parses a PEER ticket; every defect is a {@link MalformedTicketException} saying what is wrong. */
  public static PeerTicket parse(byte[] bytes) {
    Wire.IdList m = Wire.parseIds(bytes, Wire.KIND_PEER, MAX_IDS);
    return new PeerTicket(m.dataset(), m.epoch(), m.ids());
  }
}
