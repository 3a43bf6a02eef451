package io.unstall.flight.format;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.SerializationFeature;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;

/**
 * A dataset's format options, as registered ({@code unstall.torch.Dataset(..., options=...)} less the
 * registry's own {@code manifest}): a JSON object that a format reads through the typed getters below. Every
 * problem names the format and the option.
 */
public final class FormatOptions {
  private static final ObjectMapper CANONICAL =
      new ObjectMapper().configure(SerializationFeature.ORDER_MAP_ENTRIES_BY_KEYS, true);

  /** No options. */
  public static final FormatOptions NONE = new FormatOptions("", JsonNodeFactory.instance.objectNode());

  private final String format;
  private final ObjectNode json;

  private FormatOptions(String format, ObjectNode json) {
    this.format = format;
    this.json = json;
  }

  /** The options {@code json} (an object, or null for none) of a dataset of format {@code format}. */
  public static FormatOptions of(String format, JsonNode json) {
    if (json != null && !json.isNull() && !json.isObject()) {
      throw new IllegalArgumentException("format '" + format + "': options must be a JSON object, got " + json);
    }
    return new FormatOptions(
        format, json == null || json.isNull() ? JsonNodeFactory.instance.objectNode() : (ObjectNode) json);
  }

  /** The same options for format {@code format} (for messages). */
  FormatOptions forFormat(String name) {
    return new FormatOptions(name, json);
  }

  public boolean isEmpty() {
    return json.isEmpty();
  }

  /** Refuses any option but {@code known}, listing them. */
  public FormatOptions allow(String... known) {
    List<String> ok = Arrays.asList(known);
    for (var it = json.fieldNames(); it.hasNext(); ) {
      String key = it.next();
      if (!ok.contains(key)) {
        throw new IllegalArgumentException("format '" + format + "': unknown option '" + key + "' (its options: "
            + (ok.isEmpty() ? "none" : String.join(", ", new TreeSet<>(ok))) + "; any format's: manifest)");
      }
    }
    return this;
  }

  /** A string option, or {@code otherwise} when absent. */
  public String string(String key, String otherwise) {
    JsonNode v = json.get(key);
    if (v == null || v.isNull()) {
      return otherwise;
    }
    if (!v.isTextual() || v.asText().isEmpty()) {
      throw bad(key, "a non-empty string", v);
    }
    return v.asText();
  }

  /** A boolean option, or {@code otherwise} when absent. */
  public boolean bool(String key, boolean otherwise) {
    JsonNode v = json.get(key);
    if (v == null || v.isNull()) {
      return otherwise;
    }
    if (!v.isBoolean()) {
      throw bad(key, "true or false", v);
    }
    return v.asBoolean();
  }

  /** A string, or a list of strings, as a list (empty when absent). */
  public List<String> strings(String key) {
    JsonNode v = json.get(key);
    List<String> out = new ArrayList<>();
    if (v == null || v.isNull()) {
      return out;
    }
    if (v.isTextual() && !v.asText().isEmpty()) {
      out.add(v.asText());
      return out;
    }
    if (v.isArray() && !v.isEmpty()) {
      for (JsonNode e : v) {
        if (!e.isTextual() || e.asText().isEmpty()) {
          throw bad(key, "a string or a list of strings", v);
        }
        out.add(e.asText());
      }
      return out;
    }
    throw bad(key, "a string or a non-empty list of strings", v);
  }

  /** An object of string values, in its order (empty when absent). */
  public Map<String, String> stringMap(String key) {
    JsonNode v = json.get(key);
    Map<String, String> out = new LinkedHashMap<>();
    if (v == null || v.isNull()) {
      return out;
    }
    if (!v.isObject()) {
      throw bad(key, "an object of strings", v);
    }
    for (var it = v.fields(); it.hasNext(); ) {
      var e = it.next();
      if (!e.getValue().isTextual()) {
        throw bad(key, "an object of strings", v);
      }
      out.put(e.getKey(), e.getValue().asText());
    }
    return out;
  }

  /** An error about option {@code key}. */
  public IllegalArgumentException problem(String key, String what) {
    return new IllegalArgumentException("format '" + format + "': option '" + key + "' " + what);
  }

  private IllegalArgumentException bad(String key, String expected, JsonNode got) {
    return problem(key, "must be " + expected + ", got " + got);
  }

  /** The options as canonical JSON (keys sorted): equal options, equal text. */
  public String canonical() {
    try {
      return CANONICAL.writeValueAsString(CANONICAL.treeToValue(json, Object.class));
    } catch (com.fasterxml.jackson.core.JsonProcessingException e) {
      throw new IllegalStateException(e);
    }
  }

  @Override
  public String toString() {
    return json.toString();
  }
}
