"""``unstall profile merge`` on the profiles of three real JVM processes (ranks) with the Java agent attached:
every rank reads all of one file (flagged, with the exact bytes) and only its own slice of another (not flagged)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from unstall.sidecar import find_java

JAVA_SOURCE = Path(__file__).parent / "jvm" / "RankReader.java"
WORLD = 3
SHARED_BYTES = (3 << 20) + 123
SHARDED_BYTES = 3 << 20


def _compile(out: Path) -> Path:
    javac = Path(find_java()).with_name("javac")
    subprocess.run([str(javac), "-d", str(out), str(JAVA_SOURCE)], check=True, timeout=300)
    return out


def test_three_ranks_reading_the_same_file_are_flagged_with_the_exact_bytes(agent_jar: Path, tmp_path: Path) -> None:
    classes = _compile(tmp_path / "classes")
    shared = tmp_path / "shared.bin"
    sharded = tmp_path / "sharded.bin"
    shared.write_bytes(os.urandom(SHARED_BYTES))
    sharded.write_bytes(os.urandom(SHARDED_BYTES))
    profiles = tmp_path / "profiles"
    procs = []
    for rank in range(WORLD):
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD))
        procs.append(subprocess.Popen(
            [find_java(), "-Xshare:off", f"-javaagent:{agent_jar}=tracing=false,profile={profiles}/rank-{rank}",
             "-cp", str(classes), "RankReader", str(shared), str(sharded), str(rank), str(WORLD)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for rank, p in enumerate(procs):
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, f"rank {rank}: {out}\n{err}"
        assert f"rank {rank} read {SHARED_BYTES} + " in out, out

    merged = tmp_path / "merged"
    run = subprocess.run([sys.executable, "-m", "unstall", "profile", "merge", str(profiles), "--out", str(merged)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "[same_offsets_across_ranks]" in run.stdout
    doc = json.loads((tmp_path / "merged.json").read_text())
    assert [r["rank"] for r in doc["ranks"]] == ["0", "1", "2"]
    assert all(r["bytes"] > SHARED_BYTES for r in doc["ranks"])
    files = {f["path"]: f for f in doc["files"]}

    s = files[str(shared)]
    assert s["bytes_by_rank"] == {"0": SHARED_BYTES, "1": SHARED_BYTES, "2": SHARED_BYTES}
    assert s["union_bytes"] == SHARED_BYTES
    assert s["common_bytes"] == SHARED_BYTES
    assert s["overlap_bytes"] == SHARED_BYTES
    assert s["redundant_bytes"] == 2 * SHARED_BYTES
    assert s["lower_bound"] is False

    d = files[str(sharded)]
    assert sum(d["bytes_by_rank"].values()) == SHARDED_BYTES
    assert d["union_bytes"] == SHARDED_BYTES
    assert d["overlap_bytes"] == 0 and d["redundant_bytes"] == 0

    rules = {r["rule"]: r for r in doc["suggestions"]}
    assert set(rules) == {"same_offsets_across_ranks"}, rules
    ev = rules["same_offsets_across_ranks"]["evidence"]
    assert ev["ranks"] == WORLD
    assert ev["overlap_bytes"] == SHARED_BYTES
    assert ev["redundant_bytes"] == 2 * SHARED_BYTES
    assert ev["union_bytes"] == SHARED_BYTES + SHARDED_BYTES
    assert [f["path"] for f in ev["files"]] == [str(shared)]
    assert ev["files"][0]["common_bytes"] == SHARED_BYTES
