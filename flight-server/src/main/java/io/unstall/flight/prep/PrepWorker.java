package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.charset.StandardCharsets;
import java.util.Iterator;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.arrow.flight.Action;
import org.apache.arrow.flight.AsyncPutListener;
import org.apache.arrow.flight.CallOption;
import org.apache.arrow.flight.FlightClient;
import org.apache.arrow.flight.FlightDescriptor;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.flight.FlightStatusCode;
import org.apache.arrow.flight.Result;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * This sidecar as a remote prep worker of a group another sidecar owns (docs/ARCHITECTURE.md, "Across nodes":
 * remote prep workers). Over the owner's peer port (cluster token) it enlists, then loops: claim a batch, fetch
 * its samples through this sidecar's own tiers (cache, peers, storage), prepare it with the group's pipeline and
 * the same per-(seed, epoch, sample) randomness (a {@link PrepReplica} runs the very code the owner runs),
 * and upload it. The owner stages one upload per batch; a claim not uploaded in time goes back to the owner.
 * Closing leaves: claims in flight are given back at once.
 */
public final class PrepWorker implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(PrepWorker.class);
  private static final ObjectMapper JSON = new ObjectMapper();

  private final RemotePrep remote;
  private final FlightClient owner;
  private final String ownerAddress;
  private final CallOption[] options;
  private final String group;
  private final String name;
  private final AtomicLong uploaded = new AtomicLong();
  private final AtomicLong released = new AtomicLong();
  private final AtomicLong refused = new AtomicLong();
  private volatile boolean stopping;
  private volatile String state = "enlisting";
  private volatile String lastError;
  private long workerId;
  private PrepReplica replica;
  private Thread thread;

  PrepWorker(RemotePrep remote, FlightClient owner, String ownerAddress, CallOption[] options, String group,
      String name) {
    this.remote = remote;
    this.owner = owner;
    this.ownerAddress = ownerAddress;
    this.options = options;
    this.group = group;
    this.name = name;
  }

  /** Enlists (errors are thrown here), then runs the claim loop on its own thread. */
  void start() throws Exception {
    JsonNode spec = action(RemotePrep.PEER_ENLIST, JsonNodeFactory.instance.objectNode().put("group", group)
        .put("name", name));
    workerId = spec.path("worker").asLong();
    try {
      replica = remote.replica(spec);
    } catch (RuntimeException e) {
      leave();
      throw e;
    }
    state = "running";
    thread = new Thread(this::loop, "unstall-prep-remote-" + group);
    thread.setDaemon(true);
    thread.start();
  }

  private void loop() {
    try {
      while (!stopping) {
        JsonNode turn = action(RemotePrep.PEER_CLAIM, body());
        String s = turn.path("state").asText();
        if (s.equals("closed")) {
          state = "group closed";
          return;
        }
        if (!s.equals("produce")) {
          continue; // "wait": nothing to prepare within the group's window now
        }
        long epoch = turn.path("epoch").asLong();
        long batch = turn.path("batch").asLong();
        VectorSchemaRoot root;
        try {
          root = replica.prepare(epoch, batch);
        } catch (Exception e) {
          // The owner prepares it itself (and reports a bad image to the members as its own failure would).
          released.incrementAndGet();
          action(RemotePrep.PEER_RELEASE, body().put("epoch", epoch).put("batch", batch)
              .put("reason", String.valueOf(e.getMessage())));
          continue;
        }
        try (root) {
          put(epoch, batch, root);
          uploaded.incrementAndGet();
        } catch (FlightRuntimeException e) {
          if (e.status().code() != FlightStatusCode.INVALID_ARGUMENT) {
            throw e;
          }
          refused.incrementAndGet(); // too late: the claim expired and the owner made the batch; claim again
          LOG.warn("remote prep worker of group {}: upload refused: {}", group, e.getMessage());
        }
      }
    } catch (Exception e) {
      if (!stopping) {
        lastError = e.getMessage();
        state = "failed";
        LOG.warn("remote prep worker of group {} at {} stops: {}", group, ownerAddress, e.getMessage());
      }
    } finally {
      if (!state.equals("group closed")) {
        leave();
      }
      replica.close();
    }
  }

  private void put(long epoch, long batch, VectorSchemaRoot root) {
    ObjectNode cmd = JsonNodeFactory.instance.objectNode();
    cmd.set(RemotePrep.PEER_PUT, body().put("epoch", epoch).put("batch", batch));
    FlightClient.ClientStreamListener l = owner.startPut(
        FlightDescriptor.command(cmd.toString().getBytes(StandardCharsets.UTF_8)), root, new AsyncPutListener(),
        options);
    l.putNext();
    l.completed();
    l.getResult(); // throws the owner's refusal (a late upload: the claim expired and the batch was made again)
  }

  private void leave() {
    try {
      action(RemotePrep.PEER_LEAVE, body());
    } catch (Exception e) {
      LOG.debug("leaving group {} at {}: {}", group, ownerAddress, e.toString()); // its claims expire there
    }
    if (state.equals("running")) {
      state = "left";
    }
  }

  private ObjectNode body() {
    return JsonNodeFactory.instance.objectNode().put("group", group).put("worker", workerId);
  }

  private JsonNode action(String type, ObjectNode body) throws Exception {
    Iterator<Result> it = owner.doAction(new Action(type, body.toString().getBytes(StandardCharsets.UTF_8)), options);
    JsonNode r = JSON.readTree(it.next().getBody());
    while (it.hasNext()) {
      it.next();
    }
    return r;
  }

  boolean finished() {
    return thread != null && !thread.isAlive();
  }

  /** Batches this worker prepared and the owner accepted. */
  public long batchesUploaded() {
    return uploaded.get();
  }

  public synchronized ObjectNode statsJson() {
    ObjectNode o = JsonNodeFactory.instance.objectNode();
    o.put("group", group);
    o.put("owner", ownerAddress);
    o.put("worker", workerId);
    o.put("state", state);
    o.put("batches_uploaded", uploaded.get());
    o.put("batches_given_back", released.get());
    o.put("uploads_refused", refused.get());
    if (lastError != null) {
      o.put("error", lastError);
    }
    return o;
  }

  /**
   * Leaves the group: stops claiming, finishes the batch in hand, then leaves (the owner takes back any claim it
   * still holds; if the owner cannot be told, its claims expire there after {@code --prep-claim-timeout}).
   */
  @Override
  public void close() throws InterruptedException {
    stopping = true;
    if (thread != null) {
      thread.join(TimeUnit.SECONDS.toMillis(60));
    }
  }
}
