"""The partitioned cache across N sidecars (issue 12's benchmark; not a test).

For N = 1, 2, 4 sidecars on N "hosts" (network namespaces on a bridge whose links are shaped to
``--peer-rate``, or loopback addresses where namespaces are not permitted: the report says which), each
host runs a rank that reads its DistributedSampler shard of one image-folder dataset for ``--epochs``
epochs, with a memory cache of ``--capacity-fraction`` of the dataset per sidecar. Storage is local files
read through each sidecar's ``--storage-bandwidth`` throttle (``--storage-rate``, per node, as each node's
link to remote storage), slower than the peer links. It prints, per N and epoch: bytes the cluster read from
storage, the epoch's time (the slowest rank's) and aggregate samples/s, and each as a ratio to N = 1.

CoorDL's claim to check: after the first epoch, storage reads fall to dataset - N x capacity, so epoch time
falls faster than 1/N while storage is the bottleneck.

    .venv/bin/python benchmarks/bench_cluster.py [--samples 1200 --size-kib 20 --epochs 3 --nodes 1,2,4]

Needs the sidecar jar (scripts/setup.sh --build). The machine is shared: keep runs short.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "python-shim" / "src"), str(REPO / "tests" / "python")]

from cluster_hosts import Hosts, make_cluster_certificate  # noqa: E402
from cluster_rank import Rank, rank_argv  # noqa: E402

from unstall.sidecar import find_jar  # noqa: E402


def make_dataset(root: Path, samples: int, size: int) -> int:
    rng = np.random.default_rng(1)
    total = 0
    for i in range(samples):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        p = root / f"class{i % 10}" / f"img{i:06d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        total += len(data)
    return total


def run(n: int, args: argparse.Namespace, work: Path, data: Path, dataset_bytes: int) -> dict[str, Any]:
    capacity = int(dataset_bytes * args.capacity_fraction)
    token = work / "cluster-token"
    token.write_text("cluster-" + os.urandom(16).hex() + "\n")
    token.chmod(0o600)
    with Hosts(n, rate=args.peer_rate, delay=args.peer_delay) as hosts:
        cert, key = make_cluster_certificate(work, hosts.addresses)
        members = ",".join(f"{a}:5701" for a in hosts.addresses)
        ranks = []
        try:
            for k in range(n):
                spec = {
                    "rank": k, "ranks": n, "home": str(work / f"home{n}-{k}"), "root": str(data), "dataset": "bench",
                    "jar": str(find_jar()), "cache_capacity": capacity, "memory_budget": args.memory_budget,
                    "java_options": ["-Xmx512m"], "batch_size": args.batch_size, "epochs": args.epochs,
                    "extra_args": ["--storage-bandwidth", args.storage_rate, "--cluster-members", members,
                                   "--cluster-bind", hosts.addresses[k], "--cluster-name", f"bench-{os.getpid()}-{n}",
                                   "--cluster-token", str(token), "--peer-tls-cert", str(cert), "--peer-tls-key",
                                   str(key), "--peer-tls-ca", str(cert)],
                }
                ranks.append(Rank(k, hosts.command(k, rank_argv(spec)), work / f"rank{n}-{k}.log"))
            for r in ranks:
                r.expect("READY")
            for r in ranks:
                r.go()
            counters = []
            for e in range(args.epochs + 1):
                for r in ranks:
                    r.expect(f"EPOCH {e}")
                for r in ranks:
                    r.go("stats")
                counters.append([json.loads(r.expect("STATS ")) for r in ranks])
                for r in ranks:
                    r.go()
            done = [json.loads(r.expect("DONE ")) for r in ranks]
        finally:
            for r in ranks:
                r.stop()
        where = hosts.describe()
    epochs = []
    for e in range(args.epochs):
        storage = sum(s["epochs"].get(str(e), {}).get("storage_bytes", 0)
                      + s["epochs"].get(str(e), {}).get("peer_storage_bytes", 0) for s in counters[e + 1])
        seconds = max(d["seconds"][e] for d in done)
        epochs.append({"epoch": e, "storage_bytes": storage, "seconds": seconds,
                       "samples_per_s": args.samples / seconds if seconds > 0 else 0.0,
                       "cached_bytes": sum(s["used_bytes"] for s in counters[e]),
                       "peer_hits": sum(d["peer_hits"][e] for d in done),
                       "peer_fallbacks": sum(s["epochs"].get(str(e), {}).get("peer_fallbacks", 0)
                                             for s in counters[e + 1])})
    return {"n": n, "hosts": where, "capacity": capacity, "epochs": epochs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="1,2,4")
    ap.add_argument("--samples", type=int, default=1200)
    ap.add_argument("--size-kib", type=int, default=20)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--capacity-fraction", type=float, default=0.25, help="each sidecar's cache, of the dataset")
    ap.add_argument("--storage-rate", default="10MB", help="each node's storage throttle, per second")
    ap.add_argument("--peer-rate", default="1gbit", help="tc rate of each host's link (namespaces only)")
    ap.add_argument("--peer-delay", default="1ms", help="tc delay of each host's link (netem only)")
    ap.add_argument("--memory-budget", default="256MiB")
    ap.add_argument("--out", type=Path, help="also write the results as JSON here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        work = Path(tmp)
        data = work / "data"
        dataset_bytes = make_dataset(data, args.samples, args.size_kib * 1024)
        results = [run(int(n), args, work, data, dataset_bytes) for n in args.nodes.split(",")]
    base = {e["epoch"]: e for e in results[0]["epochs"]}
    print(f"dataset {args.samples} samples, {dataset_bytes / 1e6:.1f} MB; cache per sidecar "
          f"{args.capacity_fraction:.0%} of it; storage {args.storage_rate}/s per node")
    print(f"hosts: {results[-1]['hosts']}")
    print("storage MB: what the cluster read from storage; dataset - N x cap: CoorDL's expectation, which needs every"
          " node to own at least its capacity; dataset - cached: what the caches held when the epoch began")
    print(f"{'N':>2} {'epoch':>5} {'storage MB':>10} {'(x N=1)':>8} {'dataset - N x cap':>17} {'dataset - cached':>16}"
          f" {'epoch s':>8} {'(x N=1)':>8} {'samples/s':>9} {'(x N=1)':>8} {'peer hits':>9} {'fallbacks':>9}")
    for r in results:
        for e in r["epochs"]:
            b = base[e["epoch"]]
            expected = dataset_bytes if e["epoch"] == 0 else max(0, dataset_bytes - r["n"] * r["capacity"])
            print(f"{r['n']:>2} {e['epoch']:>5} {e['storage_bytes'] / 1e6:>10.2f} "
                  f"{e['storage_bytes'] / max(1, b['storage_bytes']):>8.2f} {expected / 1e6:>17.2f} "
                  f"{(dataset_bytes - e['cached_bytes']) / 1e6:>16.2f} "
                  f"{e['seconds']:>8.2f} {e['seconds'] / b['seconds']:>8.2f} {e['samples_per_s']:>9.0f} "
                  f"{e['samples_per_s'] / b['samples_per_s']:>8.2f} {e['peer_hits']:>9} {e['peer_fallbacks']:>9}")
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "results": results}, indent=1))


if __name__ == "__main__":
    main()
