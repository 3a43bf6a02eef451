"""One local rank of test_ranks.py, started at the same instant as the others: ``python ddp_rank.py SPEC_JSON``.

It joins a gloo process group (a ``file://`` rendezvous), attaches to or starts the sidecar of the shared
``UNSTALL_HOME`` (``unstall.Sidecar()``: the start lock makes one of the ranks start it), reads ``epochs``
epochs of its ``DistributedSampler`` shard through ``unstall.torch.DataLoader`` with 2 workers while a tiny
DDP model trains on the samples, and writes ``rank<r>.json``: whether it started the sidecar and its pid,
its session, and every epoch's samples in the order it got them (sha256 of the bytes, label). Rank 0 also
writes ``stats.json`` (the sidecar's sessions) once every rank finished reading, before any closes.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

import unstall
from unstall.torch import DataLoader, Dataset

FEATURES = 16


def features(sample: bytes) -> tuple[str, torch.Tensor]:
    """The sample's digest (to check it) and its first bytes as features (to train on)."""
    head = torch.tensor(list(sample[:FEATURES]), dtype=torch.float32) / 255.0
    return hashlib.sha256(sample).hexdigest(), head


def serving(home: str) -> list[int]:
    """The pids of every sidecar process serving ``home`` (from /proc: what runs, not what a file says)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and b"--home" in argv and argv[argv.index(b"--home") + 1] == home.encode():
            pids.append(int(proc.name))
    return pids


def main(spec: dict[str, Any]) -> None:
    rank, world = int(spec["rank"]), int(spec["world"])
    out = Path(spec["out"])
    dist.init_process_group("gloo", init_method=f"file://{spec['rendezvous']}", rank=rank, world_size=world)
    sidecar = unstall.Sidecar(jar=spec["jar"], cache_capacity="16MiB", memory_budget="128MiB",
                              java_options=["-Xmx256m"], startup_timeout=120)  # UNSTALL_HOME: the shared home
    ds = Dataset("ranks", root=spec["root"], sidecar=sidecar, transform=features)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=spec["seed"])
    loader = DataLoader(ds, batch_size=spec["batch_size"], sampler=sampler, num_workers=2)
    model = DistributedDataParallel(nn.Linear(FEATURES, spec["classes"]))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    epochs: list[list[tuple[str, int]]] = []
    losses: list[float] = []
    for epoch in range(spec["epochs"]):
        sampler.set_epoch(epoch)  # the usual DDP loop: the sampler is told, the loader follows
        got: list[tuple[str, int]] = []
        for (digests, x), y in loader:
            got.extend(zip(digests, (int(t) for t in y)))
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()  # DDP all-reduces the gradients across the 4 ranks
            optimizer.step()
            losses.append(float(loss))
        epochs.append(got)
    # Every rank's view of the others' samples, through the process group as a trainer would gather them.
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, [[d for d, _ in e] for e in epochs])
    weights = [p.detach().clone() for p in model.parameters()]
    for w in weights:  # DDP keeps the replicas equal: the sum over ranks is world x this rank's
        total = w.clone()
        dist.all_reduce(total)
        assert torch.allclose(total, w * world, atol=1e-5), "DDP replicas diverged"
    if rank == 0:
        s = sidecar.stats()  # every rank finished reading (all_gather above), none has closed yet
        sessions = {str(sid): {"name": ss.name, "dataset": ss.dataset, "transport": ss.transport,
                               "samples": {str(e): ss.epoch(e).samples for e in range(spec["epochs"])}}
                    for sid, ss in s.sessions.items() if ss.dataset == "ranks"}
        data = s.dataset("ranks")
        state = json.loads((sidecar.home / "sidecar.json").read_text())
        (out / "stats.json").write_text(json.dumps({
            "sessions": sessions, "dataset": {str(e): data.epoch(e).samples for e in range(spec["epochs"])},
            "state_pid": state["pid"], "serving": serving(str(sidecar.home))}))
    (out / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "pid": os.getpid(), "started": sidecar.started, "sidecar_pid": sidecar.pid,
        "session": loader.session, "transport": ds.transport, "epochs": epochs, "gathered": gathered,
        "losses": losses}))
    dist.barrier()  # the rank that started the sidecar stops it when it closes: only once all are done
    sidecar.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
