"""The partitioned cache across N sidecars (issue 12's benchmark; not a test).

For N = 1, 2, 4 sidecars on N "hosts" (network namespaces on a bridge, or loopback addresses where
namespaces are not permitted: the report says which), each host runs a rank that reads its
DistributedSampler shard of one image-folder dataset for ``--epochs`` epochs, with a memory cache of
``--capacity-fraction`` of the dataset per sidecar. The dataset lives in a real S3-API server (S3Proxy) in
the root namespace; each host's link from it is shaped by ``tc`` to ``--storage-rate`` (as each node's link to
remote storage), the links between hosts to the faster ``--peer-rate``. On the loopback fallback nothing is
shaped, so the sidecars' own ``--storage-bandwidth`` throttle stands in for the storage link (reported).
It prints, per N and epoch: bytes the cluster read from storage, the epoch's time (the slowest rank's) and
aggregate samples/s, each as a ratio to N = 1 in the same run, and the scaling efficiency (ratio / N).

CoorDL's claim to check: after the first epoch, storage reads fall to dataset - N x capacity, and while
storage is the bottleneck aggregate throughput scales at least 0.8 N.

    .venv/bin/python benchmarks/bench_cluster.py [--samples 800 --size-kib 16 --epochs 3 --nodes 1,2,4]

Needs the sidecar jar and S3Proxy (scripts/setup.sh --build), and root for the namespaces.
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
from s3proxy import S3Proxy  # noqa: E402

from unstall.sidecar import find_jar  # noqa: E402


BUCKET = "bench"


def upload_dataset(proxy: S3Proxy, samples: int, size: int) -> int:
    """An image-folder layout of random bytes (the cache never decodes) in s3://bench/data; returns its bytes."""
    s3 = proxy.client()
    s3.create_bucket(Bucket=BUCKET)
    rng = np.random.default_rng(1)
    for i in range(samples):
        s3.put_object(Bucket=BUCKET, Key=f"data/class{i % 10}/img{i:06d}.jpg",
                      Body=rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    return samples * size


def run(n: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    dataset_bytes = args.samples * args.size_kib * 1024
    capacity = int(dataset_bytes * args.capacity_fraction)
    token = work / "cluster-token"
    token.write_text("cluster-" + os.urandom(16).hex() + "\n")
    token.chmod(0o600)
    with Hosts(n, rate=args.peer_rate, delay=args.peer_delay, storage_rate=args.storage_rate) as hosts, \
            S3Proxy(work / f"s3proxy{n}.log", host=hosts.storage_address) as proxy:
        upload_dataset(proxy, args.samples, args.size_kib * 1024)
        # Shaped by tc in namespaces; on the loopback fallback the sidecar's own throttle is the storage link.
        throttle = [] if hosts.mode == "netns" else ["--storage-bandwidth", args.fallback_storage_bandwidth]
        cert, key = make_cluster_certificate(work, hosts.addresses)
        members = ",".join(f"{a}:5701" for a in hosts.addresses)
        ranks = []
        try:
            for k in range(n):
                spec = {
                    "rank": k, "ranks": n, "home": str(work / f"home{n}-{k}"), "root": f"s3://{BUCKET}/data",
                    "dataset": "bench",
                    "jar": str(find_jar()), "cache_capacity": capacity, "memory_budget": args.memory_budget,
                    "java_options": ["-Xmx512m"], "batch_size": args.batch_size, "epochs": args.epochs,
                    "extra_args": [*throttle, *args.sidecar_arg, "--cluster-members", members,
                                   "--cluster-bind", hosts.addresses[k], "--cluster-name", f"bench-{os.getpid()}-{n}",
                                   "--cluster-token", str(token), "--peer-tls-cert", str(cert), "--peer-tls-key",
                                   str(key), "--peer-tls-ca", str(cert)],
                }
                ranks.append(Rank(k, hosts.command(k, rank_argv(spec)), work / f"rank{n}-{k}.log",
                                  env=proxy.environment()))
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
    return {"n": n, "hosts": where, "capacity": capacity, "dataset_bytes": dataset_bytes, "epochs": epochs,
            "storage_link": args.storage_rate + " (tc htb)" if hosts.mode == "netns"
            else args.fallback_storage_bandwidth + "/s (the sidecar's throttle)"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="1,2,4")
    ap.add_argument("--samples", type=int, default=800)
    ap.add_argument("--size-kib", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--capacity-fraction", type=float, default=0.3, help="each sidecar's cache, of the dataset")
    ap.add_argument("--storage-rate", default="8mbit", help="tc rate of each host's link from storage (namespaces)")
    ap.add_argument("--fallback-storage-bandwidth", default="1MB",
                    help="the sidecars' --storage-bandwidth where namespaces are not permitted (per second)")
    ap.add_argument("--peer-rate", default="1gbit", help="tc rate of each host's link (namespaces only)")
    ap.add_argument("--peer-delay", default="1ms", help="tc delay of each host's link (netem only)")
    ap.add_argument("--memory-budget", default="256MiB")
    ap.add_argument("--sidecar-arg", action="append", default=[], help="an extra `serve` argument (repeatable)")
    ap.add_argument("--out", type=Path, help="also write the results as JSON here")
    ap.add_argument("--work", type=Path, help="work in this directory and keep it (the logs); default: a temporary one")
    args = ap.parse_args()
    if args.work:  # kept: the sidecars' and ranks' logs
        args.work.mkdir(parents=True, exist_ok=True)
        results = [run(int(n), args, args.work) for n in args.nodes.split(",")]
    else:
        with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
            results = [run(int(n), args, Path(tmp)) for n in args.nodes.split(",")]
    dataset_bytes = results[0]["dataset_bytes"]
    base = {e["epoch"]: e for e in results[0]["epochs"]}
    print(f"dataset {args.samples} samples, {dataset_bytes / 1e6:.1f} MB; cache per sidecar "
          f"{args.capacity_fraction:.0%} of it; storage link per node: {results[-1]['storage_link']}")
    print(f"hosts: {results[-1]['hosts']}")
    print("storage MB: what the cluster read from storage; dataset - N x cap: CoorDL's expectation, which needs every"
          " node to own at least its capacity; dataset - cached: what the caches held when the epoch began")
    print(f"{'N':>2} {'epoch':>5} {'storage MB':>10} {'(x N=1)':>8} {'dataset - N x cap':>17} {'dataset - cached':>16}"
          f" {'epoch s':>8} {'(x N=1)':>8} {'samples/s':>9} {'(x N=1)':>8} {'/ N':>5} {'peer hits':>9} {'fallbacks':>9}")
    for r in results:
        for e in r["epochs"]:
            b = base[e["epoch"]]
            expected = dataset_bytes if e["epoch"] == 0 else max(0, dataset_bytes - r["n"] * r["capacity"])
            print(f"{r['n']:>2} {e['epoch']:>5} {e['storage_bytes'] / 1e6:>10.2f} "
                  f"{e['storage_bytes'] / max(1, b['storage_bytes']):>8.2f} {expected / 1e6:>17.2f} "
                  f"{(dataset_bytes - e['cached_bytes']) / 1e6:>16.2f} "
                  f"{e['seconds']:>8.2f} {e['seconds'] / b['seconds']:>8.2f} {e['samples_per_s']:>9.0f} "
                  f"{e['samples_per_s'] / b['samples_per_s']:>8.2f} "
                  f"{e['samples_per_s'] / b['samples_per_s'] / r['n']:>5.2f} {e['peer_hits']:>9} {e['peer_fallbacks']:>9}")
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "results": results}, indent=1))


if __name__ == "__main__":
    main()
