package io.unstall.sidecar;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.DataPlane;
import io.unstall.flight.auth.TenantTokens;
import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.dataset.Manifests;
import io.unstall.flight.format.CorruptRecordException;
import io.unstall.flight.format.FormatOptions;
import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * The Py4J entry point: what the owner's shim calls to register datasets, read stats and manage tenant tokens.
 * Only the owner's token opens it, and {@link ControlGateway} lets callers reach these methods and nothing
 * else. Every method returns JSON text (protocol/README.md) so the Python side needs no Java object proxies.
 * Errors carry messages that name the dataset, file, option or token id (never a token).
 */
public final class ControlPlane {
  private static final ObjectMapper JSON = new ObjectMapper();
  private final DataPlane dataPlane;
  private final PathPolicy paths;
  private final Runnable shutdown;
  private final java.util.Map<String, io.unstall.flight.prep.PrepWorker> prepWorkers = new java.util.HashMap<>();

  ControlPlane(DataPlane dataPlane, PathPolicy paths, Runnable shutdown) {
    this.dataPlane = dataPlane;
    this.paths = paths;
    this.shutdown = shutdown;
  }

  public int protocolVersion() {
    return 1;
  }

  /**
   * Registers a dataset. Its location must be the sidecar user's own or under an {@code --allow-root}. Options
   * (JSON object): {@code manifest}, the path of a digest manifest exported from a dataset of the same content
   * (under the sidecar home or an allowed root); its digests are claims, each checked against this dataset's own
   * bytes on the sample's first read before an entry is served under it. Every other option is the format's
   * ({@link FormatOptions}: {@code payload}/{@code label} of webdataset, ...).
   */
  public String registerDataset(String name, String format, String uri, String optionsJson) throws IOException {
    JsonNode parsed =
        optionsJson == null || optionsJson.isBlank() ? JSON.createObjectNode() : JSON.readTree(optionsJson);
    if (!parsed.isObject()) {
      throw new IllegalArgumentException("dataset '" + name + "': options must be a JSON object, got " + parsed);
    }
    ObjectNode options = (ObjectNode) parsed;
    Path manifest = null;
    JsonNode m = options.remove("manifest");
    if (m != null) {
      manifest = paths.checkManifest("dataset '" + name + "': manifest", m.asText(), true);
    }
    paths.checkDatasetRoot(name, uri);
    try {
      return JSON.writeValueAsString(
          dataPlane.registry().register(name, format, uri, manifest, FormatOptions.of(format, options)).describe());
    } catch (CorruptRecordException e) { // Py4J passes on the message only: it carries the marker line
      throw new IOException(e.dataError().describe(e.getMessage()), e);
    }
  }

  /**
   * Writes the digests the dataset computed from its own bytes to {@code path} (mode 0600), under the sidecar
   * home or an allowed root, for an import.
   */
  public String exportManifest(String name, String path) throws IOException {
    Dataset d = dataPlane.registry().get(name);
    Path target = paths.checkManifest("exportManifest of dataset '" + name + "'", path, false);
    int known = Manifests.write(d, target);
    return JSON.writeValueAsString(
        JSON.createObjectNode().put("path", path).put("known", known).put("num_samples", d.size()));
  }

  public String describeDataset(String name) throws IOException {
    return JSON.writeValueAsString(dataPlane.registry().get(name).describe());
  }

  public String listDatasets() throws IOException {
    ArrayNode out = JSON.createArrayNode();
    for (Dataset d : dataPlane.registry().all()) {
      out.add(d.describe());
    }
    return JSON.writeValueAsString(out);
  }

  public String stats() {
    return dataPlane.producer().statsJson();
  }

  public String flightLocation() {
    return dataPlane.location().getUri().toString();
  }

  /** The same-host data plane's socket path, or "" when this sidecar has none (protocol/README.md). */
  public String localEndpoint() {
    java.nio.file.Path p = dataPlane.localEndpoint();
    return p == null ? "" : p.toString();
  }

  /**
   * Issues a tenant token for the datasets of {@code datasetsJson} (a JSON array of names): Flight only, those
   * datasets only. The reply is the one place the token appears; the sidecar keeps its SHA-256.
   */
  public String issueToken(String datasetsJson, String name) throws IOException {
    JsonNode arr = datasetsJson == null || datasetsJson.isBlank() ? null : JSON.readTree(datasetsJson);
    if (arr == null || !arr.isArray()) {
      throw new IllegalArgumentException("issueToken: datasets must be a JSON array of dataset names");
    }
    List<String> datasets = new ArrayList<>();
    arr.forEach(d -> datasets.add(d.asText()));
    TenantTokens.Issued issued = dataPlane.tenants().issue(datasets, name);
    return describe(issued.tenant()).put("token", issued.token()).toString();
  }

  /** Revokes the tenant token {@code id}: refused from its next call on. */
  public String revokeToken(String id) throws IOException {
    return describe(dataPlane.tenants().revoke(id)).put("revoked", true).toString();
  }

  /** The tenant tokens issued and not revoked: ids, names, grants (never the tokens or their hashes). */
  public String listTokens() {
    ArrayNode out = JSON.createArrayNode();
    dataPlane.tenants().list().forEach(t -> out.add(describe(t)));
    return out.toString();
  }

  static ObjectNode describe(TenantTokens.Tenant t) {
    ObjectNode o = JSON.createObjectNode().put("v", 1).put("id", t.id()).put("name", t.name());
    t.datasets().forEach(o.putArray("datasets")::add);
    return o.put("created", t.created());
  }

  /**
   * Enlists this sidecar as a remote prep worker of prep group {@code group} owned by the sidecar whose peer port is
   * {@code ownerPeer} ({@code host:port}; same cluster and cluster token; the group's dataset registered here under
   * the same name). It prepares some of that group's batches until {@link #leavePrepWorker} or the group closes.
   * Returns the worker's stats (as {@code prep.stats}' {@code workers}).
   */
  public String enlistPrepWorker(String ownerPeer, String group) throws Exception {
    synchronized (prepWorkers) {
      if (prepWorkers.containsKey(group)) {
        throw new IllegalArgumentException("enlistPrepWorker: this sidecar already works for prep group " + group);
      }
      io.unstall.flight.prep.PrepWorker w = dataPlane.enlistPrepWorker(ownerPeer, group);
      prepWorkers.put(group, w);
      return w.statsJson().toString();
    }
  }

  /** Stops preparing batches for {@code group} (the worker leaves; its claims go back to the group's sidecar). */
  public String leavePrepWorker(String group) throws InterruptedException {
    io.unstall.flight.prep.PrepWorker w;
    synchronized (prepWorkers) {
      w = prepWorkers.remove(group);
    }
    if (w == null) {
      throw new IllegalArgumentException("leavePrepWorker: this sidecar does not work for prep group " + group);
    }
    w.close();
    return w.statsJson().toString();
  }

  /** Stops the sidecar shortly after this call returns. */
  public void shutdown() {
    Thread t = new Thread(shutdown, "unstall-shutdown");
    t.setDaemon(false);
    t.start();
  }
}
