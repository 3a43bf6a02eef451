"""examples/torchrun/run.sh as a user runs it: two torchrun "nodes" x 2 ranks on this machine, each node's ranks
sharing one sidecar (its own UNSTALL_HOME), the two sidecars joined into one partitioned cache on 127.0.0.2 and
127.0.0.3. Real torchrun, real gloo DDP, real sidecar processes and Hazelcast."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

from datagen import make_image_folder

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "examples" / "torchrun" / "run.sh"
CLASSES = ["a", "b", "c", "d"]
PER_CLASS = 16
EPOCHS = 2
WORLD = 4


def free_port(*hosts: str) -> int:
    """A port free on every one of ``hosts`` just now (the sidecars bind it moments later)."""
    while True:
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = int(s.getsockname()[1])
        try:
            for h in hosts[1:]:
                with socket.socket() as t:
                    t.bind((h, port))
            return port
        except OSError:
            continue


def test_two_torchrun_nodes_share_a_partitioned_cache_and_see_every_sample_once(
    sidecar_jar: Path, tmp_path: Path
) -> None:
    data, out, work = tmp_path / "data", tmp_path / "ids", tmp_path / "work"
    make_image_folder(data, CLASSES, PER_CLASS, seed=5, extras=False)
    labels = [c for c, cls in enumerate(CLASSES) for _ in sorted((data / cls).iterdir())]
    out.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("UNSTALL_SIDECAR", "UNSTALL_TOKEN", "UNSTALL_CONTROL_PORT", "UNSTALL_HOME", "RANK",
                        "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHON=sys.executable, WORK=str(work), EPOCHS=str(EPOCHS), UNSTALL_SIDECAR_JAR=str(sidecar_jar),
               RDZV_PORT=str(free_port("127.0.0.1")), CLUSTER_PORT=str(free_port("127.0.0.2", "127.0.0.3")),
               CLUSTER_NAME=f"unstall-torchrun-test-{os.getpid()}")
    done = subprocess.run(["bash", str(RUN), str(data), "--", "--ids-dir", str(out), "--peer-port", "0",
                           "--workers", "1", "--batch-size", "8", "--cache-capacity", "4MiB"],
                          env=env, capture_output=True, text=True, timeout=240)
    logs = done.stdout[-4000:] + done.stderr[-6000:]
    assert done.returncode == 0, logs

    for epoch in range(EPOCHS):
        shards = [json.loads((out / f"rank{r}-epoch{epoch}.json").read_text()) for r in range(WORLD)]
        # The ranks together drew every sample exactly once, and each got the labels of what it drew, in order.
        assert Counter(i for s in shards for i in s["ids"]) == Counter(range(len(labels))), epoch
        for s in shards:
            assert s["labels"] == [labels[i] for i in s["ids"]]
    # One sidecar per node, shared by its two ranks (one started it), two nodes, one cluster of two members.
    sidecars = [json.loads((out / f"rank{r}-sidecar.json").read_text()) for r in range(WORLD)]
    assert sidecars[0]["pid"] == sidecars[1]["pid"] != sidecars[2]["pid"] == sidecars[3]["pid"], sidecars
    assert [s["started"] for s in sidecars[:2]].count(True) == 1 and [s["started"] for s in sidecars[2:]].count(True) == 1
    nodes = [json.loads((out / f"node-rank{r}.json").read_text()) for r in (0, 2)]
    assert [n["members"] for n in nodes] == [2, 2], nodes
    for n, first in zip(nodes, (0, 2)):  # each node's sidecar lists its own two ranks' sessions, by rank
        assert [name.split(" pid ")[0] for name in n["sessions"]] == [f"rank {first} local 0", f"rank {first + 1} local 1"]
    # The partitioned cache at work: each node read samples the other owns from it.
    assert all(sum(n["peer_hits"].values()) > 0 for n in nodes), nodes
