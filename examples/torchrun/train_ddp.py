#!/usr/bin/env python
"""DDP training fed by unstall, launched by torchrun: one sidecar per node, shared by the node's ranks, the nodes'
sidecars joined into one partitioned cache.

    torchrun --nnodes 2 --nproc-per-node 2 --node-rank N --rdzv-backend static --rdzv-endpoint HOST:PORT \\
        train_ddp.py --data /shared/imagefolder --cluster-members auto --cluster-bind NODE_IP --cluster-token FILE

Every rank calls ``unstall.Sidecar(...)`` with the node's ``UNSTALL_HOME``: the first local rank starts the
sidecar, the others attach to it (a lock on ``$UNSTALL_HOME/start.lock``). With ``--cluster-members`` the
sidecar joins the other nodes' (``auto``: torchrun's ``MASTER_ADDR``, or SLURM's node list), so the job caches
N x ``--cache-capacity``. Each rank reads its ``DistributedSampler`` shard through ``unstall.torch.DataLoader``
in a session of its own (``sidecar.stats()`` lists them by rank). The loop is a plain DDP loop.

``--ids-dir DIR`` writes, per rank and epoch, the sample ids its sampler drew and the labels the loader
returned (the test checks that the ranks together saw every sample once), and, on each node's first rank,
its sidecar's view of the cluster. ``run.sh`` runs 2 nodes x 2 ranks on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

import unstall
from unstall.torch import DataLoader, Dataset, decode_image

SIZE = 32


def to_input(image: torch.Tensor) -> torch.Tensor:
    """uint8 CHW -> float CHW of SIZE x SIZE in [0, 1]."""
    x = image.float().div_(255.0).unsqueeze(0)
    return nn.functional.interpolate(x, size=(SIZE, SIZE), mode="bilinear", align_corners=False)[0]


def cluster_args(a: argparse.Namespace) -> list[str]:
    """The sidecar's cluster options (none without --cluster-members: each node's sidecar on its own)."""
    if not a.cluster_members:
        return []
    args = ["--cluster-members", a.cluster_members, "--cluster-bind", a.cluster_bind, "--cluster-token",
            a.cluster_token, "--cluster-port", str(a.cluster_port), "--cluster-name", a.cluster_name,
            "--peer-port", str(a.peer_port)]
    for flag, value in (("--peer-tls-cert", a.peer_tls_cert), ("--peer-tls-key", a.peer_tls_key),
                        ("--peer-tls-ca", a.peer_tls_ca)):
        if value:
            args += [flag, value]
    return args


def wait_for_cluster(sidecar: unstall.Sidecar, nodes: int, timeout: float = 120.0) -> None:
    """Until this node's sidecar sees every node's, with ownership settled (before that, nothing is cached)."""
    deadline = time.monotonic() + timeout
    while True:
        c = sidecar.stats().cluster
        if c is None or (c.members >= nodes and c.settled):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"the sidecars' cluster did not form within {timeout:.0f}s: {c}")
        time.sleep(0.2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="an image folder (the same path on every node)")
    p.add_argument("--dataset", default="ddp-images", help="the name it is registered under")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-capacity", default="256MiB", help="per node; the cluster caches nodes x this")
    p.add_argument("--cluster-members", default="", help="host[:port],..., 'auto' or 'k8s:SERVICE'; off if empty")
    p.add_argument("--cluster-bind", default="", help="this node's address on the cluster's private interface")
    p.add_argument("--cluster-token", default="", help="a 0600 file, the same on every node")
    p.add_argument("--cluster-port", type=int, default=5701)
    p.add_argument("--cluster-name", default="unstall")
    p.add_argument("--peer-port", type=int, default=8816)
    p.add_argument("--peer-tls-cert", default="")
    p.add_argument("--peer-tls-key", default="")
    p.add_argument("--peer-tls-ca", default="")
    p.add_argument("--ids-dir", default="", help="write each rank's sample ids per epoch here (checks)")
    a = p.parse_args()

    dist.init_process_group("gloo")  # torchrun's env:// rendezvous; use "nccl" on GPUs
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    nodes = world // int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))

    # One sidecar per node: the first local rank starts it (UNSTALL_HOME is the node's), the others attach.
    sidecar = unstall.Sidecar(cache_capacity=a.cache_capacity, extra_args=cluster_args(a), startup_timeout=120)
    wait_for_cluster(sidecar, nodes)
    ds = Dataset(a.dataset, root=a.data, sidecar=sidecar, loader=decode_image, transform=to_input)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=a.seed)
    loader = DataLoader(ds, batch_size=a.batch_size, sampler=sampler, num_workers=a.workers)

    torch.manual_seed(a.seed)
    model = DistributedDataParallel(nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
        nn.Linear(8 * 16, max(1, len(ds.classes)))))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    out: Optional[Path] = Path(a.ids_dir) if a.ids_dir else None
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        labels: list[int] = []
        t0, loss_sum, batches = time.monotonic(), 0.0, 0
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_sum, batches = loss_sum + float(loss), batches + 1
            labels.extend(int(t) for t in y)
        s = loader.stats()
        print(f"rank {rank} epoch {epoch}: loss {loss_sum / max(1, batches):.3f}, {len(labels)} samples in "
              f"{time.monotonic() - t0:.1f}s, stall {100 * s.stall_fraction:.0f}%, cache hits {s.cache_hits}, "
              f"peer hits {s.peer_hits}",
              flush=True)
        if out is not None:
            (out / f"rank{rank}-epoch{epoch}.json").write_text(json.dumps({"ids": list(sampler), "labels": labels}))
    dist.barrier()  # every rank is done reading before any closes: the starter's close stops the sidecar
    if out is not None and local_rank == 0:
        st = sidecar.stats()
        d = st.dataset(a.dataset)
        doc: dict[str, Any] = {
            "node": rank // max(1, world // nodes), "sidecar_pid": sidecar.pid,
            "members": st.cluster.members if st.cluster else 1,
            "sessions": sorted(ss.name for ss in st.sessions.values() if ss.dataset == a.dataset),
            "peer_hits": {e: d.epoch(e).peer_hits for e in range(a.epochs)},
            "served_to_peers": d.served_to_peers.total.samples if d.served_to_peers else 0}
        (out / f"node-rank{rank}.json").write_text(json.dumps(doc))
    if out is not None:
        (out / f"rank{rank}-sidecar.json").write_text(json.dumps({"pid": sidecar.pid, "started": sidecar.started}))
    dist.barrier()
    sidecar.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
