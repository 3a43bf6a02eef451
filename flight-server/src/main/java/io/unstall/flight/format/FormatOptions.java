package io.unstall.flight.format;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;

/** A format's registration options (a JSON object), read with errors that name the dataset and the option. */
final class FormatOptions {
  private final String dataset;
  private final String format;
  private final JsonNode options;

  FormatOptions(String dataset, String format, JsonNode options, Set<String> known) {
    this.dataset = dataset;
    this.format = format;
    this.options = options == null ? JsonNodeFactory.instance.objectNode() : options;
    for (var it = this.options.fieldNames(); it.hasNext(); ) {
      String key = it.next();
      if (!known.contains(key)) {
        throw error(key, "is not an option of this format (its options: " + String.join(", ", known) + ")");
      }
    }
  }

  /** A string option, or null when absent. */
  String string(String key) {
    JsonNode v = options.get(key);
    if (v == null || v.isNull()) {
      return null;
    }
    if (!v.isTextual() || v.asText().isEmpty()) {
      throw error(key, "must be a non-empty string, got " + v);
    }
    return v.asText();
  }

  /** A list of strings (a JSON array, or one string), or null when absent. */
  List<String> strings(String key) {
    JsonNode v = options.get(key);
    if (v == null || v.isNull()) {
      return null;
    }
    if (v.isTextual()) {
      return List.of(string(key));
    }
    List<String> out = new ArrayList<>();
    if (v.isArray()) {
      for (JsonNode e : v) {
        if (!e.isTextual() || e.asText().isEmpty()) {
          throw error(key, "must be a list of non-empty strings, got " + v);
        }
        out.add(e.asText());
      }
    }
    if (out.isEmpty()) {
      throw error(key, "must be a non-empty list of strings, got " + v);
    }
    return out;
  }

  IllegalArgumentException error(String key, String what) {
    return new IllegalArgumentException("dataset '" + dataset + "': " + format + " option '" + key + "' " + what);
  }
}
