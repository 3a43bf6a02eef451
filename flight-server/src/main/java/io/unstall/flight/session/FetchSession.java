package io.unstall.flight.session;

import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.dataset.DatasetStats;

/**
 * One job's view of a dataset (one per DataLoader, per rank): it owns its clairvoyant plan and prefetch
 * staging (keyed by {@link #owner()}) and its counters, which also count into the dataset's. Two jobs on one
 * dataset never replace each other's plan or mix their per-epoch statistics.
 */
public final class FetchSession {
  private final long id;
  private final Dataset dataset;
  private final String name;
  private final String transport;
  private final String owner;
  private final DatasetStats stats;
  private volatile boolean open = true;

  FetchSession(long id, Dataset dataset, String name, String transport) {
    this.id = id;
    this.dataset = dataset;
    this.name = name;
    this.transport = transport;
    this.owner = "session-" + Long.toUnsignedString(id);
    this.stats = new DatasetStats(dataset.stats());
  }

  public long id() {
    return id;
  }

  public Dataset dataset() {
    return dataset;
  }

  public String name() {
    return name;
  }

  /** The key of this session's prefetch plan and staging. */
  public String owner() {
    return owner;
  }

  public DatasetStats stats() {
    return stats;
  }

  public boolean isOpen() {
    return open;
  }

  void markClosed() {
    open = false;
  }

  ObjectNode toJson() {
    ObjectNode o = stats.toJson();
    o.put("dataset", dataset.name());
    o.put("name", name);
    o.put("transport", transport);
    o.put("open", open);
    return o;
  }
}
