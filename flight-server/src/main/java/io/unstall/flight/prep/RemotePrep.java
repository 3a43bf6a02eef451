package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.dataset.DatasetRegistry;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.apache.arrow.flight.Action;
import org.apache.arrow.flight.CallOption;
import org.apache.arrow.flight.CallStatus;
import org.apache.arrow.flight.FlightClient;
import org.apache.arrow.flight.FlightDescriptor;
import org.apache.arrow.flight.FlightStream;
import org.apache.arrow.util.AutoCloseables;

/**
 * Remote prep workers (protocol/README.md, "Remote prep workers"), both sides of the {@code peer.prep.*} protocol
 * on the peer port (cluster token): as the owner, the actions and uploads of other sidecars' workers in this
 * sidecar's groups ({@link RemoteWorkers} in each group); as a worker, this sidecar's {@link PrepWorker}s in other
 * sidecars' groups, each with a {@link PrepReplica} of the group.
 */
final class RemotePrep implements AutoCloseable {
  static final String PEER_ENLIST = "peer.prep.enlist";
  static final String PEER_CLAIM = "peer.prep.claim";
  static final String PEER_RELEASE = "peer.prep.release";
  static final String PEER_LEAVE = "peer.prep.leave";
  static final String PEER_PUT = "peer.prep.put";
  /** How long one {@code peer.prep.claim} waits for a batch to prepare before answering "wait". */
  static final long PEER_CLAIM_WAIT_NANOS = TimeUnit.SECONDS.toNanos(1);

  private final DatasetRegistry registry;
  private final PrepResources shared;
  private final PrepGroups groups;
  private final List<PrepWorker> workers = new ArrayList<>(); // guarded by this: enlisted in other sidecars' groups

  RemotePrep(DatasetRegistry registry, PrepResources shared, PrepGroups groups) {
    this.registry = registry;
    this.shared = shared;
    this.groups = groups;
  }

  // -- the owner's side -----------------------------------------------------------------------------------------

  static boolean handles(String actionType) {
    return actionType.startsWith("peer.prep.");
  }

  /** A {@code peer.prep.*} action of another sidecar; one JSON result. */
  byte[] action(Action action) throws Exception {
    String type = action.getType();
    JsonNode b = PrepRequests.body(type, action.getBody());
    String out = switch (type) {
      case PEER_ENLIST -> group(b).enlist(groups.nextMemberId(), b.path("name").asText("")).toString();
      case PEER_CLAIM -> {
        RemoteWorkers.Turn t = group(b).workerClaim(worker(type, b), PEER_CLAIM_WAIT_NANOS);
        ObjectNode o = JsonNodeFactory.instance.objectNode().put("v", 1).put("state", t.state());
        if (t.state().equals("produce")) {
          o.put("epoch", t.epoch()).put("batch", t.batch());
        }
        yield o.toString();
      }
      case PEER_RELEASE -> {
        PrepRequests.At at = PrepRequests.workerAt(type, b);
        group(b).workerRelease(at.member(), at.epoch(), at.batch(), b.path("reason").asText(""));
        yield "{\"v\":1,\"released\":true}";
      }
      case PEER_LEAVE -> {
        group(b).workerLeave(worker(type, b));
        yield "{\"v\":1,\"left\":true}";
      }
      default -> throw CallStatus.UNIMPLEMENTED.withDescription("unknown peer action '" + type + "'; peer actions: "
          + List.of(PEER_ENLIST, PEER_CLAIM, PEER_RELEASE, PEER_LEAVE)).toRuntimeException();
    };
    return out.getBytes(StandardCharsets.UTF_8);
  }

  static boolean handlesPut(FlightDescriptor d) {
    return d.isCommand() && new String(d.getCommand(), StandardCharsets.UTF_8).startsWith("{\"" + PEER_PUT + "\"");
  }

  /** DoPut of a batch a remote worker prepared: {@code {"peer.prep.put":{"group","worker","epoch","batch"}}}. */
  void acceptPut(FlightStream stream) {
    JsonNode c = PrepRequests.body(PEER_PUT, stream.getDescriptor().getCommand()).get(PEER_PUT);
    if (c == null || !c.isObject()) {
      throw new IllegalArgumentException(PEER_PUT + ": expected {\"" + PEER_PUT
          + "\":{\"group\",\"worker\",\"epoch\",\"batch\"}}");
    }
    PrepRequests.At at = PrepRequests.workerAt(PEER_PUT, c);
    PrepGroup g = group(c);
    if (!stream.next()) {
      throw new IllegalArgumentException(PEER_PUT + ": the stream carries no record batch");
    }
    g.workerUpload(at.member(), at.epoch(), at.batch(), stream.getRoot());
    while (stream.next()) {
      // one batch per upload; drain anything else
    }
  }

  private static long worker(String type, JsonNode b) {
    return PrepRequests.workerAt(type, ((ObjectNode) b.deepCopy()).put("epoch", 0).put("batch", 0)).member();
  }

  private PrepGroup group(JsonNode b) {
    PrepGroup g = groups.get(PrepRequests.group(b));
    if (g == null) {
      throw CallStatus.NOT_FOUND.withDescription("prep group '" + PrepRequests.group(b) + "' is unknown here")
          .toRuntimeException();
    }
    return g;
  }

  // -- the worker's side ----------------------------------------------------------------------------------------

  /**
   * Enlists this sidecar as a remote prep worker of group {@code group} owned by the sidecar whose peer port
   * {@code owner} reaches (with the cluster token in {@code options}); returns once enlisted, then prepares the
   * batches it claims until {@link PrepWorker#close()} or the group closes. The group's dataset must be registered
   * here under the same name (same samples).
   */
  PrepWorker enlist(FlightClient owner, String ownerAddress, CallOption[] options, String group, String name)
      throws Exception {
    PrepWorker w = new PrepWorker(this, owner, ownerAddress, options, group, name);
    synchronized (this) {
      workers.removeIf(PrepWorker::finished);
      workers.add(w);
    }
    w.start();
    return w;
  }

  /** The worker's copy of an owner's group, from the owner's {@code peer.prep.enlist} answer. */
  PrepReplica replica(JsonNode spec) {
    Dataset d = registry.get(spec.path("dataset").asText());
    if (d.size() != spec.path("num_samples").asInt()) {
      throw new IllegalArgumentException("remote prep worker: dataset '" + d.name() + "' has " + d.size()
          + " samples here and " + spec.path("num_samples").asInt() + " on the group's sidecar");
    }
    PrepPipeline p = PrepPipeline.parse(spec.get("pipeline"));
    if (!p.fingerprint().equals(spec.path("fingerprint").asText())) {
      throw new IllegalArgumentException("remote prep worker: the pipeline parses to another fingerprint here ("
          + p.fingerprint() + " vs " + spec.path("fingerprint").asText() + "): different sidecar versions?");
    }
    PrepGroup.Key key = new PrepGroup.Key(d.name(), p.fingerprint(), spec.path("seed").asLong(),
        spec.path("batch_size").asInt(), spec.path("shuffle").asBoolean(), spec.path("drop_last").asBoolean());
    return new PrepReplica(spec.path("group").asText(), key, d, p, shared);
  }

  /** Adds each worker's stats to {@code out}. */
  synchronized void stats(ArrayNode out) {
    workers.forEach(w -> out.add(w.statsJson()));
  }

  /** Leaves every group this sidecar works for (claims in flight are given back). */
  @Override
  public void close() throws Exception {
    List<PrepWorker> ws;
    synchronized (this) {
      ws = new ArrayList<>(workers);
    }
    AutoCloseables.close(ws);
  }
}
