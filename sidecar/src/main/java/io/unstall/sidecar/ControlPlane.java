package io.unstall.sidecar;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import io.unstall.flight.DataPlane;
import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.dataset.Manifests;
import com.fasterxml.jackson.databind.JsonNode;
import java.nio.file.Path;
import java.io.IOException;

/**
 * The Py4J entry point: what the Python shim calls to register datasets and read stats. Every method returns
 * JSON text (protocol/README.md) so the Python side needs no Java object proxies. Errors carry messages that
 * name the dataset, file or option.
 */
public final class ControlPlane {
  private static final ObjectMapper JSON = new ObjectMapper();
  private final DataPlane dataPlane;
  private final Runnable shutdown;

  ControlPlane(DataPlane dataPlane, Runnable shutdown) {
    this.dataPlane = dataPlane;
    this.shutdown = shutdown;
  }

  public int protocolVersion() {
    return 1;
  }

  /**
   * Registers a dataset. Options (JSON object): {@code manifest}, the path of a digest manifest exported from a
   * dataset of the same content; its digests are claims, each checked against this dataset's own bytes on the
   * sample's first read before an entry is served under it.
   */
  public String registerDataset(String name, String format, String uri, String optionsJson) throws IOException {
    JsonNode options = optionsJson == null || optionsJson.isBlank() ? JSON.createObjectNode() : JSON.readTree(optionsJson);
    Path manifest = null;
    for (var it = options.fieldNames(); it.hasNext(); ) {
      String key = it.next();
      if (!key.equals("manifest")) {
        throw new IllegalArgumentException(
            "dataset '" + name + "': unknown option '" + key + "' (supported: manifest)");
      }
      manifest = Path.of(options.get(key).asText());
    }
    return JSON.writeValueAsString(dataPlane.registry().register(name, format, uri, manifest).describe());
  }

  /** Writes the digests the dataset computed from its own bytes to {@code path} (mode 0600), for an import. */
  public String exportManifest(String name, String path) throws IOException {
    Dataset d = dataPlane.registry().get(name);
    int known = Manifests.write(d, Path.of(path));
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

  /** Stops the sidecar shortly after this call returns. */
  public void shutdown() {
    Thread t = new Thread(shutdown, "unstall-shutdown");
    t.setDaemon(false);
    t.start();
  }
}
