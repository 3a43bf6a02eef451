#!/usr/bin/env python
"""End-to-end benchmark: one training job's whole input loop, unstall vs a plain torchvision ImageFolder.

    python benchmarks/bench_e2e.py --images 6000 --epochs 2 --regime both --repeats 3 --out bench-e2e.md

Each batch: JPEG decode (PIL) + RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize in
``--num-workers`` DataLoader workers (persistent), then a tiny fixed step in the main process (the sum of
the batch, which reads every byte as a copy to the GPU would; ``--step-ms`` adds a sleep for a device step).

* unstall:  ``unstall.torch.DataLoader(unstall.torch.Dataset(name, root, loader=pil_loader, transform=tf))``
  with an embedded sidecar started for the run (its transport is whatever the shim picks: ``auto``,
  or ``--transport``, passed as ``$UNSTALL_TRANSPORT``);
* plain:    ``torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(root, transform=tf))``;

same seed, batch size and workers. Regimes (``--regime``):

a. ``cached``: every file in the page cache (a warm-up epoch first) and a sidecar cache larger than the
   dataset;
b. ``limited``: the data may keep only half the dataset in memory. ``--limit-method cgroup`` (the default
   where it works) runs each configuration in its own memory cgroup, limited to the peak memory of its
   processes other than page cache (measured in an untimed epoch) plus that share plus ``--headroom-mib``
   (less what the sidecar's cache holds): as if the job ran on a machine with just that much memory. So the
   plain loader's page cache holds at most share + headroom whenever its processes are at their peak; the
   sidecar's cache capacity is the same share. ``--limit-method fadvise`` (the fallback where cgroups are
   not usable) instead evicts, before each timed epoch, the pages of all files but a fixed half (plain) or
   of all files (unstall, whose own cache holds half). The table caption says which method ran and what it
   limits.

Each configuration runs in a child process (``--child``), so its processes can be put in a cgroup and its CPU
measured on its own (benchmarks/_cpu.py: the main process, its workers and fork server, and the sidecar JVM,
from /proc/<pid>/stat). Reported: samples/s over the timed epochs, unstall / plain, CPU seconds per timed
epoch, storage bytes read per epoch (/proc/<pid>/io read_bytes of the same processes), and the dataset
bytes in the page cache at the start and end of each timed epoch (mincore). On a shared machine use
``--repeats 3`` (the order alternates; medians and per-run ratios are printed).

The data: ``--images`` photo-like 500x375 JPEGs (~70 KB, quality 85, the generator of bench_prep.py) in 10
classes, generated once under ``--data``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "python-shim" / "src"))

from _cpu import CpuMeter  # noqa: E402
from _pagecache import MemCgroup, evict, probe, resident_bytes  # noqa: E402
from _report import header, write_out, transport_of  # noqa: E402

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
QUALITY = 85
CLASSES = 10
MB = 1e6


# ---------------------------------------------------------------------------------------------
# Data


def make_images(root: Path, n: int, seed: int = 2026) -> Path:
    """``n`` photo-like JPEGs in ``CLASSES`` class folders (bench_prep's generator), once."""
    import numpy as np
    from tqdm import tqdm

    from bench_prep import photo

    marker = root / f".complete-{n}-q{QUALITY}"
    if marker.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(seed)
    for i in tqdm(range(n), desc=f"generating {root}", unit="img", file=sys.stderr, mininterval=1.0):
        d = root / f"class{i % CLASSES}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"img{i:05d}.jpg").write_bytes(photo(rng, quality=QUALITY))
    marker.write_text("ok")
    return root


def dataset_files(root: Path) -> List[str]:
    """The files an ImageFolder of ``root`` reads, in its order."""
    from torchvision.datasets import ImageFolder

    return [p for p, _ in ImageFolder(str(root)).samples]


def make_transform(size: int) -> Any:
    from torchvision import transforms

    return transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                               transforms.ToTensor(), transforms.Normalize(MEAN, STD)])


# ---------------------------------------------------------------------------------------------
# One configuration, in its own process


def _session_transports(stats: Any, name: str) -> Optional[str]:
    """Transports of the sidecar's sessions on dataset ``name`` (newer sidecars list sessions)."""
    found = sorted({getattr(s, "transport", "") for s in (getattr(stats, "sessions", None) or {}).values()
                    if getattr(s, "dataset", "") == name} - {""})
    return "+".join(found) or None


def keep_freed_heap(worker_id: int) -> None:
    """worker_init_fn of the plain loader under ``--plain-heap kept``."""
    from unstall._alloc import tune_allocator

    tune_allocator()


def child(cfg: Dict[str, Any]) -> Dict[str, Any]:
    if cfg.get("cgroup"):
        # First thing: everything this process starts (workers, fork server, the sidecar JVM) inherits it.
        Path(cfg["cgroup"], "cgroup.procs").write_text(str(os.getpid()))
    os.environ.pop("UNSTALL_SIDECAR", None)  # always this run's own embedded sidecar, with this run's cache
    if cfg.get("transport"):
        os.environ["UNSTALL_TRANSPORT"] = cfg["transport"]

    import torch
    import torch.utils.data as tud
    from torchvision.datasets import ImageFolder
    from tqdm import tqdm

    torch.set_num_threads(1)  # the step's math on one core, as in the workers
    files = dataset_files(Path(cfg["data"]))
    tf = make_transform(cfg["size"])
    common = dict(batch_size=cfg["batch"], shuffle=True, num_workers=cfg["workers"], persistent_workers=True)
    sidecar = None
    name = "e2e"
    if cfg["loader"] == "unstall":
        import unstall
        import unstall.torch as ut

        # A fixed, pre-touched heap: the JVM's resident memory does not grow during the timed epochs (a
        # memory cgroup's limit is calibrated before them), as one would run a sidecar beside a trainer.
        sidecar = unstall.Sidecar(home=cfg["home"], cache_capacity=cfg["capacity"], memory_budget=cfg["budget"],
                                  java_options=["-Xms256m", "-Xmx256m", "-XX:+AlwaysPreTouch",
                                                f"-XX:MaxDirectMemorySize={int(cfg['budget']) // (1 << 20) + 256}m"])
        ds = ut.Dataset(name, root=cfg["data"], loader=ut.pil_loader, transform=tf, sidecar=sidecar)
        loader = ut.DataLoader(ds, seed=cfg["seed"], **common)
    else:
        ds = ImageFolder(cfg["data"], transform=tf)
        if cfg.get("plain_heap") == "kept":  # the allocator setting of unstall's workers (unstall/_alloc.py)
            common["worker_init_fn"] = keep_freed_heap
        loader = tud.DataLoader(ds, generator=torch.Generator().manual_seed(cfg["seed"]), **common)
    group = MemCgroup(Path(cfg["cgroup"]), cfg["cgroup_version"]) if cfg.get("cgroup") else None
    step_s = cfg["step_ms"] / 1000.0

    def epoch(desc: str) -> int:
        n = 0
        check = 0.0
        for images, _labels in tqdm(loader, desc=f"{cfg['label']}: {desc}", leave=False, mininterval=0.5,
                                   file=sys.stderr, unit="batch"):
            n += images.shape[0]
            check += float(images.sum())  # reads every byte of the batch
            if step_s:
                time.sleep(step_s)
        return n

    res: Dict[str, Any] = {"loader": cfg["loader"], "pid": os.getpid(), "epochs": []}
    res["resident_at_start"] = resident_bytes(files)
    t0 = time.perf_counter()
    epoch("warm-up epoch")
    res["warmup_s"] = time.perf_counter() - t0
    roots = [os.getpid(), sidecar.pid if sidecar is not None else None]

    def sync(tag: str, info: Dict[str, Any]) -> None:  # tell the driver, wait for its go
        print(f"{tag} {json.dumps(info)}", flush=True)
        if sys.stdin.readline().strip() != "GO":
            raise SystemExit("the driver went away")

    sync("WARM", {"sidecar_cache": sidecar.stats().cache.used_bytes if sidecar is not None else 0})
    if cfg["regime"] == "limited" and cfg["method"] == "cgroup":
        # Untimed, still without a limit: the driver measures the peak of the memory other than page cache.
        epoch("calibration epoch (no limit yet)")
        sync("CALIBRATED", {})
    keep: List[str] = []
    drop: List[str] = files
    if cfg["regime"] == "limited" and cfg["method"] == "fadvise":
        if cfg["loader"] == "plain":  # a fixed half stays cached: every other file in ImageFolder order
            keep, drop = files[::2], files[1::2]
        res["kept_bytes"] = sum(os.path.getsize(f) for f in keep)

    for e in range(1, cfg["epochs"] + 1):
        if cfg["regime"] == "limited" and cfg["method"] == "fadvise":
            evict(drop)  # outside the timing and the CPU count
        resident0 = resident_bytes(files)
        with CpuMeter(roots) as cpu:
            t0 = time.perf_counter()
            n = epoch(f"epoch {e}/{cfg['epochs']}")
            dt = time.perf_counter() - t0
        rec = {"samples": n, "seconds": dt, "cpu_s": cpu.seconds, "exited": cpu.exited,
               "read_bytes": cpu.read_bytes, "resident0": resident0, "resident": resident_bytes(files),
               "by_process": cpu.by_process}
        if group is not None:
            rec["group_file"] = group.file_bytes()
            rec["group_usage"] = group.usage()
        if sidecar is not None:
            st = sidecar.stats()
            es = st.dataset(name).epoch(e)
            rec.update(hits=es.hits, misses=es.misses, storage_bytes=es.storage_bytes,
                       sidecar_cache=st.cache.used_bytes)
        res["epochs"].append(rec)

    stats = None
    if hasattr(loader, "stats"):
        try:
            stats = loader.stats()
        except Exception:  # noqa: BLE001 - a report detail; never fail the run for it
            stats = None
    transport = transport_of(stats, loader, ds)
    if transport is None and sidecar is not None:
        try:
            transport = _session_transports(sidecar.stats(), name)
        except Exception:  # noqa: BLE001
            pass
    res["transport"] = transport
    loader = None  # stops the persistent workers
    if sidecar is not None:
        sidecar.close()
    return res


# ---------------------------------------------------------------------------------------------
# Driver


class LimitController(threading.Thread):
    """Sets a cgroup's limit to its processes' peak memory other than page cache, plus ``allowance``.

    Runs in the driver, outside the cgroup (never stalled by it; its CPU is not the job's). Every
    ``interval`` s it reads the group's memory other than page cache (usage - active_file - inactive_file)
    and keeps its peak. ``engage()`` sets the limit to peak + allowance; from then on the limit only rises,
    with the peak (a JVM that compiles more code, a heap that grows). So at the moments the processes use the
    most memory, the page cache holds at most ``allowance``; in between it can refill by what is read until
    the next such moment."""

    def __init__(self, group: MemCgroup, allowance: int, interval: float = 0.02) -> None:
        super().__init__(name="limit-controller", daemon=True)
        self.group = group
        self.allowance = allowance
        self.interval = interval
        self.stop = threading.Event()
        self.peak = 0
        self.engaged = False
        self.limit: Optional[int] = None
        self.raises = 0
        self.errors = 0
        self.file_samples: List[int] = []

    def step(self) -> None:
        file = self.group.file_bytes()
        self.peak = max(self.peak, self.group.usage() - file)
        if not self.engaged:
            return
        self.file_samples.append(file)
        target = self.peak + self.allowance
        if self.limit is None or target > self.limit:
            try:
                self.group.set_limit(target)  # the first one reclaims the group's page cache down to it, here
                self.raises += self.limit is not None
                self.limit = target
            except OSError:  # EBUSY: could not reclaim down to it this time; again at the next tick
                self.errors += 1

    def engage(self, peak: int) -> None:
        self.peak = max(self.peak, peak)
        self.engaged = True
        self.step()

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            try:
                self.step()
            except OSError:
                self.errors += 1


def run_config(cfg: Dict[str, Any], group: Optional[MemCgroup]) -> Dict[str, Any]:
    if group is not None:
        cfg = dict(cfg, cgroup=str(group.path), cgroup_version=group.version)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(cfg)]
    # stderr is inherited: progress bars and logs
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    result = None
    ctl: Optional[LimitController] = None
    exact_peak = False
    tail: List[str] = []

    def go() -> None:
        proc.stdin.write("GO\n")
        proc.stdin.flush()

    try:
        for line in proc.stdout:
            tag, _, rest = line.partition(" ")
            if tag == "WARM":  # caches full; next: the calibration epoch (cgroup method) or the timed ones
                warm = json.loads(rest)
                if group is not None:
                    # The data share: the page cache gets what the sidecar's cache does not hold.
                    allowance = max(4 << 20, cfg["share"] + cfg["headroom"] - warm["sidecar_cache"])
                    ctl = LimitController(group, allowance)
                    exact_peak = group.reset_peak()  # v1: the kernel's exact peak from here on
                    ctl.step()
                    ctl.start()
                go()
            elif tag == "CALIBRATED":  # after a full epoch without a limit: engage it
                kernel_peak = group.peak() if exact_peak else None  # the page cache stayed put: all was cached
                ctl.engage(kernel_peak - group.file_bytes() if kernel_peak is not None else 0)
                ctl.file_samples.clear()
                go()
            elif tag == "RESULT":
                result = json.loads(rest)
            else:
                tail = (tail + [line])[-50:]
        proc.wait()
    finally:
        if ctl is not None:
            ctl.stop.set()
            ctl.join()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if group is not None:
        kills = group.oom_kills()
        if result is not None:
            result["oom_kills"] = kills
            if ctl is not None:
                fs = ctl.file_samples or [0]
                result["controller"] = {"allowance": ctl.allowance, "raises": ctl.raises, "errors": ctl.errors,
                                        "limit": ctl.limit, "peak": ctl.peak, "max_file": max(fs),
                                        "mean_file": sum(fs) / len(fs)}
        if proc.returncode != 0 and kills:
            raise SystemExit(f"{cfg['label']}: the cgroup's OOM killer ended a process ({kills}x): "
                             f"raise --headroom-mib")
    if proc.returncode != 0 or result is None:
        raise SystemExit(f"{cfg['label']} failed (exit {proc.returncode}); its output:\n{''.join(tail)}")
    return result


def _median(xs: List[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def summarize(res: Dict[str, Any]) -> Dict[str, Any]:
    eps = res["epochs"]
    n = len(eps)
    s = {
        "rate": sum(e["samples"] for e in eps) / sum(e["seconds"] for e in eps),
        "cpu": sum(e["cpu_s"] for e in eps) / n,
        "exited": sum(e["exited"] for e in eps),
        "read_mb": (sum(e["read_bytes"] for e in eps) / n / MB) if all(e["read_bytes"] is not None for e in eps)
        else None,
        "resident_mb": (sum(e["resident"] for e in eps) / n / MB) if all(e["resident"] is not None for e in eps)
        else None,
        "resident0_mb": (sum(e["resident0"] for e in eps) / n / MB) if all(e["resident0"] is not None for e in eps)
        else None,
        "transport": res.get("transport"),
    }
    if "hits" in eps[0]:
        hits = sum(e["hits"] for e in eps)
        total = hits + sum(e["misses"] for e in eps)
        s["hit_pct"] = 100.0 * hits / total if total else 0.0
        s["sidecar_storage_mb"] = sum(e["storage_bytes"] for e in eps) / n / MB
        s["sidecar_cache_mb"] = eps[-1]["sidecar_cache"] / MB
    return s


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description="unstall vs torchvision ImageFolder: the whole input loop of one job")
    p.add_argument("--images", type=int, default=3000, help="images in the generated dataset (10 classes)")
    p.add_argument("--epochs", type=int, default=2, help="timed epochs, after one warm-up epoch")
    p.add_argument("--regime", choices=("cached", "limited", "both"), default="both")
    p.add_argument("--out", type=Path, default=None, help="also write the tables here")
    p.add_argument("--data", type=Path, default=Path.home() / ".cache" / "unstall" / "bench-e2e",
                   help="where the generated dataset lives (one folder per --images)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--image-size", type=int, default=224, help="RandomResizedCrop size")
    p.add_argument("--step-ms", type=float, default=0.0, help="a sleep per batch in the main process (device step)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1, help="runs of each pair (order alternates); medians reported")
    p.add_argument("--limit-method", choices=("auto", "cgroup", "fadvise"), default="auto",
                   help="how regime 'limited' bounds the page cache (auto: cgroup where it works)")
    p.add_argument("--headroom-mib", type=int, default=32,
                   help="cgroup method: memory on top of each configuration's own + the share (both loaders)")
    p.add_argument("--transport", default=None, help="set $UNSTALL_TRANSPORT for the unstall runs (auto|shm|flight)")
    p.add_argument("--plain-heap", choices=("system", "kept"), default="system",
                   help="kept: the plain loader's workers keep freed heap for the next batch, as unstall's do "
                        "(unstall/_alloc.py), to separate that setting's gain from the data path's")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.child is not None:
        res = child(json.loads(args.child))
        print("RESULT " + json.dumps(res), flush=True)
        return 0

    import torch  # noqa: F401 - for the header's versions
    import torchvision  # noqa: F401

    import unstall  # noqa: F401

    root = make_images(args.data / f"n{args.images}", args.images)
    files = dataset_files(root)
    total = sum(os.path.getsize(f) for f in files)
    share = total // 2
    regimes = ["cached", "limited"] if args.regime == "both" else [args.regime]

    method = None
    why_not = ""
    if "limited" in regimes:
        if args.limit_method in ("auto", "cgroup"):
            g, why_not = probe()
            if g is not None:
                method = "cgroup"
            elif args.limit_method == "cgroup":
                raise SystemExit(f"--limit-method cgroup: a memory cgroup cannot be used here: {why_not}")
        if method is None:
            method = "fadvise"

    homes = Path(tempfile.mkdtemp(prefix="homes-", dir=args.data))
    base = dict(data=str(root), size=args.image_size, batch=args.batch_size, workers=args.num_workers,
                seed=args.seed, epochs=args.epochs, step_ms=args.step_ms, share=share,
                headroom=args.headroom_mib << 20, transport=args.transport, method=method,
                plain_heap=args.plain_heap)
    results: Dict[str, Dict[str, List[Dict[str, Any]]]] = {r: {"unstall": [], "plain": []} for r in regimes}
    cgroup_desc = ""
    runs = [(r, i, ld) for r in regimes for i in range(args.repeats)
            for ld in (("plain", "unstall") if i % 2 == 0 else ("unstall", "plain"))]
    try:
        for k, (regime, rep, which) in enumerate(runs, 1):
            label = f"[{k}/{len(runs)}] {regime} {which}" + (f" (repeat {rep + 1})" if args.repeats > 1 else "")
            print(f"{label} ...", file=sys.stderr, flush=True)
            if regime == "cached":
                capacity = total + (64 << 20)  # all of it, with room to spare
            else:
                capacity = share  # the same share the page cache gets
            cfg = dict(base, loader=which, regime=regime, label=label, capacity=capacity,
                       budget=capacity + (512 << 20), home=str(homes / f"run{k}"))
            group = None
            if regime == "limited":
                evict(files)  # start cold; with cgroups, every page the run reads is then charged to it
                if method == "cgroup":
                    group = MemCgroup.create(f"unstall-e2e-{os.getpid()}-{k}")
                    cgroup_desc = group.describe()
            try:
                res = run_config(cfg, group)
            finally:
                if group is not None:
                    group.remove()
            results[regime][which].append(res)
    finally:
        shutil.rmtree(homes, ignore_errors=True)

    lines: List[str] = []

    def out(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    out(f"## End-to-end input loop: unstall vs torchvision ImageFolder ({args.images} JPEGs, {total / MB:.0f} MB)")
    out()
    for line in header():
        out(line)
    out(f"- job: PIL decode + RandomResizedCrop({args.image_size}) + RandomHorizontalFlip + ToTensor + Normalize "
        f"in {args.num_workers} persistent DataLoader workers, batch {args.batch_size}, seed {args.seed}; per batch "
        f"the main process sums the tensor" + (f" and sleeps {args.step_ms:g} ms" if args.step_ms else "")
        + f"; 1 warm-up epoch, then {args.epochs} timed epoch(s)"
        + (f"; {args.repeats} runs per loader, alternating order, medians" if args.repeats > 1 else ""))
    out("- heap: unstall's workers keep freed heap memory for the next batch (unstall/_alloc.py); the plain "
        "loader's workers " + ("do the same here (`--plain-heap kept`)" if args.plain_heap == "kept"
                               else "run with glibc's defaults (`--plain-heap kept` gives them the same setting)"))
    out(f"- data: {args.images} photo-like 500x375 JPEGs (quality {QUALITY}, mean {total / len(files) / 1e3:.0f} KB) "
        f"in {CLASSES} classes, {total / MB:.1f} MB, under {root}")
    out()

    for regime in regimes:
        if regime == "cached":
            out(f"### a. Page-cached: every file in the page cache after the warm-up epoch; sidecar cache "
                f"{(total + (64 << 20)) / MB:.0f} MB (the dataset + 64 MiB)")
        else:
            out(f"### b. Memory for data = half the dataset ({share / MB:.1f} MB): method `{method}`")
        out()
        out("| loader | transport | samples/s | unstall / plain | CPU s/epoch | CPU unstall/plain | "
            "storage MB/epoch | dataset MB in page cache (epoch start / end) | notes |")
        out("|---|---|---|---|---|---|---|---|---|")
        us = [summarize(r) for r in results[regime]["unstall"]]
        ps = [summarize(r) for r in results[regime]["plain"]]
        ratios = [u["rate"] / q["rate"] for u, q in zip(us, ps)]
        cpu_ratios = [u["cpu"] / q["cpu"] for u, q in zip(us, ps)]

        def fmt(x: Optional[float], spec: str = ".1f") -> str:
            return "n/a" if x is None else format(x, spec)

        for which, ss in (("unstall", us), ("plain", ps)):
            rate = _median([s["rate"] for s in ss])
            cpu = _median([s["cpu"] for s in ss])
            read = None if any(s["read_mb"] is None for s in ss) else _median([s["read_mb"] for s in ss])
            resid = None if any(s["resident_mb"] is None for s in ss) else _median([s["resident_mb"] for s in ss])
            resid0 = None if any(s["resident0_mb"] is None for s in ss) else _median([s["resident0_mb"] for s in ss])
            notes = []
            if which == "unstall":
                notes.append(f"sidecar cache {_median([s['sidecar_cache_mb'] for s in ss]):.1f} MB, "
                             f"hits {_median([s['hit_pct'] for s in ss]):.0f}%, sidecar read "
                             f"{_median([s['sidecar_storage_mb'] for s in ss]):.1f} MB/epoch")
                transport = ss[0]["transport"] or "not reported"
                loader_name = "unstall.torch.DataLoader"
                ratio, cratio = f"{_median(ratios):.2f}x", f"{_median(cpu_ratios):.2f}x"
                if len(ratios) > 1:
                    notes.append("runs: " + ", ".join(f"{r:.2f}x" for r in ratios))
            else:
                transport = "files (open/read)"
                loader_name = "torch DataLoader + ImageFolder"
                ratio = cratio = ""
            if any(s["exited"] for s in ss):
                notes.append("a process exited mid-epoch: CPU is a lower bound")
            if regime == "limited" and method == "cgroup":
                kills = sum(r.get("oom_kills", 0) for r in results[regime][which])
                c = results[regime][which][0]["controller"]
                notes.append(f"limit {c['limit'] / MB:.0f} MB = peak own memory {c['peak'] / MB:.0f} + allowance "
                             f"{c['allowance'] / MB:.1f} (raised {c['raises']}x); cgroup page cache mean "
                             f"{c['mean_file'] / MB:.1f}, max {c['max_file'] / MB:.1f} MB"
                             + (f", OOM kills {kills}" if kills else ""))
            if regime == "limited" and method == "fadvise" and which == "plain":
                notes.append(f"kept in page cache: {results[regime][which][0]['kept_bytes'] / MB:.1f} MB")
            out(f"| {loader_name} | {transport} | {rate:,.0f} | {ratio} | {cpu:.2f} | {cratio} | {fmt(read)} | "
                f"{fmt(resid0)} / {fmt(resid)} | {'; '.join(notes)} |")
        out()
        if regime == "cached":
            out("Both loaders read from memory: the plain one from the page cache (warm after its warm-up epoch), "
                "unstall from the sidecar's cache, which holds the whole dataset after its warm-up epoch.")
        elif method == "cgroup":
            out(f"Method: {cgroup_desc}. Each configuration runs in its own such cgroup: its process writes its "
                "pid to `cgroup.procs` before importing anything, so its DataLoader workers, the fork server "
                "and (for unstall) the sidecar JVM are in it too. The dataset's pages are evicted first "
                "(`posix_fadvise(POSIX_FADV_DONTNEED)` on every file), so every page a configuration reads is "
                "charged to its cgroup. A warm-up epoch without a limit fills the caches; in an untimed "
                "calibration epoch, still without a limit, the driver (outside the cgroup) measures the peak of "
                "the cgroup's memory other than page cache (usage − (active_file + inactive_file), every 20 ms, "
                "and v1's exact memory.max_usage_in_bytes: heaps, the JVM, batches in flight and the sidecar's "
                "cache in shared memory, kernel memory). It then sets the limit to that peak plus an allowance: "
                f"the share ({share / MB:.1f} MB, half the dataset) + a headroom ({args.headroom_mib} MiB, the "
                "same for both), less what the sidecar's cache holds; during the timed epochs it raises the limit "
                "if the peak grows (never lowers it). There is no swap, so at the limit the kernel reclaims page "
                "cache only: whenever the processes are at their peak memory, the plain loader's page cache "
                "holds at most the share + headroom (its kernel LRU picks which pages), and in between it can "
                "refill only by what is read until the next peak: as on a machine whose memory is the "
                "processes' peak plus the share. "
                f"unstall's sidecar cache capacity equals the share ({share / MB:.1f} MB), so unstall gets no "
                "more memory for data than the page cache does: its own page cache gets only the headroom. "
                "Limited: all memory charged to the configuration's processes (anonymous, page cache, kernel); "
                "not CPU, not I/O bandwidth. Storage MB/epoch: /proc/<pid>/io read_bytes of the "
                "configuration's processes (reads that missed the page cache, readahead included).")
        else:
            out("Method: `posix_fadvise(POSIX_FADV_DONTNEED)`"
                + (f" (memory cgroups are not usable here: {why_not})" if why_not else "")
                + ". Before each timed epoch the benchmark evicts, for the plain loader, the pages of every "
                "other file (a fixed half of the dataset stays cached), and for unstall the pages of all files "
                f"(its sidecar cache, capacity {share / MB:.1f} MB = half the dataset, holds the rest). This "
                "simulates a page cache that keeps a fixed half of the dataset, an idealized never-evicting "
                "cache (like MinIO): kinder to the plain loader than a real kernel LRU under random access. "
                "It does not bound any process's memory.")
        out()
    write_out(args.out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
