package io.unstall.sidecar;

import com.fasterxml.jackson.databind.JsonNode;
import io.unstall.flight.cluster.PrepDirectory;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * {@code --prep-worker}: this sidecar prepares batches for the prep groups other sidecars of the cluster announce
 * (tf.data service's elastic workers): it enlists in each group as it appears in the cluster's directory (looked at
 * every second) and leaves when the group's entry goes; it can join or leave (stop, crash) while the groups run.
 * Each group's dataset is registered here under the owner's name, format and location, through the control plane's
 * own checks (a local path must be this user's or under an {@code --allow-root}); a group whose dataset cannot be
 * registered or read here is skipped with a warning that names it.
 */
final class PrepVolunteer implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(PrepVolunteer.class);

  private final ControlPlane control;
  private final PrepDirectory directory;
  private final ScheduledExecutorService exec; // one thread: enlisting talks to the owner
  private final Map<String, String> joined = new HashMap<>(); // directory key (owner/group) -> group; exec only
  private final Set<String> warned = new HashSet<>(); // groups that could not be joined (tried again, warned once)

  PrepVolunteer(ControlPlane control, PrepDirectory directory) {
    this.control = control;
    this.directory = directory;
    this.exec = Executors.newSingleThreadScheduledExecutor(r -> {
      Thread t = new Thread(r, "unstall-prep-volunteer");
      t.setDaemon(true);
      return t;
    });
    LOG.info("prep worker: enlisting in the prep groups the cluster's sidecars announce");
    exec.scheduleWithFixedDelay(this::reconcile, 0, 1, TimeUnit.SECONDS);
  }

  /** Joins the groups announced now, leaves the ones withdrawn. */
  private void reconcile() {
    try {
      Map<String, JsonNode> now = directory.others();
      now.forEach((key, advert) -> {
        if (!joined.containsKey(key)) {
          join(key, advert);
        }
      });
      for (String key : new ArrayList<>(joined.keySet())) {
        if (!now.containsKey(key)) {
          leave(key);
        }
      }
      warned.retainAll(now.keySet());
    } catch (RuntimeException e) { // the cluster going away: tried again in a second, never kills the schedule
      LOG.warn("prep worker: reading the cluster's prep groups failed (retried): {}", e.toString());
    }
  }

  private void join(String key, JsonNode a) {
    String owner = a.path("owner").asText();
    String group = a.path("group").asText();
    String dataset = a.path("dataset").asText();
    try {
      control.registerDataset(dataset, a.path("format").asText(), a.path("uri").asText(), null);
      control.enlistPrepWorker(owner, group);
      joined.put(key, group);
      LOG.info("prep worker: enlisted in prep group {} of {} (dataset '{}')", group, owner, dataset);
    } catch (Exception e) {
      if (!warned.add(key)) {
        return;
      }
      LOG.warn("prep worker: not joining prep group {} of {} (dataset '{}' at {}): {}", group, owner, dataset,
          a.path("uri").asText(), e.getMessage() + " (tried again every second)");
    }
  }

  private void leave(String key) {
    String group = joined.remove(key);
    if (group == null) {
      return;
    }
    try {
      control.leavePrepWorker(group);
      LOG.info("prep worker: left prep group {} (it closed)", key);
    } catch (IllegalArgumentException gone) {
      // already left
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  @Override
  public void close() {
    exec.shutdownNow(); // the prep service closes the workers themselves when the data plane stops
  }
}
