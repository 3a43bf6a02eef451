package io.unstall.flight.cluster;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.hazelcast.replicatedmap.ReplicatedMap;
import io.unstall.flight.prep.GroupDirectory;
import java.io.IOException;
import java.util.HashMap;
import java.util.Map;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The cluster's directory of prep groups that take remote prep workers: a Hazelcast {@code ReplicatedMap} (every
 * member holds the whole, small map) from {@code owner-peer/group} to the group's advert (JSON: owner, group,
 * dataset, format, uri). Only adverts go through the engine; batches move over Flight between peer ports, with
 * the cluster token. A departed owner's adverts are removed by the members that see it leave.
 */
public final class PrepDirectory implements GroupDirectory {
  private static final Logger LOG = LoggerFactory.getLogger(PrepDirectory.class);
  private static final ObjectMapper JSON = new ObjectMapper();
  static final String MAP = "unstall.prep.groups";

  private final ReplicatedMap<String, String> map;
  private final String self; // this sidecar's peer address

  PrepDirectory(ReplicatedMap<String, String> map, String self) {
    this.map = map;
    this.self = self;
  }

  @Override
  public void opened(String group, ObjectNode advert) {
    map.put(self + "/" + group, advert.put("owner", self).toString());
  }

  @Override
  public void closed(String group) {
    map.remove(self + "/" + group);
  }

  /** Withdraws every group of a sidecar that left the cluster (its workers' claims fail on their own). */
  public void forget(Peer departed) {
    String prefix = departed.address() + "/";
    for (String k : map.keySet()) {
      if (k.startsWith(prefix)) {
        map.remove(k);
      }
    }
  }

  /**
   * The groups other sidecars announce now, by key ({@code owner/group}): the local copy of the replicated map
   * (a member that just joined gets the others' entries shortly after joining: callers poll).
   */
  public Map<String, JsonNode> others() {
    Map<String, JsonNode> out = new HashMap<>();
    for (Map.Entry<String, String> e : map.entrySet()) {
      if (e.getKey().startsWith(self + "/")) {
        continue; // this sidecar's own group: it prepares those itself
      }
      try {
        out.put(e.getKey(), JSON.readTree(e.getValue()));
      } catch (IOException ex) {
        LOG.warn("prep group directory: a bad advert under '{}' ignored: {}", e.getKey(), ex.getMessage());
      }
    }
    return out;
  }

}
