package io.unstall.agent;

import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Agent options from {@code -javaagent:unstall-agent.jar=key=value,key2=value2}. Keys that may
 * repeat ({@code method}, {@code exclude}) accumulate. Keys starting with {@code otel.} are passed
 * to the OpenTelemetry SDK as defaults (system properties and OTEL_* variables still win).
 */
public final class AgentOptions {
  /** Next-batch methods instrumented by default, as {@code type#method} (type or any supertype). */
  public static final List<String> BUILTIN_METHODS =
      List.of(
          "org.nd4j.linalg.dataset.api.iterator.DataSetIterator#next",
          "org.nd4j.linalg.dataset.api.iterator.MultiDataSetIterator#next",
          "ai.djl.training.dataset.DataIterable#next");

  final List<String> methods = new ArrayList<>();
  final List<String> excludes = new ArrayList<>();
  final Map<String, String> otel = new LinkedHashMap<>();
  boolean builtinMethods = true;
  boolean io = true;
  boolean tracing = true;
  /** Path prefix of the profile files (.json and .txt appended), or null for none. */
  String profile;
  long profileIntervalSeconds;
  String spansFile;
  boolean debug;
  /** Test hook: the n-th stall (1-based) throws inside the agent; 0 = never. */
  long failAtStall;

  private AgentOptions() {}

  public static AgentOptions parse(String args) {
    AgentOptions o = new AgentOptions();
    o.profile = "unstall-profile-" + ProcessHandle.current().pid();
    if (args == null || args.isBlank()) {
      return o;
    }
    for (String part : args.split(",")) {
      String item = part.trim();
      if (item.isEmpty()) {
        continue;
      }
      int eq = item.indexOf('=');
      String key = eq < 0 ? item : item.substring(0, eq).trim();
      String value = eq < 0 ? "true" : item.substring(eq + 1).trim();
      o.set(key, value);
    }
    return o;
  }

  private void set(String key, String value) {
    switch (key) {
      case "method":
        if (!value.contains("#")) {
          throw new IllegalArgumentException("method must be type#method, got " + value);
        }
        methods.add(value);
        break;
      case "builtin.methods":
        builtinMethods = Boolean.parseBoolean(value);
        break;
      case "io":
        io = Boolean.parseBoolean(value);
        break;
      case "tracing":
        tracing = Boolean.parseBoolean(value);
        break;
      case "exclude":
        excludes.add(value);
        break;
      case "profile":
        profile = value.equals("off") || value.isEmpty() ? null : value;
        break;
      case "profile.interval":
        profileIntervalSeconds = Long.parseLong(value);
        break;
      case "spans.file":
        spansFile = value;
        break;
      case "debug":
        debug = Boolean.parseBoolean(value);
        break;
      case "test.fail_at_stall":
        failAtStall = Long.parseLong(value);
        break;
      default:
        if (key.startsWith("otel.")) {
          otel.put(key, value);
        } else {
          throw new IllegalArgumentException("unknown agent option '" + key + "'");
        }
    }
  }

  /** All next-batch methods to instrument: built-ins (unless disabled) then the user's. */
  public List<String> allMethods() {
    List<String> all = new ArrayList<>();
    if (builtinMethods) {
      all.addAll(BUILTIN_METHODS);
    }
    all.addAll(methods);
    return Collections.unmodifiableList(all);
  }

  public List<String> excludes() {
    return Collections.unmodifiableList(excludes);
  }

  public Map<String, String> otelProperties() {
    return Collections.unmodifiableMap(otel);
  }

  public String profile() {
    return profile;
  }

  public String spansFile() {
    return spansFile;
  }

  public long profileIntervalSeconds() {
    return profileIntervalSeconds;
  }

  public boolean io() {
    return io;
  }

  public boolean tracing() {
    return tracing;
  }

  public boolean debug() {
    return debug;
  }

  public long failAtStall() {
    return failAtStall;
  }
}
