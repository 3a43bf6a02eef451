package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import io.unstall.flight.dataset.Dataset;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Keeps the cluster's {@link GroupDirectory} in line with this sidecar's groups that take remote prep workers:
 * announces each when it opens and withdraws it when it closes (or the sidecar stops). One writer, the reaper's
 * thread, so at most one reaper period late; nothing is announced until a directory is given.
 */
final class GroupAnnouncer {
  private static final Logger LOG = LoggerFactory.getLogger(GroupAnnouncer.class);

  private volatile GroupDirectory directory = GroupDirectory.NONE;
  private final Set<String> announced = new HashSet<>(); // groups in the directory; the reaper's thread, then close

  /** From now on groups are announced in {@code d}. */
  void announceIn(GroupDirectory d) {
    directory = d;
  }

  /** Brings the directory in line with {@code groups}, the open ones. */
  void sync(List<PrepGroup> groups) {
    GroupDirectory d = directory;
    if (d == GroupDirectory.NONE) {
      return;
    }
    Set<String> now = new HashSet<>();
    for (PrepGroup g : groups) {
      if (g.takesWorkers()) {
        now.add(g.id);
        if (announced.add(g.id)) {
          Dataset ds = g.dataset();
          d.opened(g.id, JsonNodeFactory.instance.objectNode()
              .put("group", g.id).put("dataset", ds.name()).put("format", ds.format().name())
              .put("uri", ds.storage().uri()));
        }
      }
    }
    for (var it = announced.iterator(); it.hasNext(); ) {
      String id = it.next();
      if (!now.contains(id)) {
        it.remove();
        d.closed(id);
      }
    }
  }

  /** Withdraws every group announced (the sidecar stops; the reaper has stopped). */
  void withdrawAll() {
    try {
      for (String id : announced) {
        directory.closed(id);
      }
    } catch (RuntimeException e) { // this sidecar left the cluster already: the others forget its groups
      LOG.debug("withdrawing prep groups from the cluster: {}", e.toString());
    }
    announced.clear();
  }
}
