package io.unstall.flight.protocol;

import org.apache.arrow.flight.Ticket;

/**
 * A DoGet ticket of the id-list layout of {@link Wire}: a dataset, an epoch and sample ids, of one kind
 * ({@link FetchTicket}, {@link PeerTicket}). Holds and encodes the fields; the kinds differ in who may send them.
 */
public abstract class IdListTicket {
  public static final int MAX_IDS = 65536;

  private final int kind;
  private final String dataset;
  private final long epoch;
  private final long[] ids;

  IdListTicket(int kind, String what, String dataset, long epoch, long[] ids) {
    Wire.check(what, dataset, epoch, ids, MAX_IDS);
    this.kind = kind;
    this.dataset = dataset;
    this.epoch = epoch;
    this.ids = ids.clone();
  }

  public final String dataset() {
    return dataset;
  }

  public final long epoch() {
    return epoch;
  }

  public final int size() {
    return ids.length;
  }

  public final long id(int i) {
    return ids[i];
  }

  public final long[] ids() {
    return ids.clone();
  }

  public final byte[] toBytes() {
    return Wire.encodeIds(kind, dataset, epoch, ids);
  }

  public final Ticket toTicket() {
    return new Ticket(toBytes());
  }

  @Override
  public final String toString() {
    return getClass().getSimpleName() + "{dataset=" + dataset + ", epoch=" + epoch + ", n=" + ids.length + "}";
  }
}
