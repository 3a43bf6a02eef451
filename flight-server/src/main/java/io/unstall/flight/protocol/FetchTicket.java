package io.unstall.flight.protocol;

import org.apache.arrow.flight.Ticket;

/**
 * A DoGet ticket of kind FETCH: a batch of samples of one dataset by id, for one epoch. The id-list layout of
 * {@link Wire}, pinned by golden fixtures shared with the Python shim ({@code protocol/fixtures/ticket-*}).
 */
public final class FetchTicket {
  public static final int MAX_IDS = 65536;

  private final String dataset;
  private final long epoch;
  private final long[] ids;

  public FetchTicket(String dataset, long epoch, long[] ids) {
    Wire.check("a ticket", dataset, epoch, ids, MAX_IDS);
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

  public int size() {
    return ids.length;
  }

  public long id(int i) {
    return ids[i];
  }

  public long[] ids() {
    return ids.clone();
  }

  public byte[] toBytes() {
    return Wire.encodeIds(Wire.KIND_FETCH, dataset, epoch, ids);
  }

  public Ticket toTicket() {
    return new Ticket(toBytes());
  }

  public static FetchTicket from(Ticket ticket) {
    return parse(ticket.getBytes());
  }

  /** Parses a FETCH ticket; every defect is a {@link MalformedTicketException} saying what is wrong. */
  public static FetchTicket parse(byte[] bytes) {
    Wire.IdList m = Wire.parseIds(bytes, Wire.KIND_FETCH, MAX_IDS);
    return new FetchTicket(m.dataset(), m.epoch(), m.ids());
  }

  @Override
  public String toString() {
    return "FetchTicket{dataset=" + dataset + ", epoch=" + epoch + ", n=" + ids.length + "}";
  }
}
