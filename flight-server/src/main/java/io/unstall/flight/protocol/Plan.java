package io.unstall.flight.protocol;

/**
 * A PLAN message, the body of the {@code prefetch} action: the whole order of one epoch of a dataset, so the
 * sidecar reads upcoming misses ahead (clairvoyant prefetch). The id-list layout of {@link Wire} with kind
 * PLAN, pinned by {@code protocol/fixtures/plan-v1.*}. (The same-host socket carries plans in its own PLAN
 * frame, {@link LocalFrames}.)
 */
public record Plan(String dataset, long epoch, long[] ids) {
  public static final int MAX_IDS = 1 << 28;

  public Plan {
    Wire.check("a plan", dataset, epoch, ids, MAX_IDS);
    ids = ids.clone();
  }

  @Override
  public long[] ids() {
    return ids.clone();
  }

  public int size() {
    return ids.length;
  }

  public long id(int i) {
    return ids[i];
  }

  public byte[] toBytes() {
    return Wire.encodeIds(Wire.KIND_PLAN, dataset, epoch, ids);
  }

  /**
   * The id count a PLAN message declares, read from its header alone (so a bound can refuse it before the ids
   * are parsed), or -1 when the header is malformed ({@link #parse} then says how).
   */
  public static long declaredSize(byte[] bytes) {
    return Wire.declaredCount(bytes, Wire.KIND_PLAN);
  }

  /** Parses a PLAN message; every defect is a {@link MalformedTicketException} saying what is wrong. */
  public static Plan parse(byte[] bytes) {
    Wire.IdList m = Wire.parseIds(bytes, Wire.KIND_PLAN, MAX_IDS);
    return new Plan(m.dataset(), m.epoch(), m.ids());
  }

  @Override
  public String toString() {
    return "Plan{dataset=" + dataset + ", epoch=" + epoch + ", n=" + ids.length + "}";
  }
}
