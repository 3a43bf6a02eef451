"""End to end: a PyTorch loop through the shim exports its stall spans over OTLP (configured only by
OTEL_* variables) to a real Jaeger, started here as the agent's JaegerTrainingIT starts it; the spans
are read back through Jaeger's HTTP API.

Jaeger: ``UNSTALL_JAEGER_BIN``, else ``${UNSTALL_CACHE:-~/.cache/unstall}/bin/jaeger``
(``bash scripts/install-jaeger.sh``). Missing Jaeger fails the test, as it fails the agent's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from unstall.torch import Dataset
from datagen import make_tfrecord_shards
from waits import wait_until

SIZE = 4096


def jaeger_binary() -> Path:
    configured = os.environ.get("UNSTALL_JAEGER_BIN")
    path = Path(configured) if configured else Path(os.environ.get("UNSTALL_CACHE", Path.home() / ".cache" / "unstall")) / "bin" / "jaeger"
    if not os.access(path, os.X_OK):
        pytest.fail(f"Jaeger is not installed at {path}: run `bash scripts/install-jaeger.sh` or set UNSTALL_JAEGER_BIN")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def jaeger_config(otlp_http: int, query_http: int, query_grpc: int) -> str:
    return f"""service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: 127.0.0.1:{query_http}
    grpc:
      endpoint: 127.0.0.1:{query_grpc}
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 10000
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{otlp_http}
processors:
  batch:
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
"""


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory: pytest.TempPathFactory):
    tmp_path = tmp_path_factory.mktemp("jaeger")
    ports = free_port(), free_port(), free_port()
    config = tmp_path / "jaeger.yaml"
    config.write_text(jaeger_config(*ports))
    log = open(tmp_path / "jaeger.log", "wb")
    proc = subprocess.Popen([str(jaeger_binary()), "--config", str(config)], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "OTEL_TRACES_EXPORTER": "none"})  # Jaeger's own telemetry
    query = f"http://127.0.0.1:{ports[1]}"

    def answers() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"Jaeger exited with {proc.returncode}: {(tmp_path / 'jaeger.log').read_text()[-2000:]}")
        try:
            get_json(query + "/api/services")
            return True
        except OSError:
            return False

    try:
        wait_until(answers, "Jaeger to answer on its query API", timeout=60, interval=0.2)
        yield f"http://127.0.0.1:{ports[0]}", query
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:  # in-memory storage: nothing to lose by not waiting for a drain
            proc.kill()
            proc.wait()
        log.close()


TRAINER = """
import sys, time
from unstall.torch import DataLoader, Dataset

def keep(b):
    return b

if __name__ == "__main__":
    loader = DataLoader(Dataset("jaeger"), batch_size=4, shuffle=True, seed=1, num_workers=int(sys.argv[1]),
                        collate_fn=keep)
    for epoch in range(2):
        for batch in loader:
            time.sleep(0.01)  # the step
    print(loader.stats().line())
"""


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stall_spans_reach_jaeger(jaeger, start_sidecar, tmp_path: Path, num_workers: int) -> None:
    otlp, query = jaeger
    make_tfrecord_shards(tmp_path / "r", shards=2, per_shard=6, size=SIZE, seed=9)  # 12 samples: 3 batches of 4
    sidecar = start_sidecar("1MiB")
    Dataset("jaeger", root=tmp_path / "r", format="tfrecord", sidecar=sidecar)
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    service = f"unstall-py-e2e-{os.getpid()}-w{num_workers}"
    env = {**os.environ, "OTEL_SERVICE_NAME": service, "OTEL_EXPORTER_OTLP_ENDPOINT": otlp,
           "OTEL_BSP_SCHEDULE_DELAY": "200", "UNSTALL_SIDECAR": sidecar.flight_location,
           "UNSTALL_TOKEN": sidecar.token, "UNSTALL_CONTROL_PORT": str(sidecar.control_port)}
    proc = subprocess.run([sys.executable, str(script), str(num_workers)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "unstall: epoch 1: 3 batches" in proc.stderr + proc.stdout

    def stalls_and_steps() -> tuple[list, list] | None:
        data = get_json(f"{query}/api/traces?service={service}&limit=1000").get("data") or []
        spans = [s for t in data for s in t["spans"]]
        stalls = [s for s in spans if s["operationName"] == "unstall.stall"]
        steps = [s for s in spans if s["operationName"] == "unstall.step"]
        return (stalls, steps) if len(stalls) >= 6 and len(steps) >= 6 else None

    stalls, steps = wait_until(stalls_and_steps, f"6 unstall.stall and 6 unstall.step spans of {service} in Jaeger",
                               timeout=60, interval=0.25)
    assert (len(stalls), len(steps)) == (6, 6)  # 2 epochs x 3 batches
    tags = [{t["key"]: t["value"] for t in s["tags"]} for s in stalls]
    assert sorted((t["unstall.epoch"], t["unstall.batch.index"]) for t in tags) == [(e, i) for e in (0, 1) for i in range(3)]
    for s, t in zip(stalls, tags):
        assert t["unstall.stall.duration_ns"] == s["duration"] * 1000 or abs(t["unstall.stall.duration_ns"] - s["duration"] * 1000) < 1000
        assert t["unstall.iterator.class"] == "unstall.torch.DataLoader"
        assert t["unstall.iterator.method"] == "__next__"
        assert t["unstall.dataset"] == "jaeger" and t["unstall.loader.num_workers"] == num_workers
        assert t["thread.name"] == "MainThread"
        if num_workers == 0:  # the waiting thread fetched the batch itself
            assert (t["unstall.io.bytes"], t["unstall.io.read_calls"]) == (4 * SIZE, 1)
        else:  # the workers did; the waiting thread read nothing
            assert (t["unstall.io.bytes"], t["unstall.io.read_calls"]) == (0, 0)
    if num_workers > 0:  # workers run ahead, so a wait may see more or fewer batches fetched, never other sizes
        assert sum(t["unstall.io.process_bytes"] for t in tags) % (4 * SIZE) == 0
    else:
        assert sum(t["unstall.io.process_bytes"] for t in tags) == 6 * 4 * SIZE
    processes = get_json(f"{query}/api/traces?service={service}&limit=1").get("data")[0]["processes"]
    assert any(p["serviceName"] == service for p in processes.values())
