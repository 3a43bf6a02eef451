"""Probe (not a benchmark table): the CPU one S3 GET costs the sidecar and boto3, and how many GETs the
sidecar's JIT needs before its read path is warm.

A real S3Proxy (as in bench_tiers) holds 600 objects of 110 KB. The sidecar (no cache, not throttled) reads
them in batches of 32 through the same-host path, ``--passes`` times; each pass prints its throughput and
the CPU per GET of the sidecar, S3Proxy and this process. Then boto3 reads them one GET after another,
twice, with the same CPU accounting.

    .venv/bin/python benchmarks/probe_s3_cpu.py [--passes 10]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "python-shim" / "src"), str(REPO / "benchmarks")]

import bench_tiers as bt  # noqa: E402
import unstall  # noqa: E402
import unstall.torch as ut  # noqa: E402
from _cpu import CpuMeter  # noqa: E402

N, SIZE, BATCH = 600, 110_000, 32


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--passes", type=int, default=10)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="unstall-probe-s3-"))
    proxy, endpoint = bt.start_s3proxy(work)
    try:
        keys = bt.upload_dataset(endpoint, N, SIZE, 10, seed=1)
        mb = N * SIZE / 1e6
        os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": bt.ACCESS,
                           "AWS_SECRET_ACCESS_KEY": bt.SECRET, "AWS_REGION": "us-east-1", "UNSTALL_EPOCH_LOG": "0"})
        with unstall.Sidecar(home=work / "home", cache_capacity=0, memory_budget=512 << 20,
                             extra_args=["--prefetch-window-bytes", "0"]) as sc:
            ds = ut.Dataset("probe", root=f"s3://{bt.BUCKET}/data", sidecar=sc)
            for rep in range(args.passes):
                with CpuMeter([sc.pid]) as side, CpuMeter([proxy.pid]) as s3, \
                        CpuMeter([os.getpid()], exclude=[sc.pid, proxy.pid]) as me:
                    t0 = time.perf_counter()
                    for i in range(0, N, BATCH):
                        ds.fetch_samples(list(range(i, min(N, i + BATCH))), epoch=rep)
                    dt = time.perf_counter() - t0
                print(f"sidecar pass {rep}: {mb / dt:.0f} MB/s; CPU per GET: sidecar {1e3 * side.seconds / N:.2f} ms, "
                      f"S3Proxy {1e3 * s3.seconds / N:.2f} ms, this process {1e3 * me.seconds / N:.2f} ms", flush=True)
        s3c = bt.s3_client(endpoint)
        for rep in range(2):
            with CpuMeter([proxy.pid]) as s3, CpuMeter([os.getpid()], exclude=[proxy.pid]) as me:
                t0 = time.perf_counter()
                for k in keys:
                    s3c.get_object(Bucket=bt.BUCKET, Key=k)["Body"].read()
                dt = time.perf_counter() - t0
            print(f"boto3 pass {rep}: {mb / dt:.0f} MB/s; CPU per GET: boto3 {1e3 * me.seconds / N:.2f} ms, "
                  f"S3Proxy {1e3 * s3.seconds / N:.2f} ms", flush=True)
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
