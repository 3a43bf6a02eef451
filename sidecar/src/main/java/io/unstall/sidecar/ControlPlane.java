package io.unstall.sidecar;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import io.unstall.flight.DataPlane;
import io.unstall.flight.dataset.Dataset;
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

  public String registerDataset(String name, String format, String uri, String optionsJson) throws IOException {
    if (optionsJson != null && !optionsJson.isBlank() && JSON.readTree(optionsJson).size() > 0) {
      throw new IllegalArgumentException(
          "dataset '" + name + "': format '" + format + "' takes no options, got " + optionsJson);
    }
    return JSON.writeValueAsString(dataPlane.registry().register(name, format, uri).describe());
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

  /** Stops the sidecar shortly after this call returns. */
  public void shutdown() {
    Thread t = new Thread(shutdown, "unstall-shutdown");
    t.setDaemon(false);
    t.start();
  }
}
