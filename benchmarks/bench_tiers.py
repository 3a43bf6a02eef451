"""Cache policies and tiers against slow remote storage (issue 4's benchmark; not a test).

One run prints, per epoch for 3 epochs: bytes read from storage, epoch time and the trainer's stall time,
for no cache, LRU, MinIO, MinIO + disk tier and MinIO + clairvoyant prefetch, all with the same memory
cache capacity (half the dataset), plus the users' baseline: the same PyTorch loop reading S3 directly
with boto3, one GET per sample.

Storage is a real S3-API server (S3Proxy, started here from the tests module's classpath) and reads from
it are throttled to ``--bandwidth`` (default 150 MB/s): by the sidecar's ``--storage-bandwidth`` for
unstall, and by the same token bucket in each baseline worker (the bandwidth split evenly across workers)
for boto3. The trainer does ``--step-ms`` of simulated compute per batch; "stall" is the time it waits in
``next(loader)``.

    .venv/bin/python benchmarks/bench_tiers.py [--out docs/bench-tiers.md]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "python-shim" / "src"), str(REPO / "tests" / "python")]

import unstall  # noqa: E402
import unstall.torch as ut  # noqa: E402
from s3proxy import S3Proxy, S3ProxyMissing  # noqa: E402

ACCESS, SECRET, BUCKET = "bench-access", "bench-secret-key", "bench"
CONFIGS = ("no cache", "LRU", "MinIO", "MinIO + disk", "MinIO + prefetch")


@dataclass
class EpochRow:
    config: str
    epoch: int
    storage_mb: float
    epoch_s: float
    stall_s: float
    note: str = ""
    expected_mb: Optional[float] = None


# ---------------------------------------------------------------------------------------------
# the S3 server


def s3_client(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=ACCESS, aws_secret_access_key=SECRET,
        region_name="us-east-1", config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 5}),
    )


def upload_dataset(endpoint: str, samples: int, size: int, classes: int, seed: int, prefix: str = "data") -> List[str]:
    """An image-folder layout of random payloads (content does not matter to fetch or cache)."""
    s3 = s3_client(endpoint)
    if prefix == "data":
        s3.create_bucket(Bucket=BUCKET)
    rng = np.random.default_rng(seed)
    keys = []
    for i in range(samples):
        key = f"{prefix}/class{i % classes:02d}/img{i:05d}.jpg"
        body = rng.integers(0, 256, size=size + int(rng.integers(-size // 10, size // 10)), dtype=np.uint8).tobytes()
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
        keys.append(key)
    return keys


# ---------------------------------------------------------------------------------------------
# the trainer loop


TRACE_BATCHES = False  # --trace-batches: print each epoch's per-batch waits


def run_loop(loader: Any, epochs: int, step_s: float, on_epoch_end: Callable[[int], str]) -> List[tuple[float, float, str]]:
    out = []
    for epoch in range(epochs):
        start = time.perf_counter()
        it: Iterator[Any] = iter(loader)
        started = time.perf_counter() - start
        waits: List[float] = []
        while True:
            t = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            waits.append(time.perf_counter() - t)
            _consume(batch)
            time.sleep(step_s)  # the model's step
        elapsed = time.perf_counter() - start
        if TRACE_BATCHES:
            print(f"  epoch {epoch}: {elapsed:.3f} s, stall {sum(waits):.3f} s; iter() {1e3 * started:.0f} ms; "
                  "each next() (ms): " + " ".join(f"{1e3 * w:.0f}" for w in waits), flush=True)
        out.append((elapsed, sum(waits), on_epoch_end(epoch)))
    return out


def _consume(batch: Any) -> None:
    samples, _ = batch
    for s in samples:
        if len(s) == 0:
            raise ValueError("empty sample")


def collate(batch: List[Any]) -> Any:
    return [b[0] for b in batch], [b[1] for b in batch]


# ---------------------------------------------------------------------------------------------
# unstall configurations


def run_unstall(
    config: str, args: argparse.Namespace, endpoint: str, dataset_bytes: int, capacity: int, warmup_bytes: int,
    work: Path,
) -> List[EpochRow]:
    home = work / f"home-{config.replace(' ', '').replace('+', '-')}"
    extra = ["--storage-bandwidth", str(args.bandwidth), "--prefetch-window-bytes", "0"]
    clairvoyant = False
    policy_capacity = capacity
    if config == "no cache":
        policy_capacity = 0
    elif config == "LRU":
        extra += ["--cache-policy", "lru"]
    elif config == "MinIO + disk":
        extra += ["--disk-cache-dir", str(home / "disk"), "--disk-cache-capacity", str(4 * capacity)]
    elif config == "MinIO + prefetch":
        extra[extra.index("--prefetch-window-bytes") + 1] = str(64 << 20)
        extra += ["--prefetch-window", "512", "--prefetch-threads", "8"]
        clairvoyant = True
    env = {
        "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": ACCESS, "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_REGION": "us-east-1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        # The warm-up prefix is read first and MinIO never evicts it: a MinIO cache gets room for it on top
        # (LRU evicts it during epoch 0 anyway, so it keeps the plain capacity).
        cache = policy_capacity + warmup_bytes if config.startswith("MinIO") else policy_capacity
        with unstall.Sidecar(home=home, cache_capacity=cache, memory_budget=2 * cache + (256 << 20),
                             extra_args=extra) as sc:
            warm_up_jvm(sc, args.batch_size)
            ds = ut.Dataset("bench", root=f"s3://{BUCKET}/data", sidecar=sc)
            loader = ut.DataLoader(ds, batch_size=args.batch_size, shuffle=True, seed=0, num_workers=args.workers,
                                   collate_fn=collate, persistent_workers=True, clairvoyant=clairvoyant)

            def note(epoch: int) -> str:
                stats = sc.stats()
                e = stats.dataset("bench").epoch(epoch)
                storage[epoch] = e.storage_bytes
                if config.startswith("MinIO") and epoch > 0:
                    # MinIO: every epoch after the first reads exactly what the memory cache did not admit
                    # (and, with the disk tier, nothing: the disk holds the rest).
                    cached = stats.cache.used_bytes - warmup_bytes
                    expected[epoch] = 0.0 if config == "MinIO + disk" else (dataset_bytes - cached) / 1e6
                return f"hits {e.hits}, disk hits {e.disk_hits}, prefetched {e.prefetch_hits}"

            storage: dict[int, int] = {}
            expected: dict[int, float] = {}
            results = run_loop(loader, args.epochs, args.step_ms / 1000, note)
            return [EpochRow(config, e, storage[e] / 1e6, t, s, n, expected.get(e)) for e, (t, s, n) in enumerate(results)]
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def warm_up_jvm(sc: unstall.Sidecar, batch: int) -> None:
    """Two passes over a separate warm-up prefix of many small objects, through the same same-host path the
    loader uses, so that the sidecar's JIT (and the S3 SDK's) is warm, as in a long-running sidecar: the
    S3 read path needs a few thousand GETs before C2 has compiled it. The measured dataset's cache and stats are untouched."""
    ds = ut.Dataset("warmup", root=f"s3://{BUCKET}/warmup", sidecar=sc)
    for epoch in range(2):
        for i in range(0, len(ds), batch):
            ds.fetch_samples(list(range(i, min(len(ds), i + batch))), epoch=epoch)


# ---------------------------------------------------------------------------------------------
# the users' baseline: boto3 per sample


class _Bucket:
    """A token bucket per worker process: bandwidth / workers each, 100 ms of burst (as the sidecar's)."""

    def __init__(self, rate: float) -> None:
        self.rate, self.tokens, self.last = rate, 0.0, time.perf_counter()
        self.lock = threading.Lock()

    def take(self, n: int) -> None:
        with self.lock:
            now = time.perf_counter()
            self.tokens = min(self.rate / 10, self.tokens + (now - self.last) * self.rate) - n
            self.last = now
            wait = -self.tokens / self.rate if self.tokens < 0 else 0.0
        if wait > 0:
            time.sleep(wait)


class Boto3Dataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, endpoint: str, keys: List[str], rate: float) -> None:
        self.endpoint, self.keys, self.rate = endpoint, keys, rate
        self._s3: Any = None
        self._bucket: Optional[_Bucket] = None
        self.bytes_read = 0

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> Any:
        if self._s3 is None:
            self._s3, self._bucket = s3_client(self.endpoint), _Bucket(self.rate)
        body = self._s3.get_object(Bucket=BUCKET, Key=self.keys[i])["Body"].read()
        assert self._bucket is not None
        self._bucket.take(len(body))
        return body, i


def run_boto3(args: argparse.Namespace, endpoint: str, keys: List[str], sizes: dict[str, int]) -> List[EpochRow]:
    ds = Boto3Dataset(endpoint, keys, args.bandwidth / max(1, args.workers))
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                                         collate_fn=collate, persistent_workers=True,
                                         generator=torch.Generator().manual_seed(0))
    total = sum(sizes.values()) / 1e6
    results = run_loop(loader, args.epochs, args.step_ms / 1000, lambda e: "every sample is a GET")
    return [EpochRow("boto3 per sample", e, total, t, s, n) for e, (t, s, n) in enumerate(results)]


# ---------------------------------------------------------------------------------------------


def table(rows: List[EpochRow], dataset_mb: float, capacity_mb: float, args: argparse.Namespace) -> str:
    lines = [
        f"Dataset {dataset_mb:.0f} MB ({args.samples} samples of ~{args.sample_kb} KB) in S3 (S3Proxy), storage "
        f"throttled to {args.bandwidth / 1e6:.0f} MB/s, memory cache {capacity_mb:.0f} MB (half the dataset), "
        f"batch {args.batch_size}, {args.workers} workers, {args.step_ms} ms of compute per batch. Each sidecar first "
        f"reads a separate prefix of {args.warmup_samples} objects of {args.warmup_kb} KB twice (JIT warm-up, "
        f"as in a long-running sidecar; a MinIO cache gets room for that prefix on top of the capacity).",
        "",
        "| config | epoch | MB from storage | expected (MinIO: dataset - cached) | epoch s | stall s | stall % | notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        expected = "" if r.expected_mb is None else f"{r.expected_mb:.1f}"
        lines.append(
            f"| {r.config} | {r.epoch} | {r.storage_mb:.1f} | {expected} | {r.epoch_s:.2f} | {r.stall_s:.2f} | "
            f"{100 * r.stall_s / r.epoch_s:.0f}% | {r.note} |"
        )
    base = {r.epoch: r.epoch_s for r in rows if r.config == "boto3 per sample"}
    lines += ["", "Epoch time as a ratio to the boto3 baseline's same epoch (lower is faster):", "",
              "| config | epoch 0 | epoch 1 | epoch 2 |", "|---|---|---|---|"]
    for config in dict.fromkeys(r.config for r in rows):
        cells = [f"{r.epoch_s / base[r.epoch]:.2f}" for r in rows if r.config == config and r.epoch in base]
        lines.append(f"| {config} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=1200)
    p.add_argument("--sample-kb", type=int, default=110)
    p.add_argument("--bandwidth", type=float, default=150e6, help="storage bytes/s (default 150e6)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--out", type=Path, default=None, help="also write the table here")
    p.add_argument("--trace-batches", action="store_true",
                   help="print each epoch's wait in every next(), to see where an epoch's stall sits")
    p.add_argument("--warmup-samples", type=int, default=3000,
                   help="objects in the separate warm-up prefix each sidecar reads twice first (default 3000)")
    p.add_argument("--warmup-kb", type=int, default=8, help="size of a warm-up object (default 8 KB)")
    p.add_argument("--configs", default=",".join(CONFIGS),
                   help=f"comma-separated unstall configurations to run (default: all of {', '.join(CONFIGS)}); "
                        "the boto3 baseline always runs")
    args = p.parse_args()
    global TRACE_BATCHES
    TRACE_BATCHES = args.trace_batches
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        p.error(f"--configs: unknown configuration(s) {unknown}; choose from {list(CONFIGS)}")

    work = Path(tempfile.mkdtemp(prefix="unstall-bench-tiers-"))
    try:
        proxy = S3Proxy(work / "s3proxy.log", access_key=ACCESS, secret_key=SECRET).__enter__()
    except S3ProxyMissing as e:
        sys.exit(f"bench_tiers: {e} (scripts/setup.sh --build builds it)")
    endpoint = proxy.endpoint
    try:
        print(f"uploading {args.samples} samples to {endpoint} ...", flush=True)
        keys = upload_dataset(endpoint, args.samples, args.sample_kb * 1000, 10, seed=1)
        warm_keys = upload_dataset(endpoint, args.warmup_samples, args.warmup_kb * 1000, 10, seed=2, prefix="warmup")
        s3 = s3_client(endpoint)
        warmup = sum(int(o["Size"]) for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="warmup/")
                     for o in page.get("Contents", []))
        assert warm_keys
        sizes = {k: int(s3.head_object(Bucket=BUCKET, Key=k)["ContentLength"]) for k in keys}
        dataset = sum(sizes.values())
        capacity = dataset // 2
        rows: List[EpochRow] = []
        for config in configs:
            print(f"running {config} ...", flush=True)
            rows += run_unstall(config, args, endpoint, dataset, capacity, warmup, work)
        print("running boto3 per sample ...", flush=True)
        rows += run_boto3(args, endpoint, keys, sizes)
        out = table(rows, dataset / 1e6, capacity / 1e6, args)
        print()
        print(out)
        if args.out:
            args.out.write_text(out + "\n")
    finally:
        proxy.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
