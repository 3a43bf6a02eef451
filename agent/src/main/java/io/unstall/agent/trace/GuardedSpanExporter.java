package io.unstall.agent.trace;

import io.opentelemetry.sdk.common.CompletableResultCode;
import io.opentelemetry.sdk.trace.data.SpanData;
import io.opentelemetry.sdk.trace.export.SpanExporter;
import io.unstall.agent.bootstrap.IoBridge;
import java.util.Collection;

/** Marks the exporting thread as agent code, so the export's own I/O is never recorded. */
public final class GuardedSpanExporter implements SpanExporter {
  private final SpanExporter delegate;

  public GuardedSpanExporter(SpanExporter delegate) {
    this.delegate = delegate;
  }

  @Override
  public CompletableResultCode export(Collection<SpanData> spans) {
    IoBridge.enterAgent();
    try {
      return delegate.export(spans);
    } finally {
      IoBridge.exitAgent();
    }
  }

  @Override
  public CompletableResultCode flush() {
    IoBridge.enterAgent();
    try {
      return delegate.flush();
    } finally {
      IoBridge.exitAgent();
    }
  }

  @Override
  public CompletableResultCode shutdown() {
    IoBridge.enterAgent();
    try {
      return delegate.shutdown();
    } finally {
      IoBridge.exitAgent();
    }
  }

  @Override
  public String toString() {
    return "GuardedSpanExporter{" + delegate + "}";
  }
}
