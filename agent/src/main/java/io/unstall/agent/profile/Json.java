package io.unstall.agent.profile;

import java.util.Map;

/** A minimal JSON writer (the agent ships no JSON library). */
public final class Json {
  private final StringBuilder sb = new StringBuilder();
  private boolean needComma;

  public Json beginObject() {
    comma();
    sb.append('{');
    needComma = false;
    return this;
  }

  public Json endObject() {
    sb.append('}');
    needComma = true;
    return this;
  }

  public Json beginArray() {
    comma();
    sb.append('[');
    needComma = false;
    return this;
  }

  public Json endArray() {
    sb.append(']');
    needComma = true;
    return this;
  }

  public Json key(String k) {
    comma();
    string(k);
    sb.append(':');
    needComma = false;
    return this;
  }

  public Json field(String k, Object v) {
    key(k);
    value(v);
    return this;
  }

  @SuppressWarnings("unchecked")
  public Json value(Object v) {
    comma();
    if (v == null) {
      sb.append("null");
    } else if (v instanceof Double || v instanceof Float) {
      double d = ((Number) v).doubleValue();
      sb.append(Double.isFinite(d) ? Double.toString(Math.round(d * 1e6) / 1e6) : "null");
    } else if (v instanceof Number || v instanceof Boolean) {
      sb.append(v);
    } else if (v instanceof Map) {
      sb.append('{');
      needComma = false;
      for (Map.Entry<String, Object> e : ((Map<String, Object>) v).entrySet()) {
        field(e.getKey(), e.getValue());
      }
      sb.append('}');
    } else if (v instanceof Iterable) {
      sb.append('[');
      needComma = false;
      for (Object o : (Iterable<Object>) v) {
        value(o);
      }
      sb.append(']');
    } else {
      string(v.toString());
    }
    needComma = true;
    return this;
  }

  private void comma() {
    if (needComma) {
      sb.append(',');
    }
  }

  private void string(String s) {
    sb.append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      switch (c) {
        case '"':
          sb.append("\\\"");
          break;
        case '\\':
          sb.append("\\\\");
          break;
        case '\n':
          sb.append("\\n");
          break;
        case '\r':
          sb.append("\\r");
          break;
        case '\t':
          sb.append("\\t");
          break;
        default:
          if (c < 0x20) {
            sb.append(String.format("\\u%04x", (int) c));
          } else {
            sb.append(c);
          }
      }
    }
    sb.append('"');
  }

  @Override
  public String toString() {
    return sb.toString();
  }
}
