"""Caches and cache-aware order against throttled storage (issue 29's storage-bound benchmark; not a test).

One run on generated photo-like JPEGs (bench_gpu's generator, bench_prep's q93 images, about 110 KB at 500x375) in an
image folder on local disk, read through a sidecar whose storage reads are throttled to ``--bandwidth`` (its
``--storage-bandwidth``): the dataset is 3x the memory cache. A training loop consumes at a fixed rate, ``--step-ms``
of sleep per batch (it stands in for the accelerator; by default the time the storage takes for one batch's share of
what a MinIO cache misses, so that neither side is idle by design), for ``--epochs`` epochs. Every row runs on a
fresh sidecar with the same flags but its cache's own; epoch 0 fills the cache (and warms the JIT), the later epochs
are the steady ones.

Rows (``--caches``, MinIO first, always; the registry ``CACHES`` below names the others): today's MinIO cache in the
sampler's order, LRU, MinIO with clairvoyant read-ahead (the sampler's order sent as the plan), and MinIO with
``order="cache_first"`` (which sends its reordered order as the plan). Another cache is a row by adding an entry to
``CACHES``: its sidecar flags, its ``unstall.torch.Dataset`` and ``DataLoader`` arguments.

Columns: the steady epochs' mean time and its ratio to the MinIO row of the same run, the stall fraction (time in
``next()`` over the epoch's time), storage MB per steady epoch (the sidecar's counters), the cache hit rate and the
samples served from the read-ahead, and the order's Spearman rank correlation with the seeded order (1 for the
sampler's order). Nothing is asserted.

    .venv/bin/python benchmarks/bench_cache.py [--caches minio,lru,...] [--images 3000] [--bandwidth 100e6]
        [--epochs 6] [--step-ms auto] [--out FILE.md] [--json FILE] [--toy]

``--toy``: 60 images of 64x48, batch 4, 3 epochs, 1 MB/s, so that it runs in seconds (tests/python/test_bench_cache.py
runs it so).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO / "python-shim" / "src"), str(HERE)]

from _report import header, write_out  # noqa: E402
from bench_gpu import git_commit, photo_folder  # noqa: E402
from bench_tiers import collate, run_loop  # noqa: E402

__all__ = ["CACHES", "Cache", "main"]

DATASET = "bench-cache"


@dataclass(frozen=True)
class Cache:
    """A row: the cache's sidecar flags and what the dataset and the loader are built with."""

    label: str
    sidecar_args: Tuple[str, ...] = ()
    dataset_args: Mapping[str, Any] = field(default_factory=dict)
    loader_args: Mapping[str, Any] = field(default_factory=dict)


CACHES: Dict[str, Cache] = {
    "minio": Cache("MinIO, sampler order"),
    "lru": Cache("LRU, sampler order", ("--cache-policy", "lru")),
    "minio-ahead": Cache("MinIO + read-ahead, sampler order", loader_args={"clairvoyant": True}),
    "minio-cache-first": Cache("MinIO + cache_first", loader_args={"order": "cache_first"}),
}
BASELINE = "minio"

FULL = dict(images=3000, size="500x375", batch=32, workers=2, epochs=6, bandwidth=100e6)
TOY = dict(images=60, size="64x48", batch=4, workers=2, epochs=3, bandwidth=1e6)


@dataclass
class Row:
    key: str
    label: str
    epoch_s: List[float]  # every epoch, 0 (cold) first
    stall: List[float]  # time in next() over the epoch's time
    storage_bytes: List[int]
    hits: List[int]
    read_ahead: List[int]
    samples: int
    spearman: List[float]

    def steady(self, values: Sequence[float]) -> float:
        later = values[1:] or values
        return sum(later) / len(later)


def run_row(key: str, cache: Cache, args: argparse.Namespace, data: Path, capacity: int, work: Path) -> Row:
    import unstall
    import unstall.torch as ut

    flags = ["--storage-bandwidth", str(int(args.bandwidth)), "--prefetch-window", str(args.prefetch_window),
             "--prefetch-window-bytes", str(args.prefetch_bytes), *cache.sidecar_args]
    with unstall.Sidecar(home=work / f"home-{key}", cache_capacity=capacity,
                         memory_budget=2 * capacity + args.prefetch_bytes + (256 << 20), extra_args=flags) as sc:
        ds = ut.Dataset(DATASET, root=str(data), sidecar=sc, **dict(cache.dataset_args))
        loader = ut.DataLoader(ds, batch_size=args.batch, shuffle=True, seed=0, num_workers=args.workers,
                               persistent_workers=args.workers > 0, collate_fn=collate, **dict(cache.loader_args))
        row = Row(key, cache.label, [], [], [], [], [], len(ds), [])

        def counters(epoch: int) -> str:
            e = sc.stats().dataset(DATASET).epoch(epoch)
            order = loader.order_stats
            row.storage_bytes.append(e.storage_bytes)
            row.hits.append(e.hits + e.disk_hits)
            row.read_ahead.append(e.prefetch_hits)
            row.spearman.append(order.spearman if order is not None and order.epoch == epoch else 1.0)
            return ""

        for epoch_s, stall_s, _ in run_loop(loader, args.epochs, args.step_ms / 1000, counters):
            row.epoch_s.append(epoch_s)
            row.stall.append(stall_s / epoch_s)
        return row


def table(rows: List[Row], args: argparse.Namespace, dataset_bytes: int, capacity: int) -> List[str]:
    base = next(r for r in rows if r.key == BASELINE)
    lines = [
        f"{rows[0].samples} photo-like JPEGs ({dataset_bytes / 1e6:.1f} MB, {args.size}) on local disk, storage "
        f"throttled to {args.bandwidth / 1e6:g} MB/s by the sidecar, memory cache {capacity / 1e6:.1f} MB "
        f"(dataset / {dataset_bytes / capacity:.1f}), read-ahead window {args.prefetch_window} samples / "
        f"{args.prefetch_bytes >> 20} MiB, batch {args.batch}, {args.workers} workers, {args.step_ms:.1f} ms of sleep "
        f"per batch, {args.epochs} epochs (epoch 0 fills the cache; the others are steady).",
        "",
        "| cache | epoch 0 s | steady epoch s | vs MinIO | stall | storage MB / epoch | hit rate | read ahead | "
        "spearman |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        steady = r.steady(r.epoch_s)
        cells = [r.label, f"{r.epoch_s[0]:.2f}", f"{steady:.2f}", f"{steady / base.steady(base.epoch_s):.2f}x",
                 f"{100 * r.steady(r.stall):.0f}%", f"{r.steady(r.storage_bytes) / 1e6:.1f}",
                 f"{100 * r.steady(r.hits) / r.samples:.0f}%", f"{100 * r.steady(r.read_ahead) / r.samples:.0f}%",
                 f"{r.steady(r.spearman):.4f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--toy", action="store_true", help="tiny everything, so that it runs in seconds")
    ap.add_argument("--caches", default=",".join(CACHES),
                    help=f"comma-separated rows of {', '.join(CACHES)} (default all; {BASELINE} always runs first)")
    ap.add_argument("--images", type=int, help="generated JPEGs (full 3000, toy 60)")
    ap.add_argument("--size", help="their WIDTHxHEIGHT (full 500x375, toy 64x48)")
    ap.add_argument("--batch", type=int, help="batch size (full 32, toy 4)")
    ap.add_argument("--workers", type=int, help="DataLoader workers (2)")
    ap.add_argument("--epochs", type=int, help="epochs per row, the first cold (full 6, toy 3)")
    ap.add_argument("--bandwidth", type=float, help="storage bytes/s (full 100e6, toy 1e6)")
    ap.add_argument("--step-ms", default="auto",
                    help="sleep per batch; auto: the storage time of one batch's share of a MinIO cache's misses")
    ap.add_argument("--prefetch-window", type=int, default=1024, help="the sidecar's read-ahead, samples (1024)")
    ap.add_argument("--prefetch-mib", type=int, default=64, help="the sidecar's read-ahead, MiB (64)")
    ap.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "unstall" / "bench-cache",
                    help="where generated JPEGs are kept between runs")
    ap.add_argument("--out", type=Path, help="also write the table (with the run's header) here")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = ap.parse_args(argv)
    for key, value in (TOY if args.toy else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    keys = [k.strip() for k in args.caches.split(",") if k.strip()]
    unknown = [k for k in keys if k not in CACHES]
    if unknown:
        ap.error(f"--caches: unknown {', '.join(unknown)}; choose from {', '.join(CACHES)}")
    args.caches = [BASELINE] + [k for k in dict.fromkeys(keys) if k != BASELINE]
    if args.epochs < 2:
        ap.error(f"--epochs must be at least 2 (one cold, one steady), got {args.epochs}")
    args.prefetch_bytes = args.prefetch_mib << 20
    return args


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    w, h = (int(v) for v in args.size.lower().split("x"))
    data = photo_folder(args.cache_dir.expanduser(), args.images, w, h, "q93")
    files = [p for p in data.rglob("*.jpg")]
    dataset_bytes = sum(p.stat().st_size for p in files)
    capacity = dataset_bytes // 3
    batches = -(-len(files) // args.batch)
    if args.step_ms == "auto":  # the misses of a MinIO cache, read at the bandwidth, spread over the epoch's batches
        args.step_ms = 1000 * (dataset_bytes - capacity) / args.bandwidth / batches
    else:
        args.step_ms = float(args.step_ms)
    rows: List[Row] = []
    with tempfile.TemporaryDirectory(prefix="unstall-bench-cache-") as work:
        for key in args.caches:
            print(f"[{key}] {CACHES[key].label} ...", file=sys.stderr, flush=True)
            rows.append(run_row(key, CACHES[key], args, data, capacity, Path(work)))
    commit = git_commit()
    lines = header() + [f"- commit: {commit}", "", *table(rows, args, dataset_bytes, capacity)]
    print("\n".join(lines))
    write_out(args.out, lines)
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k not in ("out", "json", "cache_dir")}
        args.json.write_text(json.dumps({"header": header(), "commit": commit, "settings": settings,
                                         "dataset_bytes": dataset_bytes, "capacity": capacity,
                                         "rows": [asdict(r) for r in rows]}, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("UNSTALL_EPOCH_LOG", "0")  # the table says it all
    main()
