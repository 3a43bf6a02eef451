#!/usr/bin/env python3
"""k jobs of a search decoding on one device: each batch decoded once between them (device_share) vs by every job.

Usage:
    python benchmarks/bench_decode_share.py [--toy] [--jobs 2] [--device cpu|cuda] [--batches 40] [--json PATH]
        [bench_gpu.py's data options: --images --size --jpeg --data --cache-dir --batch --crop]

The k jobs are processes, in one prep group (one seed), each a ``PrepLoader(device=..., decode(device="mixed"))``
read as fast as it goes (no model: the decode is what is measured), started together (``group_size=k``) and timed
from GO, once with ``device_share=True`` and once with ``device_share=False``, on one sidecar, in one run. The
table gives the images/s all jobs together received, the ratio of the two, and the decodes the jobs made. On a
CPU (``--device cpu``, torchvision's CPU decoder) the decode takes the machine's cores: the ratio shows the decodes
saved on a machine where decode is the bound, not a GPU figure."""

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

from bench_gpu import (DATASET, REPO, add_photo_options, dataset_dir, decode_counts, git_commit, gpu_name,  # noqa: E402
                       parse_job_args, prep_loader, sync)
from bench_prep import await_go, run_jobs, summarize  # noqa: E402
from _cpu import self_cpu  # noqa: E402
from _report import header  # noqa: E402

FULL = dict(batch=256, batches=60, warmup=5, crop=224, jobs=4, images=9600, size="500x375")
TOY = dict(batch=8, batches=12, warmup=2, crop=64, jobs=2, images=48, size="64x48")
MODES = {"share": "device_share=True: each batch decoded once between the jobs",
         "solo": "device_share=False: every job decodes every batch"}


def job(args: argparse.Namespace) -> None:
    import torch
    import unstall

    dev = torch.device(args.device)
    client = unstall.FlightClient(args.location, os.environ["UNSTALL_TOKEN"])
    loader, batches = prep_loader(args.crop, args.batch, 0, args.k, dev, True, True,
                                  device_share=args.job == "share", client=client)
    for _ in range(args.warmup):
        next(batches)
    sync(dev)
    await_go()
    t0, c0 = time.time(), self_cpu()
    for _ in range(args.batches):
        next(batches)
    sync(dev)
    stats = loader.share_stats.as_dict() if loader.share_stats is not None else None
    print("RESULT " + json.dumps({"start": t0, "end": time.time(), "cpu": self_cpu() - c0,
                                  "images": args.batches * args.batch, "share": stats}), flush=True)
    loader.close()


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--toy", action="store_true", help="tiny everything, so that it runs on a CPU in seconds")
    ap.add_argument("--jobs", type=int, help="k, the search's concurrent jobs (full 4, toy 2)")
    ap.add_argument("--batch", type=int, help="batch size (full 256, toy 8)")
    ap.add_argument("--batches", type=int, help="measured batches per job (full 60, toy 12)")
    ap.add_argument("--warmup", type=int, help="batches per job before GO (full 5, toy 2)")
    ap.add_argument("--crop", type=int, help="RandomResizedCrop's size (full 224, toy 64)")
    add_photo_options(ap, "full 9600, toy 48", "full 500x375, toy 64x48")
    ap.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each mode, in ABBA order (default 2)")
    ap.add_argument("--json", type=Path, help="also write the rows and the run's header as JSON")
    return parse_job_args(ap, argv, tuple(MODES), TOY, FULL, ("jobs", "batch", "batches", "crop", "images", "repeats"))


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    if args.job:
        job(args)
        return
    import torch
    import unstall

    data = dataset_dir(args)
    home = Path(tempfile.mkdtemp(prefix="unstall-bench-share-"))
    extra = ["--batch", str(args.batch), "--batches", str(args.batches), "--warmup", str(args.warmup), "--crop",
             str(args.crop), "--device", args.device, "--k", str(args.jobs)]
    path = os.pathsep.join(filter(None, [str(REPO / "python-shim" / "src"), os.environ.get("PYTHONPATH")]))
    runs: dict[str, list[tuple[dict[str, Any], list[dict[str, Any]]]]] = {mode: [] for mode in MODES}
    order = [m for _ in range(args.repeats // 2) for m in ("solo", "share", "share", "solo")] + \
        (["solo", "share"] if args.repeats % 2 else [])  # ABBA: drift and warm-up hit both alike
    with unstall.Sidecar(home=home) as sidecar:
        sidecar.register_dataset(DATASET, data)
        env = dict(os.environ, UNSTALL_TOKEN=sidecar.token, PYTHONPATH=path)
        for n, mode in enumerate(order, 1):
            results, machine = run_jobs(mode, args.jobs, data, extra + ["--location", sidecar.flight_location], env,
                                        script=Path(__file__))
            s = summarize(results, machine)
            runs[mode].append((s, results))
            print(f"[{n}/{len(order)}] {MODES[mode]}: {s['images_per_s']:,.0f} images/s", file=sys.stderr, flush=True)
    rows = []
    for mode, name in MODES.items():
        images = sum(s["images"] for s, _ in runs[mode])
        wall = sum(s["wall_s"] for s, _ in runs[mode])
        counted = decode_counts([r for _, results in runs[mode] for r in results])
        decodes = counted or {"decoded": len(runs[mode]) * args.jobs * (args.batches + args.warmup), "received": 0,
                              "fallbacks": 0}
        rows.append({"mode": mode, "row": name, "images_per_s": images / wall, "wall_s": wall,
                     "jobs_cpu_s": sum(s["jobs_cpu_s"] for s, _ in runs[mode]), "decodes": decodes,
                     "solo_counted": counted is None, "runs": [s["images_per_s"] for s, _ in runs[mode]]})
    ratio = rows[0]["images_per_s"] / rows[1]["images_per_s"]
    head = header() + [f"- device: {args.device} ({gpu_name(torch.device(args.device))})", f"- commit: {git_commit()}",
                       f"- {args.jobs} jobs, batch {args.batch}, crop {args.crop}, {args.warmup} warm-up + "
                       f"{args.batches} measured batches per job, no model; data {data}; each mode {args.repeats} times, ABBA"]
    lines = [f"# decode sharing: {args.jobs} jobs on one device", "", *head, "",
             "| row | images/s, all jobs | each run | jobs' CPU s | batches decoded | taken from another job's decode | "
             "decoded again (fallbacks) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        d = r["decodes"]
        decoded = f"{d['decoded']:,}" + (" (every job, every batch)" if r["solo_counted"] else "")
        each = ", ".join(f"{v:,.0f}" for v in r["runs"])
        lines.append(f"| {r['row']} | {r['images_per_s']:,.0f} | {each} | {r['jobs_cpu_s']:.1f} | {decoded} | "
                     f"{d['received']:,} | {d['fallbacks']:,} |")
    lines += ["", f"device_share / without: **{ratio:.2f}x** images/s"]
    print("\n".join(lines), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps({"header": head, "rows": rows, "ratio": ratio}, indent=1) + "\n")


if __name__ == "__main__":
    main()
