"""Stall observation in the shim: loader.stats() and the epoch line against the sidecar's own counters,
spans (in-memory exporter) with the agent's names, and tracing that stays off without OTel."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from unstall import tracing
from unstall.errors import DataFileNotFoundError
from unstall.torch import DataLoader, Dataset
from batches import keep
from datagen import make_tfrecord_shards

SIZE = 4096
N = 16
K = 5  # cache slots


@pytest.fixture
def no_otel_env(monkeypatch: pytest.MonkeyPatch):
    for var in ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SERVICE_NAME", "UNSTALL_TRACING"):
        monkeypatch.delenv(var, raising=False)
    tracing.reset_tracer()
    yield monkeypatch
    tracing.reset_tracer()


@pytest.fixture
def memory_spans(no_otel_env):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    no_otel_env.setattr(tracing, "_tracer", tracing.StallTracer(provider.get_tracer(tracing.SCOPE), provider))
    no_otel_env.setattr(tracing, "_tracer_pid", __import__("os").getpid())
    yield exporter, provider


@pytest.mark.parametrize("env, enabled", [
    ({}, False),  # the SDK is installed, but nothing asks for spans
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SDK_DISABLED": "true"}, False),
    ({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_EXPORTER": "none"}, False),
    ({"OTEL_SERVICE_NAME": "x", "UNSTALL_TRACING": "0"}, False),
    ({"UNSTALL_TRACING": "1", "OTEL_TRACES_EXPORTER": "console"}, True),
])
def test_tracing_is_on_only_when_asked(no_otel_env, env, enabled) -> None:
    for k, v in env.items():
        no_otel_env.setenv(k, v)
    assert tracing.stall_tracer().enabled is enabled


def test_without_the_sdk_no_spans_and_no_crash(no_otel_env, start_sidecar, tmp_path: Path) -> None:
    no_otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    for mod in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        no_otel_env.delitem(sys.modules, mod)
    no_otel_env.setitem(sys.modules, "opentelemetry", None)  # "not installed": import raises ImportError
    assert tracing.stall_tracer().enabled is False
    make_tfrecord_shards(tmp_path / "r", shards=1, per_shard=4, size=SIZE, seed=1)
    ds = Dataset("nootel", root=tmp_path / "r", format="tfrecord", sidecar=start_sidecar("1MiB"))
    assert sum(len(b) for b in DataLoader(ds, batch_size=2, collate_fn=keep)) == 4


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stats_and_epoch_line_match_the_sidecar(no_otel_env, start_sidecar, tmp_path: Path, caplog,
                                                num_workers: int) -> None:
    make_tfrecord_shards(tmp_path / "r", shards=2, per_shard=N // 2, size=SIZE, seed=2)
    sidecar = start_sidecar(cache_capacity=K * SIZE)
    ds = Dataset("st", root=tmp_path / "r", format="tfrecord", sidecar=sidecar)
    loader = DataLoader(ds, batch_size=4, shuffle=True, seed=0, num_workers=num_workers,
                        persistent_workers=num_workers > 0, collate_fn=keep)
    caplog.set_level(logging.INFO, logger="unstall")
    for _ in range(2):
        assert sum(len(b) for b in loader) == N
    st = loader.stats()
    assert (st.epoch, st.batches, st.samples_fetched, st.bytes_fetched) == (1, 4, N, N * SIZE)
    assert (st.cache_hits, st.cache_misses, st.storage_bytes, st.cache_bytes) == (K, N - K, (N - K) * SIZE, K * SIZE)
    assert st.wait_s + st.step_s == pytest.approx(st.elapsed_s, abs=1e-6)
    assert 0 < st.stall_fraction <= 1 and st.fetch_s > 0
    assert st.stall_fetch_s + st.stall_prep_s == pytest.approx(st.wait_s)
    total = st.total
    assert (total.batches, total.samples_fetched, total.bytes_fetched) == (8, 2 * N, 2 * N * SIZE)
    assert (total.cache_hits, total.cache_misses, total.storage_bytes) == (K, 2 * N - K, (2 * N - K) * SIZE)
    lines = [r.getMessage() for r in caplog.records if r.name == "unstall"]
    assert len(lines) == 2
    assert lines[0].startswith("unstall: epoch 0: 4 batches in ") and "cache 0/16 hits (0%)" in lines[0]
    assert lines[1].startswith("unstall: epoch 1: 4 batches in ") and f"cache {K}/16 hits (31%)" in lines[1]
    assert f"{(N - K) * SIZE / 1e6:.1f} MB from storage" in lines[1]


def test_spans_carry_the_agents_names(memory_spans, start_sidecar, tmp_path: Path) -> None:
    exporter, provider = memory_spans
    make_tfrecord_shards(tmp_path / "r", shards=1, per_shard=8, size=SIZE, seed=3)
    ds = Dataset("spans", root=tmp_path / "r", format="tfrecord", sidecar=start_sidecar("1MiB"))
    loader = DataLoader(ds, batch_size=3, collate_fn=keep)  # batches of 3, 3, 2
    app = provider.get_tracer("app")
    with app.start_as_current_span("train") as train:
        for _ in loader:
            pass
    spans = exporter.get_finished_spans()
    stalls = [s for s in spans if s.name == "unstall.stall"]
    steps = [s for s in spans if s.name == "unstall.step"]
    assert len(stalls) == 3 and len(steps) == 3  # one step after each batch, the last ends at StopIteration
    for i, (s, n) in enumerate(zip(stalls, (3, 3, 2))):
        a = s.attributes
        assert s.instrumentation_scope.name == "io.unstall.shim"
        assert a["unstall.stall.duration_ns"] == s.end_time - s.start_time
        assert (a["unstall.io.bytes"], a["unstall.io.process_bytes"], a["unstall.io.read_calls"]) == (n * SIZE, n * SIZE, 1)
        assert 0 < a["unstall.io.read_time_ns"] <= a["unstall.stall.duration_ns"]
        assert a["unstall.iterator.class"] == "unstall.torch.DataLoader" and a["unstall.iterator.method"] == "__next__"
        assert (a["unstall.batch.index"], a["unstall.epoch"], a["unstall.dataset"]) == (i, 0, "spans")
        assert a["thread.name"] == "MainThread" and a["thread.id"] > 0
        assert s.parent is not None and s.parent.span_id == train.get_span_context().span_id
    assert [s.attributes["unstall.step.duration_ns"] == s.end_time - s.start_time for s in steps] == [True] * 3
    assert all(st.start_time >= sl.end_time for sl, st in zip(stalls, steps))


def test_a_failed_wait_is_an_error_span_and_the_error_reaches_the_loop(memory_spans, start_sidecar, tmp_path: Path) -> None:
    exporter, _ = memory_spans
    make_tfrecord_shards(tmp_path / "r", shards=1, per_shard=4, size=SIZE, seed=4)
    ds = Dataset("gone", root=tmp_path / "r", format="tfrecord", sidecar=start_sidecar("0"))
    (tmp_path / "r" / "part-00000.tfrecord").unlink()
    with pytest.raises(DataFileNotFoundError):
        for _ in DataLoader(ds, batch_size=2, collate_fn=keep):
            pass
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "unstall.stall"]
    assert span.attributes["exception.type"] == "DataFileNotFoundError"
    assert span.status.status_code.name == "ERROR"
