"""The stall spans' OpenTelemetry side for ``unstall.tracing``: the stable span and attribute names (the Java
agent's where the meaning is the same, docs/AGENT.md), and the tracer, imported lazily and only when enabled."""

from __future__ import annotations

import atexit
import logging
import os
from typing import Any, Dict, Optional



__all__ = [
    "STALL_SPAN",
    "STEP_SPAN",
    "SCOPE",
    "A_STALL_NS",
    "A_IO_BYTES",
    "A_IO_CALLS",
    "A_IO_TIME",
    "A_IO_PROCESS_BYTES",
    "A_ITER_CLASS",
    "A_ITER_METHOD",
    "A_THREAD_NAME",
    "A_THREAD_ID",
    "A_EXC_TYPE",
    "A_STEP_NS",
    "A_BATCH",
    "A_EPOCH",
    "A_DATASET",
    "A_WORKERS",
    "A_FETCH_NS",
    "A_PREP_NS",
    "tracing_wanted",
    "StallTracer",
    "build_tracer",
]

log = logging.getLogger("unstall")

# -- stable names: the agent's where the meaning is the same (docs/AGENT.md), then the shim's own ------
STALL_SPAN = "unstall.stall"
STEP_SPAN = "unstall.step"
SCOPE = "io.unstall.shim"
A_STALL_NS = "unstall.stall.duration_ns"
A_IO_BYTES = "unstall.io.bytes"  # bytes the waiting thread fetched during the wait (num_workers=0)
A_IO_CALLS = "unstall.io.read_calls"  # fetches (FETCH or DoGet) the waiting thread made during the wait
A_IO_TIME = "unstall.io.read_time_ns"  # time the waiting thread spent in those fetches
A_IO_PROCESS_BYTES = "unstall.io.process_bytes"  # bytes fetched by this process AND its workers during the wait
A_ITER_CLASS = "unstall.iterator.class"
A_ITER_METHOD = "unstall.iterator.method"
A_THREAD_NAME = "thread.name"
A_THREAD_ID = "thread.id"
A_EXC_TYPE = "exception.type"
A_STEP_NS = "unstall.step.duration_ns"
A_BATCH = "unstall.batch.index"
A_EPOCH = "unstall.epoch"
A_DATASET = "unstall.dataset"
A_WORKERS = "unstall.loader.num_workers"
A_FETCH_NS = "unstall.fetch.time_ns"  # fetch time, all processes, during the wait
A_PREP_NS = "unstall.prep.time_ns"  # loader+transform time, all processes, during the wait


# ---------------------------------------------------------------------------------------------
# OpenTelemetry, imported lazily and only when enabled


def _env_true(name: str) -> Optional[bool]:
    v = os.environ.get(name, "").strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    return None


def tracing_wanted() -> bool:
    """Whether the environment asks for spans (the SDK may still be missing)."""
    if _env_true("OTEL_SDK_DISABLED") or _env_true("UNSTALL_TRACING") is False:
        return False
    exporters = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters == "none":
        return False
    if _env_true("UNSTALL_TRACING"):
        return True
    return bool(
        exporters
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_SERVICE_NAME")
    )


class StallTracer:
    """Emits ``unstall.stall`` / ``unstall.step`` spans with explicit timestamps, or nothing."""

    def __init__(self, tracer: Any = None, provider: Any = None) -> None:
        self._tracer = tracer
        self._provider = provider
        self._otel_context: Any = None
        self._otel_trace: Any = None
        if tracer is not None:
            from opentelemetry import context, trace

            self._otel_context, self._otel_trace = context, trace

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def span(self, name: str, start_ns: int, end_ns: int, attributes: Dict[str, Any],
             error: Optional[BaseException] = None) -> None:
        """One finished span. Its parent is the application's current span, if it has one."""
        if self._tracer is None:
            return
        try:
            span = self._tracer.start_span(name, context=self._otel_context.get_current(),
                                           start_time=start_ns, attributes=attributes)
            if error is not None:
                span.set_attribute(A_EXC_TYPE, type(error).__qualname__)
                span.set_status(self._otel_trace.Status(self._otel_trace.StatusCode.ERROR, str(error)[:200]))
            span.end(end_time=end_ns)
        except Exception as e:  # tracing must never break training
            log.warning("unstall: tracing failed (%s); spans are now off", e)
            self._tracer = None

    def flush(self, timeout_s: float = 10.0) -> None:
        if self._provider is not None:
            try:
                self._provider.force_flush(int(timeout_s * 1000))
            except Exception:
                pass

    def shutdown(self) -> None:
        provider, self._provider, self._tracer = self._provider, None, None
        if provider is not None:
            try:
                provider.shutdown()
            except Exception:
                pass


def build_tracer() -> StallTracer:
    if not tracing_wanted():
        return StallTracer()
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        log.info("unstall: OTEL_* is set but opentelemetry-sdk is not installed (pip install 'unstall[tracing]'); no spans")
        return StallTracer()
    # An application that configured its own SDK gets our spans in its pipeline.
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return StallTracer(current.get_tracer(SCOPE))
    exporters = [e.strip() for e in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(",") if e.strip()]
    provider = TracerProvider(resource=Resource.create(), shutdown_on_exit=False)
    for name in exporters:
        if name == "otlp":
            protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                                      os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"))
            try:
                if protocol == "grpc":
                    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
                else:
                    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            except ImportError:
                log.warning("unstall: no OTLP %s exporter installed (pip install 'unstall[tracing]'); no spans", protocol)
                continue
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        elif name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        else:
            log.warning("unstall: OTEL_TRACES_EXPORTER=%s is not supported here (otlp, console, none)", name)
    tracer = StallTracer(provider.get_tracer(SCOPE), provider)
    atexit.register(tracer.shutdown)  # flushes what is queued
    return tracer
