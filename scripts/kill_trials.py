#!/usr/bin/env python3
"""Kill trials (not a test): N epochs of a real torch DataLoader (2 workers, shuffle, MinIO cache and
disk tier) over a real sidecar, each epoch with one SIGKILL of the sidecar at a random batch. Prints the
samples lost and duplicated over all trials (both must be 0) and the time each restart added to its
epoch (median, p90), against epochs without a kill.

    .venv/bin/python scripts/kill_trials.py --trials 100
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "python-shim" / "src"), str(REPO / "tests" / "python")]

import unstall  # noqa: E402
from unstall.recovery import Deadlines  # noqa: E402
from unstall.torch import DataLoader, Dataset  # noqa: E402
from fault_trials import count_epoch, keep, lost_and_duplicated, make_dataset  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=100, help="epochs with one kill each (default 100)")
    ap.add_argument("--baseline", type=int, default=5, help="epochs without a kill, for the added time (default 5)")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--size", type=int, default=3000, help="bytes per sample")
    ap.add_argument("--batch-size", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--health-interval", type=float, default=Deadlines.health_interval,
                    help="the supervisor's check period (UNSTALL_HEALTH_INTERVAL; default %(default)s s)")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    logging.basicConfig(level=logging.ERROR)  # the shim's one warning per outage would be 100 lines
    deadlines = Deadlines.from_env()
    deadlines = Deadlines(deadlines.call, deadlines.index, args.health_interval, deadlines.health, deadlines.recovery)

    with tempfile.TemporaryDirectory(prefix="unstall-kill-trials-") as tmp:
        work = Path(tmp)
        files = make_dataset(work / "data", args.samples, args.size, seed)
        with unstall.Sidecar(home=work / "home", cache_capacity=f"{args.samples * args.size // 2}",
                             extra_args=["--disk-cache-dir", str(work / "disk")], deadlines=deadlines) as sidecar:
            ds = Dataset("trials", root=work / "data", loader=bytes, sidecar=sidecar)
            loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, seed=seed, num_workers=args.workers,
                                persistent_workers=True, collate_fn=keep)
            batches = -(-args.samples // args.batch_size)
            lost = duplicated = wrong = 0

            def epoch(kill_at: int) -> float:
                nonlocal lost, duplicated, wrong

                def after(k: int) -> None:
                    if k == kill_at:
                        os.kill(sidecar.pid, signal.SIGKILL)

                t0 = time.perf_counter()
                seen, bad = count_epoch(loader, files, after)
                took = time.perf_counter() - t0
                lo, du = lost_and_duplicated(seen, files)
                lost, duplicated, wrong = lost + lo, duplicated + du, wrong + bad
                return took

            epoch(-1)  # warm-up: fills the caches
            base = [epoch(-1) for _ in range(args.baseline)]
            added = []
            for t in range(args.trials):
                while not (sidecar.healthy() and sidecar.restarts == t):  # the previous restart is over
                    time.sleep(0.05)
                added.append(epoch(rng.randrange(batches - 1)) - statistics.median(base))
            restarts = sidecar.restarts
    q = statistics.quantiles(added, n=10) if len(added) >= 2 else added * 9
    print(f"kill trials: {args.trials} (seed {seed}), {args.samples} samples x {args.size} B, "
          f"{args.workers} workers, {restarts} restarts")
    print(f"samples lost: {lost}, duplicated: {duplicated}, not matching a file: {wrong}")
    print(f"epoch without a kill: median {statistics.median(base):.3f} s; added time per restart: "
          f"median {statistics.median(added):.3f} s, p90 {q[-1]:.3f} s")
    return 0 if lost == duplicated == wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
