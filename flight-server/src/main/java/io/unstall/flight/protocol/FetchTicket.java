package io.unstall.flight.protocol;

import org.apache.arrow.flight.Ticket;

/**
 * A DoGet ticket of kind FETCH: a batch of samples of one dataset by id, for one epoch. The id-list layout of
 * {@link Wire}, pinned by golden fixtures shared with the Python shim ({@code protocol/fixtures/ticket-*}).
 */
public final class FetchTicket extends IdListTicket {
  public static final int MAX_IDS = IdListTicket.MAX_IDS;

  public FetchTicket(String dataset, long epoch, long[] ids) {
    super(Wire.KIND_FETCH, "a ticket", dataset, epoch, ids);
  }

  public static FetchTicket from(Ticket ticket) {
    return parse(ticket.getBytes());
  }

  /** Parses a FETCH ticket; every defect is a {@link MalformedTicketException} saying what is wrong. */
  public static FetchTicket parse(byte[] bytes) {
    Wire.IdList m = Wire.parseIds(bytes, Wire.KIND_FETCH, MAX_IDS);
    return new FetchTicket(m.dataset(), m.epoch(), m.ids());
  }
}
