package io.unstall.agent.trace;

import io.opentelemetry.api.common.AttributeKey;
import io.opentelemetry.sdk.common.CompletableResultCode;
import io.opentelemetry.sdk.trace.data.SpanData;
import io.opentelemetry.sdk.trace.export.SpanExporter;
import io.unstall.agent.profile.Json;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.Collection;
import java.util.Map;

/**
 * Writes each finished span as one JSON object per line ({@code spans.file=PATH}). Used by the
 * agent's integration tests and handy for offline inspection; OTLP export is unaffected.
 */
public final class JsonLinesSpanExporter implements SpanExporter {
  private final OutputStream out;

  public JsonLinesSpanExporter(String path) throws IOException {
    this.out = new FileOutputStream(path, true);
  }

  @Override
  public synchronized CompletableResultCode export(Collection<SpanData> spans) {
    try {
      for (SpanData s : spans) {
        out.write(toJson(s).getBytes(StandardCharsets.UTF_8));
        out.write('\n');
      }
      out.flush();
      return CompletableResultCode.ofSuccess();
    } catch (IOException e) {
      return CompletableResultCode.ofFailure();
    }
  }

  static String toJson(SpanData s) {
    Json j = new Json();
    j.beginObject();
    j.field("name", s.getName());
    j.field("traceId", s.getTraceId());
    j.field("spanId", s.getSpanId());
    j.field("parentSpanId", s.getParentSpanContext().isValid() ? s.getParentSpanId() : null);
    j.field("startEpochNanos", s.getStartEpochNanos());
    j.field("endEpochNanos", s.getEndEpochNanos());
    j.field("status", s.getStatus().getStatusCode().name());
    j.field("scope", s.getInstrumentationScopeInfo().getName());
    j.key("resource").beginObject();
    for (Map.Entry<AttributeKey<?>, Object> e : s.getResource().getAttributes().asMap().entrySet()) {
      j.field(e.getKey().getKey(), e.getValue());
    }
    j.endObject();
    j.key("attributes").beginObject();
    for (Map.Entry<AttributeKey<?>, Object> e : s.getAttributes().asMap().entrySet()) {
      j.field(e.getKey().getKey(), e.getValue());
    }
    j.endObject();
    j.endObject();
    return j.toString();
  }

  @Override
  public CompletableResultCode flush() {
    return CompletableResultCode.ofSuccess();
  }

  @Override
  public synchronized CompletableResultCode shutdown() {
    try {
      out.close();
    } catch (IOException ignored) {
      // nothing to do
    }
    return CompletableResultCode.ofSuccess();
  }
}
