"""Probe (not a test): does a PrepLoader keep up with a consumer slower than the loader alone, and where does the
training thread wait when it does not?

A CPU stand-in for bench_gpu's ``PrepLoader(device=...)`` training row: the GPU step is a fixed-time step (a sleep,
plus ``--spin`` of it busy on the CPU, as a training thread launching kernels is), at ``--fraction`` of the rate
the same loader reaches alone on this machine. Each row is a fresh prep group (as bench_gpu's rows are), read
through bench_gpu's ``forever(loader)`` (a new ``for`` per epoch). Per row: the loader alone, then the consumer at
the fixed rate; for the consumer, the achieved rate against the consumer's, the training thread's wall ms in
``next()`` per batch (in the epoch and at each epoch's first batch) and where it went: waiting in ``prep.next``
for the sidecar (``Membership.arrays``), the device copy and conversion (``DevicePrefetcher._launch``), closing
the last epoch's prefetcher; then the group's autotuning (``prep.stats``: window, prep threads, member stalls,
decisions) and its shared-memory slot files (a new file is a new pinned-memory registration on CUDA).

    python benchmarks/probe_lasthop.py [--images 1024] [--size 160x120] [--crop 64] [--batch 32]
        [--steps 200] [--warmup 20] [--fraction 0.6] [--spin 0.0] [--prep-threads 1] [--device cpu]
        [--mode device|uint8] [--window N] [--no-autotune] [--torch-threads 1]

The table (markdown), with the machine, the date, the commit and the command, goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python-shim" / "src"))
sys.path.insert(0, str(HERE))

from _report import header  # noqa: E402
from bench_gpu import DATASET, git_commit, photo_folder, prep_loader  # noqa: E402

__all__ = ["main"]


class Spans:
    """Wall seconds spent inside wrapped methods, accumulated per phase until taken; on another thread than the
    training (main) thread, as ``bg PHASE``."""

    def __init__(self) -> None:
        self.now: dict[str, float] = {}

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        inner = getattr(owner, name)

        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                key = phase if threading.current_thread() is threading.main_thread() else f"bg {phase}"
                self.now[key] = self.now.get(key, 0.0) + time.perf_counter() - t0

        setattr(owner, name, timed)

    def take(self) -> dict[str, float]:
        out, self.now = self.now, {}
        return out


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def run(batches: Iterator[Any], n: int, step_s: float, spin: float, spans: Spans, epoch_len: int,
        start: int) -> dict[str, Any]:
    """``n`` batches, each followed by a ``step_s`` step (None: no step): per batch the wall and CPU ms in
    ``next()`` and the spans inside it."""
    rows = []
    t0 = time.perf_counter()
    for i in range(n):
        spans.take()
        c, w = time.thread_time(), time.perf_counter()
        next(batches)
        wall, cpu = time.perf_counter() - w, time.thread_time() - c
        rows.append({"first": (start + i) % epoch_len == 0, "wall": wall, "cpu": cpu, **spans.take()})
        if step_s:
            s0 = time.perf_counter()
            busy(step_s * spin)
            time.sleep(step_s * (1 - spin))
            rows[-1]["step"] = time.perf_counter() - s0
    return {"wall_s": time.perf_counter() - t0, "batches": rows}


def ms(values: Sequence[float]) -> str:
    if not values:
        return "-"
    v = sorted(values)
    return f"{1e3 * statistics.fmean(v):.2f} (p50 {1e3 * v[len(v) // 2]:.2f}, max {1e3 * v[-1]:.1f})"


def summary(name: str, res: dict[str, Any], batch: int, step_s: Optional[float]) -> list[str]:
    rows = res["batches"]
    rate = len(rows) * batch / res["wall_s"]
    lines = [f"### {name}", "",
             f"- {len(rows)} batches in {res['wall_s']:.2f} s: **{rate:,.0f} images/s**"
             + (f" against the consumer's {batch / step_s:,.0f} ({rate * step_s / batch:.2f} of it)" if step_s else "")]
    for label, sel in (("in the epoch", [r for r in rows if not r["first"]]),
                       ("an epoch's first batch", [r for r in rows if r["first"]])):
        if not sel:
            continue
        lines.append(f"- {label} ({len(sel)} batches): wall ms in next() {ms([r['wall'] for r in sel])}; CPU ms "
                     f"{1e3 * statistics.fmean(r['cpu'] for r in sel):.2f}; of the wall: "
                     + ", ".join(f"{k} {1e3 * sum(r.get(k, 0.0) for r in sel) / len(sel):.2f}"
                                 for k in ("prep.next", "copy+convert", "close"))
                     + "; on the prefetcher's thread: "
                     + ", ".join(f"{k[3:]} {1e3 * sum(r.get(k, 0.0) for r in sel) / len(sel):.2f}"
                                 for k in ("bg prep.next", "bg copy+convert")))
    total = sum(r["wall"] for r in rows)
    lines.append(f"- the training thread waited {total:.2f} s of {res['wall_s']:.2f} s in next() "
                 f"({total / res['wall_s']:.0%})")
    if step_s:
        steps = sum(r["step"] for r in rows)
        lines.append(f"- the steps took {steps:.2f} s (asked: {len(rows) * step_s:.2f} s; the rest is this machine's "
                     f"sleep and scheduling): {steps / res['wall_s']:.2f} of "
                     "the rate the steps as run allowed")
    return lines


def group_stats(sidecar: Any, membership: Any) -> list[str]:
    with sidecar.flight_client() as c:
        st = json.loads(c.do_action("prep.stats")[0])
    g = st["groups"].get(membership.group, {})
    a = g.get("autotune", {})
    lines = [f"- group: window {a.get('window')} (max {a.get('max_window')}), prep threads {a.get('threads')} of "
             f"{a.get('max_threads')}, member stalls {a.get('stalls')}, production {a.get('production_rate', 0):.1f}/s"
             f", consumption {a.get('consumption_rate', 0):.1f}/s, decisions {a.get('decisions_total')}"]
    for d in a.get("decisions", [])[-8:]:
        lines.append(f"  - period {d['period']}: {d['what']} {d['from']} -> {d['to']} ({d['why']})")
    if "shm_slots" in g:
        lines.append(f"- shm slots: {json.dumps(g['shm_slots'])}")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--size", default="160x120", help="generated JPEGs' WIDTHxHEIGHT")
    ap.add_argument("--crop", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=200, help="measured batches per row")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--fraction", type=float, default=0.6, help="the consumer's rate, of the loader-alone rate")
    ap.add_argument("--spin", type=float, default=0.0, help="part of each step spent busy on the CPU")
    ap.add_argument("--prep-threads", default="1", help="the sidecar's --prep-threads")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--mode", choices=("device", "uint8"), default="device",
                    help="PrepLoader(device=) bf16 channels_last, or uint8 host batches normalized by hand")
    ap.add_argument("--window", type=int, help="pin the group's window (default: tuned)")
    ap.add_argument("--no-autotune", dest="autotune", action="store_false")
    ap.add_argument("--torch-threads", type=int, default=1,
                    help="torch's intra-op threads (a second OpenMP team on a few cores only adds spinning)")
    ap.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "unstall" / "bench-gpu")
    args = ap.parse_args(argv)

    import torch
    import unstall
    from unstall import device as udevice
    from unstall.prep import membership

    torch.set_num_threads(args.torch_threads)
    dev = torch.device(args.device)
    w, h = (int(v) for v in args.size.split("x"))
    data = photo_folder(args.cache_dir.expanduser(), args.images, w, h, "q75")
    spans = Spans()
    spans.wrap(membership.Membership, "arrays", "prep.next")
    # the copy and conversion: on the training thread (the prefetcher before its thread) or on the prefetcher's
    launcher = getattr(udevice, "_Producer", None)
    spans.wrap(udevice.DevicePrefetcher, "_launch", "copy+convert") if launcher is None else \
        spans.wrap(launcher, "launch", "copy+convert")
    spans.wrap(udevice.DevicePrefetcher, "close", "close")
    join: dict[str, Any] = {} if args.autotune else {"autotune": False}
    if args.window is not None:
        join["window"] = args.window
    out = [f"# PrepLoader last hop probe ({args.mode}, device {dev})", "", *header(), f"- commit: {git_commit()}",
           f"- data: {args.images} JPEGs {args.size} q75, batch {args.batch}, crop {args.crop}, sidecar "
           f"--prep-threads {args.prep_threads}, torch threads {args.torch_threads}, consumer at {args.fraction} of the loader alone, "
           f"{args.spin:.0%} of each step busy; {args.warmup} warm-up + {args.steps} batches per row", ""]
    home = Path(tempfile.mkdtemp(prefix="unstall-probe-lasthop-"))
    with unstall.Sidecar(home=home, extra_args=["--prep-threads", str(args.prep_threads)]) as sidecar:
        sidecar.register_dataset(DATASET, data)

        def row(seed: int) -> tuple[Any, Iterator[Any], int]:
            loader, batches = prep_loader(args.crop, args.batch, seed, 1, dev, args.mode == "device",
                                          sidecar=sidecar, **join)
            return loader, batches, len(loader)

        measured: dict[str, Any] = {}
        for seed, label in ((1, "alone"), (2, "consumer")):
            loader, batches, epoch_len = row(seed)
            step_s = None
            try:
                run(batches, args.warmup, 0.0, 0.0, spans, epoch_len, 0)
                if label == "consumer":
                    alone = measured["alone"]
                    step_s = args.batch / (args.fraction * len(alone["batches"]) * args.batch / alone["wall_s"])
                res = measured[label] = run(batches, args.steps, step_s or 0.0, args.spin, spans, epoch_len,
                                            args.warmup)
                out += summary(f"{'the loader alone' if step_s is None else 'a fixed-time consumer'} "
                               f"(group seed {seed})", res, args.batch, step_s)
                out += group_stats(sidecar, loader.membership)
                out.append("")
            finally:
                batches.close()  # type: ignore[attr-defined]
                loader.close()
    print("\n".join(out), flush=True)


if __name__ == "__main__":
    main()
