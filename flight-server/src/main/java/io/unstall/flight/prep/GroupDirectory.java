package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.node.ObjectNode;

/**
 * Where a sidecar announces the prep groups that remote prep workers may join (docs/ARCHITECTURE.md, "Across
 * nodes": remote prep workers). In a cluster it is the cluster engine's replicated directory; a sidecar started
 * with {@code --prep-worker} watches it and enlists in every group announced there, and leaves when the group's
 * entry goes. On its own a sidecar announces nothing.
 */
public interface GroupDirectory {
  GroupDirectory NONE = new GroupDirectory() {
    @Override
    public void opened(String group, ObjectNode advert) {}

    @Override
    public void closed(String group) {}
  };

  /**
   * Group {@code group} now takes remote prep workers. {@code advert}: its {@code dataset}, {@code format} and
   * {@code uri} (what a worker registers to read the same samples); the directory adds the owner's peer address.
   */
  void opened(String group, ObjectNode advert);

  /** Group {@code group} closed (or this sidecar stops): workers leave it. */
  void closed(String group);
}
