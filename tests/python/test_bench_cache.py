"""benchmarks/bench_cache.py at toy size through real sidecars: every row printed, the JSON complete, each row's
counters what its cache and order make them. What the timings measure is not checked: a toy run on a shared CPU
measures nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "bench_cache.py"

ROWS = ["minio", "lru", "minio-ahead", "minio-cache-first"]


@pytest.mark.slow
def test_toy_run_prints_every_row_and_writes_them_as_json(sidecar_jar: Path, tmp_path: Path) -> None:
    out = tmp_path / "cache.json"
    env = dict(os.environ, UNSTALL_SIDECAR_JAR=str(sidecar_jar), UNSTALL_HOME=str(tmp_path / "home"))
    run = subprocess.run([sys.executable, str(BENCH), "--toy", "--caches", "minio-cache-first,lru,minio-ahead",
                          "--cache-dir", str(tmp_path / "data"), "--json", str(out)], capture_output=True, text=True,
                         env=env, stdin=subprocess.DEVNULL, timeout=900)  # a bound on a hang, not on the speed
    assert run.returncode == 0, f"bench_cache.py --toy exited {run.returncode}:\n{run.stderr[-4000:]}"

    doc = json.loads(out.read_text())
    rows = {r["key"]: r for r in doc["rows"]}
    assert [r["key"] for r in doc["rows"]] == ["minio", "minio-cache-first", "lru", "minio-ahead"], \
        "MinIO first, then the rows asked for in their order"
    assert set(rows) == set(ROWS)
    epochs, n = doc["settings"]["epochs"], rows["minio"]["samples"]
    for r in doc["rows"]:
        assert len(r["epoch_s"]) == len(r["storage_bytes"]) == len(r["spearman"]) == epochs
        assert f"| {r['label']} |" in run.stdout, r["label"]
        assert r["storage_bytes"][0] == doc["dataset_bytes"], f"{r['key']}: a cold epoch reads every sample once"
    for key in ("minio", "minio-ahead", "minio-cache-first"):
        hits = rows[key]["hits"]
        assert 0 < hits[1] < n and hits[1:] == sorted(hits[1:]), f"{key}: MinIO holds part of the dataset, for good"
        assert all(b < doc["dataset_bytes"] for b in rows[key]["storage_bytes"][1:]), f"{key}: hits read nothing"
    assert rows["minio"]["read_ahead"] == [0] * epochs, "no plan, nothing read ahead"
    assert rows["minio"]["spearman"] == rows["minio-ahead"]["spearman"] == [1.0] * epochs
    spearman = rows["minio-cache-first"]["spearman"]
    assert spearman[0] == 1.0 and all(0 < s < 1 for s in spearman[1:]), "reordered once the cache holds samples"
    for head in ("- command: ", "- date: ", "- machine: ", "- commit: "):
        assert any(line.startswith(head) for line in run.stdout.splitlines()), head
    assert doc["settings"]["toy"] is True
