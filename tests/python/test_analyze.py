"""``unstall analyze``: the model on known answers, one complete run against real sidecars, and bad
input (a failing command, a command that never uses the shim, more steps than an epoch has, a dataset
larger than the cache) that ends with a clear message and no claimed results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from unstall.analyze import model
from unstall.analyze.model import Run
from unstall.cli import parse_size
from datagen import make_tfrecord_shards

SIZE = 4096


def runs(t1: float, t3: float, t2: float, n: int = 10, b: int = 8, w: int = 0, **cached) -> dict:
    return {m: Run(mode=m, steps=n, batch_size=b, num_workers=w, elapsed_s=t, **(cached if m == "cached" else {}))
            for m, t in (("synthetic", t1), ("cached", t3), ("cold", t2))}


# -- the model -------------------------------------------------------------------------------------
# Per batch of 8 samples of 4096 bytes: step g = 30 ms, prep Q = 40 ms, storage s = 100 ms at 327680 B/s.
G, Q, S, N, B = 0.030, 0.040, 0.100, 10, 8
BW = B * SIZE / S


def test_blocking_storage_without_workers_adds_up() -> None:
    a = model.analyze(runs(N * G, N * (G + Q), N * (G + Q + S)), dataset_bytes=100 * SIZE, num_samples=100,
                      storage_Bps=BW)
    assert a.storage_model == "blocking"
    assert a.ingestion_rate == pytest.approx(B / G) and a.prep_rate == pytest.approx(B / (G + Q))
    assert a.fetch_rate == pytest.approx(B / S)
    assert a.fetch_stall_fraction == pytest.approx(S / (G + Q + S))
    assert a.prep_stall_fraction == pytest.approx(Q / (G + Q + S))
    assert a.compute_fraction + a.prep_stall_fraction + a.fetch_stall_fraction == pytest.approx(1)
    assert a.predict(0.3) == pytest.approx(B / (G + Q + 0.7 * S))
    assert a.predict(1.0) == pytest.approx(B / (G + Q))
    assert a.predict(0.0, 2) == pytest.approx(B / max(G, (Q + S) / 2, S))


def test_overlapped_storage_is_a_stage_of_its_own() -> None:
    a = model.analyze(runs(N * G, N * (G + Q), N * max(G + Q, S)), dataset_bytes=100 * SIZE, num_samples=100,
                      storage_Bps=BW)
    assert a.storage_model == "overlapped"
    assert a.fetch_stall_fraction == pytest.approx((S - G - Q) / S)
    assert a.predict(0.2) == pytest.approx(B / max(G + Q, 0.8 * S))
    assert a.predict(0.5) == pytest.approx(B / (G + Q))  # storage no longer the bottleneck
    assert a.predict(0.0, 4) == pytest.approx(B / S)


def test_workers_prep_bound_when_cached() -> None:
    w = 2  # cached: the workers need Q/2 = 60 ms > g per batch
    q = 0.120
    a = model.analyze(runs(N * G, N * q / w, N * max(q / w, S), w=w), dataset_bytes=100 * SIZE, num_samples=100,
                      storage_Bps=BW)
    assert a.loader_busy_per_batch_s == pytest.approx(q)
    assert a.predict(1.0, 4) == pytest.approx(B / max(G, q / 4))
    assert a.predict(0.5, 2) == pytest.approx(B / max(q / 2, 0.5 * S))
    # Prep that computes shares the machine's 2 cores: 4 workers go no faster than 2; prep that waits scales on.
    cpu_bound = runs(N * G, N * q / w, N * max(q / w, S), w=w, prep_s=N * q, prep_cpu_s=N * q, prepped_samples=N * B)
    two = model.analyze(cpu_bound, dataset_bytes=100 * SIZE, num_samples=100, storage_Bps=BW, cores=2)
    assert two.prep_cpu_per_batch_s > 0
    assert two.predict(1.0, 4) == pytest.approx(B / max(G, q / 4, two.prep_cpu_per_batch_s / 2))
    assert two.predict(1.0, 4) < a.predict(1.0, 4)
    waiting = model.analyze(runs(N * G, N * q / w, N * max(q / w, S), w=w, prep_s=N * q, prepped_samples=N * B),
                            dataset_bytes=100 * SIZE, num_samples=100, storage_Bps=BW, cores=2)
    assert waiting.predict(1.0, 4) == pytest.approx(a.predict(1.0, 4))


def test_without_a_prep_stall_the_loader_work_is_its_counted_time() -> None:
    # 1 worker hides the loader behind the 30 ms step; the counters say 2 ms per sample (8 samples per batch).
    torch_like = runs(N * G, N * G, N * G, w=1, fetch_s=0.5, prep_s=1.1, fetched_samples=800, prepped_samples=800)
    tf_like = runs(N * G, N * G, N * G, w=1, fetch_s=1.6, fetched_samples=800)  # prep in tf.data's threads: untimed
    for r in (torch_like, tf_like):
        a = model.analyze(r, dataset_bytes=100 * SIZE, num_samples=100)
        assert a.loader_busy_per_batch_s == pytest.approx(B * 0.002)


def test_cheapest_configuration() -> None:
    a = model.analyze(runs(N * G, N * (G + Q), N * max(G + Q, S)), dataset_bytes=100 * SIZE, num_samples=100,
                      storage_Bps=BW, prices={"core_hour": 1.0, "gib_hour": 1.0})
    c = a.cheapest
    # With 0 workers the loader stage g+Q never reaches the ingestion rate; 1 worker hides Q (40 ms > 30 ms: no),
    # 2 workers do (20 ms), and then storage must drop to <= 31.5 ms: 70% cached.
    assert (c["found"], c["stalled_now"], c["workers"], c["cache_fraction"]) == (True, True, 2, 0.7)
    assert c["samples_per_s"] >= a.ingestion_rate / 1.05
    assert c["cost_per_hour"] == pytest.approx(2 + 0.7 * 100 * SIZE / 2**30)


def test_runs_must_agree() -> None:
    r = runs(1, 2, 3)
    r["cold"] = Run(mode="cold", steps=N, batch_size=4, num_workers=0, elapsed_s=3)
    with pytest.raises(ValueError, match="not deterministic"):
        model.analyze(r, 100, 10)


@pytest.mark.parametrize("text, n", [("4GiB", 4 << 30), ("512MiB", 512 << 20), ("100MB", 100_000_000), ("12345", 12345)])
def test_parse_size(text: str, n: int) -> None:
    assert parse_size(text) == n


# -- the command -----------------------------------------------------------------------------------

JOB = """
import os, time
from unstall.torch import DataLoader, Dataset

def keep(b):
    return b

if __name__ == "__main__":
    ds = Dataset("job", root=os.environ["JOB_DATA"], format="tfrecord")
    for _ in DataLoader(ds, batch_size=4, shuffle=True, seed=0, collate_fn=keep):
        time.sleep(0.005)
"""


@pytest.fixture
def job(tmp_path: Path, sidecar_jar: Path):
    make_tfrecord_shards(tmp_path / "data", shards=2, per_shard=16, size=SIZE, seed=5)  # 32 samples: 8 batches
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = {**os.environ, "JOB_DATA": str(tmp_path / "data"), "UNSTALL_SIDECAR_JAR": str(sidecar_jar),
           "UNSTALL_PROGRESS": "0"}
    return script, env


def analyze(tmp_path: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "unstall", "analyze", "--out", str(tmp_path / "out"), *args],
                          env=env, capture_output=True, text=True, timeout=600)


def test_a_complete_analysis(job, tmp_path: Path) -> None:
    script, env = job
    p = analyze(tmp_path, env, "--steps", "4", "--warmup", "1", "--max-cache", "1MiB", "--", str(script))
    assert p.returncode == 0, p.stderr
    out = tmp_path / "out"
    doc = json.loads((out / "analyze.json").read_text())
    assert doc["status"] == "ok" and [s["index"] for s in doc["sections"]] == [0]
    sec = doc["sections"][0]
    assert sec["status"] == "ok" and sec["kind"] == "torch.DataLoader" and sec["dataset"]["name"] == "job"
    assert (sec["dataset"]["num_samples"], sec["dataset"]["total_bytes"]) == (32, 32 * SIZE)
    r = sec["runs"]
    for mode in ("synthetic", "cached", "cold"):
        assert (r[mode]["steps"], r[mode]["warmup"], r[mode]["batch_size"], r[mode]["epoch_batches"]) == (4, 1, 4, 8)
    assert r["synthetic"]["work"]["fetch_samples"] == 0  # copies of the first batch: nothing fetched in the window
    assert r["cached"]["warm"]["used_bytes"] == 32 * SIZE and r["cached"]["warm"]["capacity_bytes"] >= 32 * SIZE
    cached, cold = r["cached"]["sidecar"], r["cold"]["sidecar"]
    assert cached["misses"] == 0 and cached["hits"] > 0 and cached["storage_bytes"] == 0
    assert cold["hits"] == 0 and cold["misses"] > 0 and cold["storage_bytes"] == cold["misses"] * SIZE
    a = sec["analysis"]
    assert a["compute_fraction"] + a["prep_stall_fraction"] + a["fetch_stall_fraction"] == pytest.approx(1)
    assert [p["cache_fraction"] for p in a["cache_curve"]] == [i / 20 for i in range(21)]
    assert (out / "analyze.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (out / "analyze.txt").read_text()
    assert "fetch stall" in text and "ingestion rate" in text and text in p.stdout


def assert_failed(p: subprocess.CompletedProcess, out: Path, *needles: str) -> dict:
    assert p.returncode == 2, p.stdout + p.stderr
    for needle in needles:
        assert needle in p.stderr
    doc = json.loads((out / "analyze.json").read_text())
    assert doc["status"] == "failed" and "analysis" not in doc and "runs" not in doc
    assert not (out / "analyze.txt").exists() and not (out / "analyze.png").exists()
    return doc


def test_a_failing_command(job, tmp_path: Path) -> None:
    _, env = job
    bad = tmp_path / "bad.py"
    bad.write_text("print('loading...')\nraise RuntimeError('boom: no GPU found')\n")
    p = analyze(tmp_path, env, "--steps", "2", "--", str(bad))
    doc = assert_failed(p, tmp_path / "out", "failed with exit status 1 in the synthetic run",
                        "RuntimeError: boom: no GPU found")
    assert doc["completed_runs"] == []


def test_a_command_that_never_uses_the_shim(job, tmp_path: Path) -> None:
    _, env = job
    plain = tmp_path / "plain.py"
    plain.write_text("import torch\nprint(torch.ones(2).sum())\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "analyze.txt").write_text("an older run's results")  # must not survive a failed run
    (tmp_path / "out" / "analyze.png").write_bytes(b"old")
    p = analyze(tmp_path, env, "--steps", "2", "--", str(plain))
    assert_failed(p, tmp_path / "out", "exited with status 0", "never used the unstall shim")


def test_more_steps_than_an_epoch(job, tmp_path: Path) -> None:
    script, env = job
    p = analyze(tmp_path, env, "--steps", "10", "--warmup", "2", "--", str(script))
    assert_failed(p, tmp_path / "out", "2 warm-up + 10 timed steps = 12 batches, but an epoch of this torch.DataLoader "
                                       "has only 8 (32 samples, batch size 4); use --steps 6 or fewer")


def test_a_dataset_larger_than_the_cache(job, tmp_path: Path) -> None:
    script, env = job
    p = analyze(tmp_path, env, "--steps", "2", "--max-cache", "64KiB", "--", str(script))
    doc = assert_failed(p, tmp_path / "out", "the cached run stopped", f"({32 * SIZE} bytes) does not fit",
                        "(65536 bytes)")
    assert doc["completed_runs"] == ["synthetic"]
