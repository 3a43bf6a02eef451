package io.unstall.flight.protocol;

/** A ticket that does not follow the wire protocol. The message always starts with "malformed ticket: ". */
public final class MalformedTicketException extends IllegalArgumentException {
  public MalformedTicketException(String detail) {
    super("malformed ticket: " + detail);
  }
}
