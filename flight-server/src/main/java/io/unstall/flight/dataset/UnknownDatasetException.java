package io.unstall.flight.dataset;

import java.util.List;

/** A dataset name that is not registered. */
public final class UnknownDatasetException extends IllegalArgumentException {
  public UnknownDatasetException(String name, List<String> registered) {
    super(
        "unknown dataset '" + name + "'"
            + (registered.isEmpty()
                ? "; no datasets are registered"
                : "; registered datasets: " + String.join(", ", registered.stream().sorted().toList())));
  }
}
