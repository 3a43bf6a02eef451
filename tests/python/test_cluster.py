"""The partitioned cache (CoorDL's partitioned MinIO) across three sidecars on three "hosts": network
namespaces on a bridge with tc-shaped links where permitted, loopback addresses otherwise (cluster_hosts.py;
the test's report says which ran). Each host runs a rank: a trainer process with its own sidecar, reading its
DistributedSampler shard. Real sidecar processes, a real Hazelcast cluster, real Flight between them (TLS and
the cluster token)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cluster_hosts import Hosts, make_cluster_certificate, netns_permitted
from cluster_rank import LINE_TIMEOUT, Rank, rank_argv

RANKS = 3
SAMPLES = 120  # 40 per rank, 5 batches of 8
BATCH = 8
EPOCHS = 5
KILL_EPOCH = 3  # rank 2's sidecar is SIGKILLed after 2 batches of this epoch


def make_dataset(root: Path) -> list[bytes]:
    """SAMPLES random files of 2..6 KiB in an image-folder layout, in torchvision's order (sorted names)."""
    rng = np.random.default_rng(7)
    out = []
    for i in range(SAMPLES):
        data = rng.integers(0, 256, int(rng.integers(2048, 6144)), dtype=np.uint8).tobytes()
        p = root / f"class{i % 3}" / f"img{i:04d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        out.append(data)
    return out


def storage_bytes(stats: list[dict[str, Any]], epoch: int) -> int:
    """What the cluster read from storage for an epoch: for each sidecar's own trainer and, as owner, for peers."""
    total = 0
    for s in stats:
        e = s["epochs"].get(str(epoch), {})
        total += e.get("storage_bytes", 0) + e.get("peer_storage_bytes", 0)
    return total


@pytest.mark.parametrize("mode", ["netns", "loopback"])
def test_three_hosts_share_one_partitioned_cache_and_survive_a_dead_sidecar(
    mode: str, tmp_path: Path, sidecar_jar: Path, record_property: Any
) -> None:
    """netns: three namespaces on a shaped bridge (skipped, saying so, where not permitted); loopback: the
    fallback, three 127.0.0.x addresses, run everywhere so that it keeps working."""
    if mode == "netns" and not netns_permitted():
        pytest.skip("network namespaces are not permitted here (needs root, ip and tc); the loopback variant ran")
    files = make_dataset(tmp_path / "data")
    dataset_bytes = sum(len(f) for f in files)
    max_sample = max(len(f) for f in files)
    capacity = dataset_bytes // 6  # a node owns about a third of the dataset: its cache fills
    expected = Counter(hashlib.sha256(f).hexdigest() for f in files)
    token = tmp_path / "cluster-token"
    token.write_text("cluster-" + os.urandom(16).hex() + "\n")
    token.chmod(0o600)
    with Hosts(RANKS, rate="1gbit", delay="1ms", mode=mode) as hosts:
        record_property("hosts", hosts.describe())
        print(f"\nhosts: {hosts.describe()}")
        cert, key = make_cluster_certificate(tmp_path, hosts.addresses)
        members = ",".join(f"{a}:5701" for a in hosts.addresses)
        ranks = []
        for k in range(RANKS):
            spec = {
                "rank": k, "ranks": RANKS, "home": str(tmp_path / f"home{k}"), "root": str(tmp_path / "data"),
                "dataset": "imgs", "jar": str(sidecar_jar), "cache_capacity": capacity, "memory_budget": "128MiB",
                "java_options": ["-Xmx256m"], "batch_size": BATCH, "epochs": EPOCHS,
                "pause_epoch": KILL_EPOCH, "pause_after": 2,
                "extra_args": ["--cluster-members", members, "--cluster-bind", hosts.addresses[k],
                               "--cluster-name", f"unstall-test-{os.getpid()}", "--cluster-token", str(token),
                               "--peer-tls-cert", str(cert), "--peer-tls-key", str(key), "--peer-tls-ca", str(cert)],
            }
            ranks.append(Rank(k, hosts.command(k, rank_argv(spec)), tmp_path / f"rank{k}.log"))
        try:
            for r in ranks:
                r.expect("READY")
            for r in ranks:
                r.go()
            before: dict[int, list[dict[str, Any]]] = {}  # each sidecar's counters when epoch e starts
            for e in range(EPOCHS + 1):
                for r in ranks:
                    r.expect(f"EPOCH {e}")
                for r in ranks:  # every rank is done with epoch e - 1: the counters hold still
                    r.go("stats")
                before[e] = [json.loads(r.expect("STATS ")) for r in ranks]
                if e == KILL_EPOCH + 1:
                    break  # rank 2's sidecar is a new one: its counters start again
                for r in ranks:
                    r.go()
                if e == KILL_EPOCH:
                    for r in ranks:
                        r.expect("PAUSED")
                    state = json.loads((tmp_path / "home2" / "sidecar.json").read_text())
                    os.kill(int(state["pid"]), signal.SIGKILL)  # a node's sidecar dies mid-epoch
                    for r in ranks:
                        r.go()
            for r in ranks:
                r.go()
            if EPOCHS > KILL_EPOCH + 1:
                for r in ranks:
                    r.expect(f"EPOCH {EPOCHS}")
                for r in ranks:
                    r.go()
            done = [json.loads(r.expect("DONE ")) for r in ranks]
            for r in ranks:
                assert r.proc.wait(timeout=LINE_TIMEOUT) == 0, f"rank {r.k} failed; log:\n{r.tail()}"
        finally:
            for r in ranks:
                r.stop()

    # Every epoch, the kill's included: each rank got its shard, all shards together are the dataset exactly
    # once, and every payload equals its file's bytes (the sha256 of what the loader yielded).
    for e in range(EPOCHS):
        got = Counter(h for d in done for h in d["epochs"][e])
        assert [len(d["epochs"][e]) for d in done] == [SAMPLES // RANKS] * RANKS
        assert got == expected, f"epoch {e}: not every sample exactly once with its file's bytes"
    assert sum(d["peer_hits"][1] for d in done) > 0, "loader.stats() shows the peer hits"

    # The first epoch reads the dataset once; later ones read only what no node caches.
    assert storage_bytes(before[1], 0) == dataset_bytes
    for e in (1, 2):
        cached = sum(s["used_bytes"] for s in before[e])
        assert storage_bytes(before[e + 1], e) == dataset_bytes - cached, f"epoch {e}"
        assert sum(s["epochs"][str(e)]["peer_hits"] for s in before[e + 1]) > 0, f"epoch {e}: no peer hits"
    # Aggregate cache = 3 x capacity: each sidecar filled its own (to within one sample) with the part it owns.
    for s in before[2]:
        assert s["capacity_bytes"] == capacity and capacity - max_sample < s["used_bytes"] <= capacity, s
    storage = storage_bytes(before[3], 2)
    assert abs(storage - (dataset_bytes - RANKS * capacity)) <= RANKS * max_sample, (
        f"epoch 2 read {storage} bytes from storage; dataset - 3 x capacity = {dataset_bytes - RANKS * capacity}")
