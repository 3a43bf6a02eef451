package io.unstall.flight.protocol;

import org.apache.arrow.flight.Ticket;

/**
 * A DoGet ticket of kind PEER: one sidecar asks the sidecar that owns samples (the partitioned cache,
 * {@code io.unstall.flight.cluster}) for them by id. The id-list layout of {@link Wire}; it is accepted only on
 * the peer port, authenticated with the cluster token, and answered with a batch of {@link BatchSchema}.
 * Pinned by {@code protocol/fixtures/peer-ticket-v1.*}.
 */
public final class PeerTicket {
  private final String dataset;
  private final long epoch;
  private final long[] ids;

  public PeerTicket(String dataset, long epoch, long[] ids) {
    Wire.check("a peer ticket", dataset, epoch, ids, FetchTicket.MAX_IDS);
    this.dataset = dataset;
    this.epoch = epoch;
    this.ids = ids.clone();
  }

  public String dataset() {
    return dataset;
  }

  public long epoch() {
    return epoch;
  }

  public long[] ids() {
    return ids.clone();
  }

  public byte[] toBytes() {
    return Wire.encodeIds(Wire.KIND_PEER, dataset, epoch, ids);
  }

  public Ticket toTicket() {
    return new Ticket(toBytes());
  }

  /** Parses a PEER ticket; every defect is a {@link MalformedTicketException} saying what is wrong. */
  public static PeerTicket parse(byte[] bytes) {
    Wire.IdList m = Wire.parseIds(bytes, Wire.KIND_PEER, FetchTicket.MAX_IDS);
    return new PeerTicket(m.dataset(), m.epoch(), m.ids());
  }

  @Override
  public String toString() {
    return "PeerTicket{dataset=" + dataset + ", epoch=" + epoch + ", n=" + ids.length + "}";
  }
}
