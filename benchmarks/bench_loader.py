#!/usr/bin/env python
"""Benchmark: a PyTorch loop fed by unstall from a warm cache vs the same loop reading files.

    python benchmarks/bench_loader.py --out bench.md            # ~200 MB per case under ~/.cache/unstall/bench

Prints markdown tables (and writes them to --out):
1. samples/s and MB/s of a minimal loop (it touches one byte per sample) over DataLoader(num_workers=2),
   fed by unstall with every sample in the sidecar's cache, vs a plain torch Dataset that opens and reads
   each file, for ~110 KB and ~1 MB samples; with the CPU seconds per timed epoch of all the processes
   involved (the main process, its persistent DataLoader workers and, for unstall, the sidecar; read from
   /proc by benchmarks/_cpu.py) and the data transport the unstall loader reports (when it reports one);
2. storage bytes the sidecar read per epoch over 3 epochs with a cache of 50% of the dataset, next to
   the expected value (epoch 0: the dataset; then: the dataset minus what the cache holds).

Not a test: numbers depend on the machine. The plain baseline is NOT reading from disk after its first
(warm-up) epoch: the OS page cache holds the files (dropping it needs root), so the comparison is
"unstall's cache over Flight" vs "page cache + open/read per sample".
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, List, NamedTuple, Optional, Tuple

import numpy as np
import torch
import torch.utils.data as tud
from tqdm import tqdm

import unstall
from unstall.torch import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cpu import CpuMeter  # noqa: E402
from _report import header, transport_of  # noqa: E402


def generate(root: Path, sample_bytes: int, total_bytes: int, seed: int) -> int:
    """Random-ish payload files of exactly ``sample_bytes`` in an image-folder layout; returns the count."""
    n = max(1, total_bytes // sample_bytes)
    marker = root / f".complete-{n}x{sample_bytes}"
    if marker.exists():
        return n
    rng = np.random.default_rng(seed)
    classes = 10
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        # compressible-ish content (like image bytes: not all random), fixed size
        block = rng.integers(0, 256, size=sample_bytes // 4, dtype=np.uint8).tobytes()
        (root / f"c{i % classes}" / f"s{i:06d}.jpg").write_bytes((block * 4 + block)[:sample_bytes])
        if (i + 1) % 200 == 0 or i + 1 == n:
            print(f"\r  generating {root}: {i + 1}/{n}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    marker.touch()
    return n


class PlainFiles(tud.Dataset):
    """The baseline: open and read each file per sample (what an ImageFolder does before decoding)."""

    def __init__(self, root: Path) -> None:
        import torchvision

        self.samples: List[Tuple[str, int]] = torchvision.datasets.ImageFolder(str(root)).samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> Tuple[bytes, int]:
        path, label = self.samples[i]
        with open(path, "rb") as f:
            return f.read(), label


def touch_batch(batch: List[Tuple[bytes, Any]]) -> Tuple[int, int]:
    """collate_fn doing minimal work: (samples, bytes) and one byte read per sample."""
    s = 0
    nbytes = 0
    for payload, _ in batch:
        s += payload[0]
        nbytes += len(payload)
    return len(batch), nbytes


class Run(NamedTuple):
    seconds: float  # timed epochs only
    samples: int
    nbytes: int
    cpu_s: float  # CPU seconds of all measured processes over the timed epochs
    cpu_exited: int  # measured processes that exited inside the timed window (then cpu_s is a lower bound)
    transport: Optional[str]


def _epoch(loader: tud.DataLoader, desc: str) -> Tuple[int, int]:
    s = b = 0
    for n, nb in tqdm(loader, desc=desc, leave=False, mininterval=0.5, file=sys.stderr):
        s += n
        b += nb
    return s, b


def run_epochs(make_loader: Callable[[], tud.DataLoader], epochs: int, desc: str,
               cpu_pids: List[Optional[int]], cpu_exclude: List[Optional[int]] = ()) -> Run:
    """Epoch 0 warms up (fills unstall's cache / the page cache, starts the persistent workers); then
    ``epochs`` timed epochs, with the CPU of ``cpu_pids`` and their descendants measured around them."""
    loader = make_loader()
    _epoch(loader, f"{desc}: warm-up epoch")
    it_total = 0.0
    samples = nbytes = 0
    with CpuMeter(cpu_pids, exclude=cpu_exclude) as cpu:
        for e in range(1, epochs + 1):
            t0 = time.perf_counter()
            s, b = _epoch(loader, f"{desc}: epoch {e}/{epochs}")
            it_total += time.perf_counter() - t0
            samples += s
            nbytes += b
    stats = None
    if hasattr(loader, "stats"):
        try:
            stats = loader.stats()
        except Exception:
            stats = None
    return Run(it_total, samples, nbytes, cpu.seconds, cpu.exited, transport_of(stats, loader, loader.dataset))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="unstall vs plain file reads in a PyTorch loop")
    p.add_argument("--dir", type=Path, default=Path.home() / ".cache" / "unstall" / "bench")
    p.add_argument("--mb-per-case", type=int, default=200, help="dataset size per sample-size case (MB)")
    p.add_argument("--epochs", type=int, default=2, help="timed epochs after one warm-up epoch")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="also write the tables here")
    args = p.parse_args(argv)

    cases = [("110 KB", 110_000, 64), ("1 MB", 1_000_000, 8)]
    roots = {}
    for label, size, _ in cases:
        root = args.dir / f"s{size}"
        n = generate(root, size, args.mb_per_case * 1_000_000, seed=size)
        roots[size] = (root, n)
    capacity = sum(n * size for (_, n), (_, size, _) in zip(roots.values(), cases)) + (64 << 20)

    lines: List[str] = []

    def out(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    out(f"## unstall vs plain file reads ({platform.machine()}, {os.cpu_count()} CPUs, num_workers={args.num_workers}, "
        f"torch {torch.__version__}, unstall {unstall.__version__})")
    out()
    for line in header():
        out(line)
    out()
    out("| sample size | samples | loader | transport | samples/s | MB/s | unstall / plain | CPU s/epoch "
        "| CPU unstall/plain |")
    out("|---|---|---|---|---|---|---|---|---|")
    exited = False
    with unstall.Sidecar(home=args.dir / "home-warm", cache_capacity=capacity,
                         memory_budget=capacity + (512 << 20)) as sidecar:
        for label, size, batch in cases:
            root, n = roots[size]
            ds = Dataset(f"bench-{size}", root=root, sidecar=sidecar)
            common = dict(batch_size=batch, shuffle=True, num_workers=args.num_workers, persistent_workers=True,
                          collate_fn=touch_batch, seed=0)
            # CPU: this process, its workers (and fork server) and the sidecar JVM
            u = run_epochs(lambda: DataLoader(ds, **common), args.epochs, f"{label} unstall",
                           [os.getpid(), sidecar.pid])
            st = sidecar.stats().dataset(ds.name)
            warm = all(st.epoch(e).storage_bytes == 0 for e in range(1, args.epochs + 1))
            transport = u.transport or transport_of(st) or "not reported"
            plain = PlainFiles(root)
            # CPU: this process and its workers; not the (idle) sidecar, which is also our child
            pl = run_epochs(lambda: tud.DataLoader(plain, generator=torch.Generator().manual_seed(0),
                                                   **{k: v for k, v in common.items() if k != "seed"}),
                            args.epochs, f"{label} plain", [os.getpid()], [sidecar.pid])
            exited = exited or bool(u.cpu_exited or pl.cpu_exited)
            ru, rp = u.samples / u.seconds, pl.samples / pl.seconds
            cu, cp = u.cpu_s / args.epochs, pl.cpu_s / args.epochs
            out(f"| {label} | {n} | unstall (warm cache{'' if warm else ', NOT all hits'}) | {transport} | {ru:,.0f} | "
                f"{u.nbytes / u.seconds / 1e6:,.0f} | {ru / rp:.2f}x | {cu:.2f} | {cu / cp:.2f}x |")
            out(f"| {label} | {n} | plain open/read (page cache) | files | {rp:,.0f} | "
                f"{pl.nbytes / pl.seconds / 1e6:,.0f} | | {cp:.2f} | |")
    out()
    out("The plain baseline reads from the OS page cache after its warm-up epoch (dropping it needs root); "
        "unstall serves from its own cache (transport: what the unstall loader reports, if it does). Timed: "
        f"epochs 1..{args.epochs} after a warm-up epoch 0. CPU s/epoch: user + system CPU seconds per timed "
        "epoch of all the case's processes together, from /proc/<pid>/stat before and after the timed epochs: "
        "the main process and its persistent DataLoader workers, plus the sidecar JVM for unstall (its idle "
        "time during the plain case is not counted)."
        + (" Some measured process exited during the timed epochs: its CPU is counted up to the last 0.5 s "
           "sample, so that CPU figure is a lower bound." if exited else ""))

    # -- storage bytes per epoch with a cache of half the dataset --------------------------------------
    label, size, batch = cases[0]
    root, n = roots[size]
    total = n * size
    half = total // 2
    k = half // size  # samples the never-evict cache can hold
    out()
    out(f"## Storage bytes read per epoch, cache = 50% of the dataset ({label} samples, {n} samples, "
        f"{total / 1e6:.0f} MB, capacity {half / 1e6:.0f} MB = {k} samples)")
    out()
    out("| epoch | hits | misses | storage MB | expected storage MB (dataset - cached) | cache MB |")
    out("|---|---|---|---|---|---|")
    with unstall.Sidecar(home=args.dir / "home-half", cache_capacity=half) as sidecar:
        ds = Dataset("bench-half", root=root, sidecar=sidecar)
        loader = DataLoader(ds, batch_size=batch, shuffle=True, num_workers=args.num_workers,
                            persistent_workers=True, collate_fn=touch_batch, seed=1)
        for e in range(3):
            for _ in loader:
                pass
            st = sidecar.stats().dataset(ds.name).epoch(e)
            expected = total if e == 0 else total - k * size
            mark = "" if st.storage_bytes == expected else " (differs)"
            out(f"| {e} | {st.hits} | {st.misses} | {st.storage_bytes / 1e6:.1f} | {expected / 1e6:.1f}{mark} | "
                f"{st.cache_bytes / 1e6:.1f} |")
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
