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

    python benchmarks/bench_loader.py --echo 2 --out echo.md   # only the data-echoing table

With ``--echo E``: a loop whose "accelerator" is a fixed ``--step-ms`` sleep per batch, fed by 2 workers
whose prep burns ``--prep-rounds`` of SHA-256 over each sample (a CPU-bound prep slower than the step), with
echo=1 and echo=E (batch level, then example level) in the same run: the data stall and the fresh samples/s
(``loader.stats()``), as ratios to echo=1.

Not a test: numbers depend on the machine. The plain baseline is NOT reading from disk after its first
(warm-up) epoch: the OS page cache holds the files (dropping it needs root), so the comparison is
"unstall's cache over Flight" vs "page cache + open/read per sample".
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import statistics
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
from _report import header, write_out, transport_of  # noqa: E402


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


def keep_freed_heap(worker_id: int) -> None:
    """worker_init_fn of the second plain baseline: the allocator setting unstall applies in its workers."""
    from unstall._alloc import tune_allocator

    tune_allocator()


def touch_batch(batch: List[Tuple[bytes, Any]]) -> Tuple[int, int]:
    """collate_fn doing minimal work: (samples, bytes) and one byte read per sample."""
    s = 0
    nbytes = 0
    for payload, _ in batch:
        s += payload[0]
        nbytes += len(payload)
    return len(batch), nbytes


PLAIN = "plain open/read (page cache)"
PLAIN_TUNED = "plain open/read, workers' heap kept (as unstall's)"


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


def timed_epochs(loader: tud.DataLoader, epochs: int, desc: str, cpu_pids: List[Optional[int]],
                 cpu_exclude: List[Optional[int]] = ()) -> Run:
    """``epochs`` timed epochs of an already warm loader, with the CPU of ``cpu_pids`` and their descendants
    (persistent workers, fork server) measured around them."""
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


class Prep:
    """A CPU-bound stand-in for decode and augmentation: ``rounds`` SHA-256 passes over the sample."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds

    def __call__(self, data: memoryview) -> int:
        h = b""
        for _ in range(self.rounds):
            h = hashlib.sha256(data).digest()
        return h[0]


def echo_table(args: argparse.Namespace, out: Callable[..., None]) -> None:
    """Stall and fresh samples/s with echo=1 and echo=E, the same loop and data, interleaved runs."""
    size, batch = 20_000, 32
    root = args.dir / f"echo-s{size}"
    n = generate(root, size, 20_000_000, seed=size)
    settings = [(1, "batch"), (args.echo, "batch"), (args.echo, "example")]
    out(f"## Data echoing: a {args.step_ms:g} ms step fed by {args.num_workers} workers with a CPU-bound prep "
        f"({platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, unstall {unstall.__version__})")
    out()
    for line in header():
        out(line)
    out()
    out("| echo | level | steps/s | stall ms/step | stall % | fresh samples/s | samples seen/s | "
        "stall/step x echo=1 | steps/s x echo=1 | fresh samples/s x echo=1 |")
    out("|---|---|---|---|---|---|---|---|---|---|")
    rows: dict[Tuple[int, str], List[Tuple[float, float, float, float, float]]] = {k: [] for k in settings}
    with unstall.Sidecar(home=args.dir / "home-echo", cache_capacity=n * size + (64 << 20)) as sidecar:
        ds = Dataset("bench-echo", root=root, sidecar=sidecar, loader=Prep(args.prep_rounds))
        loaders = {k: DataLoader(ds, batch_size=batch, shuffle=True, seed=0, num_workers=args.num_workers,
                                 persistent_workers=True, echo=k[0], echo_level=k[1]) for k in settings}
        for loader in loaders.values():
            for _ in loader:  # warm-up: the cache filled, the workers started
                pass
        for r in range(args.repeats):
            for k in settings[r % len(settings):] + settings[:r % len(settings)]:
                for _ in range(args.epochs):
                    t0 = time.perf_counter()
                    for _ in loaders[k]:
                        time.sleep(args.step_ms / 1000)  # the accelerator's step: no CPU, like a GPU kernel
                    elapsed = time.perf_counter() - t0
                    st = loaders[k].stats()
                    rows[k].append((st.batches / elapsed, st.wait_s / st.batches, st.wait_s / elapsed, st.fresh_samples / elapsed,
                                    st.samples_seen / elapsed))
    med = {k: [statistics.median(col) for col in zip(*v)] for k, v in rows.items()}
    base = med[(1, "batch")]
    for k in settings:
        steps, stall, frac, fresh, seen = med[k]
        out(f"| {k[0]} | {k[1]} | {steps:.1f} | {1000 * stall:.1f} | {100 * frac:.0f}% | {fresh:,.0f} | {seen:,.0f} | "
            f"{stall / base[1] if base[1] else float('nan'):.2f}x | {steps / base[0]:.2f}x | {fresh / base[3]:.2f}x |")
    out()
    out(f"{n} samples of {size // 1000} KB from the sidecar's cache, batch {batch}; prep: {args.prep_rounds} SHA-256 "
        f"passes per sample in {args.num_workers} persistent DataLoader workers; step: a {args.step_ms:g} ms sleep per "
        f"batch (the accelerator). Medians of {args.repeats} x {args.epochs} epochs per setting, settings interleaved. "
        "Stall: time in next() (loader.stats().wait_s); fresh samples: those fetched and prepped.")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="unstall vs plain file reads in a PyTorch loop")
    p.add_argument("--dir", type=Path, default=Path.home() / ".cache" / "unstall" / "bench")
    p.add_argument("--mb-per-case", type=int, default=200, help="dataset size per sample-size case (MB)")
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per run")
    p.add_argument("--warmup-epochs", type=int, default=3,
                   help="untimed epochs per loader first (fill the caches, start workers, warm the sidecar's JIT "
                        "as in a long-running sidecar)")
    p.add_argument("--repeats", type=int, default=3, help="runs per loader, interleaved; medians are reported")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="also write the tables here")
    p.add_argument("--echo", type=int, default=None, help="only the data-echoing table: echo=1 vs echo=E")
    p.add_argument("--step-ms", type=float, default=20.0, help="--echo: the simulated accelerator step per batch")
    p.add_argument("--prep-rounds", type=int, default=60, help="--echo: SHA-256 passes per sample (the prep's cost)")
    args = p.parse_args(argv)
    if args.echo is not None:
        lines: List[str] = []

        def echo_out(line: str = "") -> None:
            print(line, flush=True)
            lines.append(line)

        echo_table(args, echo_out)
        write_out(args.out, lines)
        return 0

    cases = [("110 KB", 110_000, 64), ("1 MB", 1_000_000, 8)]
    roots = {}
    for _label, size, _ in cases:
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
    out("| sample size | samples | loader | transport | samples/s | MB/s | x plain | CPU s/epoch | CPU x plain |")
    out("|---|---|---|---|---|---|---|---|---|")
    exited = False
    with unstall.Sidecar(home=args.dir / "home-warm", cache_capacity=capacity,
                         memory_budget=capacity + (512 << 20)) as sidecar:
        for label, size, batch in cases:
            root, n = roots[size]
            common = dict(batch_size=batch, shuffle=True, num_workers=args.num_workers, persistent_workers=True,
                          collate_fn=touch_batch)
            # unstall twice: the default loader (each payload copied into a bytes object, as read() does) and
            # loader=memoryview (the payload read in place, in the sidecar's shared memory)
            ds_bytes = Dataset(f"bench-{size}", root=root, sidecar=sidecar)
            ds_view = Dataset(f"bench-{size}", sidecar=sidecar, loader=memoryview)
            loaders = {
                "unstall, bytes (default loader)": DataLoader(ds_bytes, seed=0, **common),
                "unstall, in place (loader=memoryview)": DataLoader(ds_view, seed=0, **common),
                PLAIN: tud.DataLoader(PlainFiles(root), generator=torch.Generator().manual_seed(0), **common),
                # the same baseline with unstall's worker allocator setting (unstall/_alloc.py), so the rows
                # show what the data path gains apart from not handing freed heap back to the kernel
                PLAIN_TUNED: tud.DataLoader(PlainFiles(root), generator=torch.Generator().manual_seed(0),
                                            worker_init_fn=keep_freed_heap, **common),
            }
            # CPU: this process, its workers (and fork server), and the sidecar JVM for unstall; the sidecar's
            # idle time is not counted for plain
            pids = {k: ([os.getpid(), sidecar.pid], []) if k.startswith("unstall") else ([os.getpid()], [sidecar.pid])
                    for k in loaders}
            for name, loader in loaders.items():
                for w in range(args.warmup_epochs):
                    _epoch(loader, f"{label} {name}: warm-up {w + 1}/{args.warmup_epochs}")
            runs: dict[str, List[Run]] = {k: [] for k in loaders}
            names = list(loaders)
            for r in range(args.repeats):
                for name in names[r % len(names):] + names[:r % len(names)]:  # rotate the order
                    run = timed_epochs(loaders[name], args.epochs, f"{label} {name} run {r + 1}", *pids[name])
                    runs[name].append(run)
                    exited = exited or bool(run.cpu_exited)
            st = sidecar.stats().dataset(ds_bytes.name)
            warm = st.total.storage_bytes == st.epoch(0).storage_bytes  # only the first epoch read storage
            plain_name = PLAIN
            rate = {k: statistics.median(x.samples / x.seconds for x in v) for k, v in runs.items()}
            mbs = {k: statistics.median(x.nbytes / x.seconds / 1e6 for x in v) for k, v in runs.items()}
            cpu = {k: statistics.median(x.cpu_s / args.epochs for x in v) for k, v in runs.items()}
            for name in names:
                transport = runs[name][-1].transport or ("files" if name in (PLAIN, PLAIN_TUNED) else "not reported")
                rel = "" if name == plain_name else f"{rate[name] / rate[plain_name]:.2f}x"
                crel = "" if name == plain_name else f"{cpu[name] / cpu[plain_name]:.2f}x"
                note = "" if name == plain_name or warm else " (NOT all hits)"
                out(f"| {label} | {n} | {name}{note} | {transport} | {rate[name]:,.0f} | {mbs[name]:,.0f} | {rel} | "
                    f"{cpu[name]:.3f} | {crel} |")
            for loader in loaders.values():
                del loader
    out()
    out(f"Medians of {args.repeats} runs of {args.epochs} timed epochs per loader, the loaders' order rotating "
        f"between runs, after {args.warmup_epochs} untimed epochs each (unstall's cache filled, the page cache "
        "warm, persistent workers started, the sidecar's JIT warm as in a long-running sidecar). The plain "
        "baseline reads from the OS page cache (dropping it needs root); unstall serves from its own cache "
        "(transport: what the loader reports). CPU s/epoch: user + system CPU seconds per timed epoch of all "
        "the loader's processes together, from /proc/<pid>/stat: the main process and its persistent "
        "DataLoader workers, plus the sidecar JVM for unstall. unstall's DataLoader workers keep freed heap "
        "memory for the next batch instead of handing it back to the kernel (unstall/_alloc.py); the row "
        f"'{PLAIN_TUNED}' applies the same setting to the plain loader's workers, so comparing against it "
        "shows what the data path itself gains."
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
    write_out(args.out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
