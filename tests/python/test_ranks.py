"""One sidecar per host, shared by its local ranks: 4 DDP ranks (real torch.distributed, gloo on CPU) started at
the same instant with one ``UNSTALL_HOME`` each call ``unstall.Sidecar()``. Exactly one starts the sidecar, the
others attach (the start lock); each reads its ``DistributedSampler`` shard through ``unstall.torch.DataLoader``
with 2 workers in a session of its own, while a tiny ``DistributedDataParallel`` model trains (ddp_rank.py)."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
from torch.utils.data import DistributedSampler

from ranks import rank_env, run_ranks

WORLD = 4
SAMPLES = 64  # a multiple of WORLD: DistributedSampler pads nothing, so "exactly once" is exact
CLASSES = 4
EPOCHS = 2
SEED = 11


def make_dataset(root: Path) -> list[tuple[str, int]]:
    """SAMPLES random files of 1..4 KiB in an image-folder layout; (sha256, label) in torchvision's order."""
    rng = np.random.default_rng(3)
    for i in range(SAMPLES):
        p = root / f"class{i % CLASSES}" / f"img{i:03d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.integers(0, 256, int(rng.integers(1024, 4096)), dtype=np.uint8).tobytes())
    return [(hashlib.sha256(f.read_bytes()).hexdigest(), c)
            for c, d in enumerate(sorted(root.iterdir())) for f in sorted(d.iterdir())]


def torch_order(rank: int, epoch: int) -> list[int]:
    """What plain torch's DistributedSampler gives rank ``rank`` in ``epoch`` for the same seed."""
    sampler = DistributedSampler(range(SAMPLES), num_replicas=WORLD, rank=rank, shuffle=True, seed=SEED)
    sampler.set_epoch(epoch)
    return list(sampler)


def test_four_ddp_ranks_share_one_sidecar_each_in_its_own_session(sidecar_jar: Path, tmp_path: Path) -> None:
    files = make_dataset(tmp_path / "data")
    home, out = tmp_path / "home", tmp_path / "out"
    out.mkdir()
    # All four at once: the start lock decides which starts the sidecar.
    run_ranks("ddp_rank.py", [{"rank": rank, "world": WORLD, "rendezvous": str(tmp_path / "rendezvous"),
                               "root": str(tmp_path / "data"), "jar": str(sidecar_jar), "seed": SEED, "epochs": EPOCHS,
                               "batch_size": 4, "classes": CLASSES, "out": str(out)} for rank in range(WORLD)],
              rank_env(UNSTALL_HOME=str(home)), tmp_path)
    ranks = [json.loads((out / f"rank{k}.json").read_text()) for k in range(WORLD)]
    stats = json.loads((out / "stats.json").read_text())

    # Exactly one sidecar: one rank started it, all four used that very process, and only it served the home.
    assert sum(r["started"] for r in ranks) == 1, [(r["rank"], r["started"]) for r in ranks]
    assert {r["sidecar_pid"] for r in ranks} == {stats["state_pid"]}
    assert stats["serving"] == [stats["state_pid"]]
    assert {r["transport"] for r in ranks} == {"shm"}

    for epoch in range(EPOCHS):
        # Each rank's order is plain torch's DistributedSampler's for the same seed and epoch, with the files' bytes.
        for r in ranks:
            assert r["epochs"][epoch] == [list(files[i]) for i in torch_order(r["rank"], epoch)], (r["rank"], epoch)
        # Across the ranks (as all_gather_object saw them), every sample exactly once.
        for r in ranks:
            seen = Counter(d for shard in r["gathered"] for d in shard[epoch])
            assert seen == Counter(d for d, _ in files), (r["rank"], epoch)
    assert torch_order(0, 0) != torch_order(0, 1)  # the epochs differ: set_epoch reached the sampler

    # One session per rank, named by its rank, whose counters add up to the dataset's.
    sessions = {s["name"]: s for s in stats["sessions"].values()}
    assert len(sessions) == WORLD, sessions.keys()
    for r in ranks:
        s = stats["sessions"][str(r["session"])]
        assert s["name"] == f"rank {r['rank']} local {r['rank']} pid {r['pid']} DataLoader#1"
        assert s["transport"] == "shm"
        assert all(s["samples"][str(e)] == SAMPLES // WORLD for e in range(EPOCHS)), s
    for e in range(EPOCHS):
        assert sum(s["samples"][str(e)] for s in sessions.values()) == stats["dataset"][str(e)] == SAMPLES
    assert all(r["losses"] and all(np.isfinite(r["losses"])) for r in ranks)
