#!/usr/bin/env python3
"""The hybrid split, alone: one job's PrepLoader read as fast as it goes, its batches prepared by the sidecar's cores
only, by the job's device only, and split between them from measured rates (``cpu_load="auto"``).

Usage:
    python benchmarks/bench_hybrid.py [--toy] [--device cpu|cuda] [--sidecar-cpus 1] [--trainer-cpus 1]
        [--batches 40] [--repeats 2] [--json PATH] [bench_gpu.py's data options: --images --size --jpeg --data
        --cache-dir --batch --crop]

No model: the rows measure what each way of preparing batches delivers to the training loop, in one run on one
sidecar, each mode ``--repeats`` times in rotation. ``sidecar``: ``decode()``, the sidecar decodes, crops and flips
on its cores (``--sidecar-cpus``), the loader normalizes on the device; ``device``: ``decode(device="mixed")``, the
sidecar only fetches and the job decodes on its device (on a CPU: the job's cores, ``--trainer-cpus``); ``hybrid``:
``decode(device="mixed", cpu_load="auto")``, the sidecar prepares its share of each batch and the device the rest,
the share set by the sidecar from the member's measured decode and step and its own. With no training step the
split is the input-bound one (both sides take as long per batch), so the hybrid row can approach the sum of the two
others. The table also gives the share the sidecar settled on. On a CPU (``--device cpu``) the "device" is the
job's own cores: the row shows the split at work where the two sides are two sets of cores, not a GPU figure."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_gpu import (DATASET, add_photo_options, dataset_dir, git_commit, gpu_name, parse_job_args,  # noqa: E402
                       pin_trainer, prep_loader, sidecar_java, sync)
from _cpu import self_cpu  # noqa: E402
from _report import header  # noqa: E402

FULL = dict(batch=64, batches=40, warmup=8, crop=224, images=1280, size="500x375")
TOY = dict(batch=8, batches=6, warmup=3, crop=64, images=48, size="64x48")
MODES = {"sidecar": "decode(): the sidecar's cores prepare every sample",
         "device": "decode(device='mixed'): the device decodes every sample",
         "hybrid": "decode(device='mixed', cpu_load='auto'): split from measured rates"}


def measure(mode: str, args: argparse.Namespace, sidecar: Any, dev: Any, seed: int) -> dict[str, Any]:
    """One run of ``mode``: warm-up batches, then ``args.batches`` timed; the hybrid's split from the group's stats."""
    mixed = mode != "sidecar"
    loader, batches = prep_loader(args.crop, args.batch, seed, 1, dev, True, mixed,
                                  cpu_load="auto" if mode == "hybrid" else None, sidecar=sidecar)
    try:
        for _ in range(args.warmup):
            next(batches)
        sync(dev)
        t0, c0 = time.perf_counter(), self_cpu()
        for _ in range(args.batches):
            next(batches)
        sync(dev)
        wall, cpu = time.perf_counter() - t0, self_cpu() - c0
        stats = loader.membership.group_stats()
        tuned = stats.get("autotune", {})
        split = dict(stats["hybrid"], why=_last_split(stats), cpu_s_per_batch=tuned.get("cpu_seconds_per_batch"),
                     threads=tuned.get("threads")) if mode == "hybrid" else None
    finally:
        batches.close()  # type: ignore[attr-defined]
        loader.close()
    return {"images_per_s": args.batches * args.batch / wall, "wall_s": wall, "job_cpu_s": cpu, "hybrid": split}


def _last_split(stats: dict[str, Any]) -> str:
    """The autotuner's last decision on the split (its rates and target), from a group's stats; "" if none."""
    decisions = [d for d in stats.get("autotune", {}).get("decisions", []) if d.get("what") == "cpu_rows"]
    return f"{decisions[-1]['from']} -> {decisions[-1]['to']}: {decisions[-1]['why']}" if decisions else ""


def _sidecar_rates(h: dict[str, Any]) -> str:
    """A hybrid run's view of the sidecar: the split model's ``a`` (the time any of its producers was preparing, per
    sample prepared), its CPU per sample it prepared (``cpu_seconds_per_batch`` over the batch's ``cpu_rows``) and
    its decode threads: ``a`` well below the CPU per sample over the threads would credit the sidecar with more than
    it sustains."""
    a, cpu, rows = h.get("sidecar_s_per_sample"), h.get("cpu_s_per_batch"), h.get("cpu_rows")
    per_sample = f"{1e3 * cpu / rows:.2f}" if cpu and rows else "-"
    return f"{1e3 * a:.2f} / {per_sample} / {h.get('threads')}" if a else f"- / {per_sample} / {h.get('threads')}"


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--toy", action="store_true", help="tiny everything, so that it runs on a CPU in seconds")
    ap.add_argument("--batch", type=int, help="batch size (full 64, toy 8)")
    ap.add_argument("--batches", type=int, help="measured batches per run (full 40, toy 6)")
    ap.add_argument("--warmup", type=int, help="batches per run before timing (full 8, toy 3): the split settles")
    ap.add_argument("--crop", type=int, help="RandomResizedCrop's size (full 224, toy 64)")
    add_photo_options(ap, "full 1280, toy 48", "full 500x375, toy 64x48")
    ap.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    ap.add_argument("--sidecar-cpus", type=int, help="run the sidecar on the first N cores only (taskset)")
    ap.add_argument("--trainer-cpus", type=int, help="this process on the N cores after the sidecar's")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each mode, in rotation (default 2)")
    ap.add_argument("--json", type=Path, help="also write the rows and the run's header as JSON")
    return parse_job_args(ap, argv, (), TOY, FULL, ("batch", "batches", "crop", "images", "repeats"))


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    pin_trainer(args)
    import torch
    import unstall

    dev = torch.device(args.device)
    data = dataset_dir(args)
    home = Path(tempfile.mkdtemp(prefix="unstall-bench-hybrid-"))
    order = [mode for n in range(args.repeats) for mode in (list(MODES)[n % 3:] + list(MODES)[:n % 3])]
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    with unstall.Sidecar(home=home, java=sidecar_java(args, home)) as sidecar:
        sidecar.register_dataset(DATASET, data)
        for n, mode in enumerate(order, 1):
            r = measure(mode, args, sidecar, dev, seed=n)
            runs[mode].append(r)
            print(f"[{n}/{len(order)}] {MODES[mode]}: {r['images_per_s']:,.0f} images/s", file=sys.stderr, flush=True)
    rows = []
    for mode, name in MODES.items():
        images = args.batches * args.batch * len(runs[mode])
        wall = sum(r["wall_s"] for r in runs[mode])
        rows.append({"mode": mode, "row": name, "images_per_s": images / wall,
                     "runs": [r["images_per_s"] for r in runs[mode]],
                     "job_cpu_ms_per_image": 1e3 * sum(r["job_cpu_s"] for r in runs[mode]) / images,
                     "hybrid": [r["hybrid"] for r in runs[mode] if r["hybrid"] is not None]})
    rate = {r["mode"]: r["images_per_s"] for r in rows}
    best, both = max(rate["sidecar"], rate["device"]), rate["sidecar"] + rate["device"]
    pins = ", ".join(filter(None, [f"the sidecar on {args.sidecar_cpus} of {os.cpu_count()} cores (taskset)"
                                   if args.sidecar_cpus else "", f"the job on {args.trainer_cpus} cores of its own"
                                   if args.trainer_cpus else ""]))
    head = header() + [f"- device: {args.device}" + (f" ({gpu_name(dev)})" if dev.type == "cuda" else ""), f"- commit: {git_commit()}",
                       f"- one job, batch {args.batch}, crop {args.crop}, {args.warmup} warm-up + {args.batches} "
                       f"measured batches per run, no model; data {data}; each mode {args.repeats} times in rotation"
                       + (f"; {pins}" if pins else "")]
    lines = ["# the hybrid split, one job", "", *head, "",
             "| row | images/s | each run | the job's CPU ms per image | the sidecar's share of each batch (cpu_rows / "
             "batch), samples it prepared / left encoded | the split's a, ms per sample / the sidecar's CPU ms per "
             "sample it prepared / its decode threads |", "|---|---|---|---|---|---|"]
    for r in rows:
        share = "; ".join(f"{h['cpu_rows']} / {h['batch_size']}, {h['samples_prepared']:,} / "
                          f"{h['samples_encoded']:,}" for h in r["hybrid"]) or "-"
        rates = "; ".join(_sidecar_rates(h) for h in r["hybrid"]) or "-"
        lines.append(f"| {r['row']} | {r['images_per_s']:,.0f} | {', '.join(f'{v:,.0f}' for v in r['runs'])} | "
                     f"{r['job_cpu_ms_per_image']:.2f} | {share} | {rates} |")
    lines += ["", f"hybrid / the faster of the two: **{rate['hybrid'] / best:.2f}x**; hybrid / their sum: "
              f"{rate['hybrid'] / both:.2f}", "", "The sidecar's last decision on the split in each hybrid run:", "",
              *(f"- {h['why'] or 'none'}" for h in rows[2]["hybrid"])]
    print("\n".join(lines), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps({"header": head, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
