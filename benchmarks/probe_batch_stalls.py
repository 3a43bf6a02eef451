"""Probe (not a benchmark table): the stall of every ``next()`` of bench_tiers' trainer loop, per batch.

Runs ``benchmarks/bench_tiers.py`` with the same arguments, but its loop prints, for each epoch, the time
``iter()`` took and then each batch's wait in milliseconds, so one can see whether an epoch's stall is spread
over every batch, alternates between workers, or sits at the epoch's start.

    .venv/bin/python benchmarks/probe_batch_stalls.py --configs "no cache,MinIO + disk"
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, List

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_tiers as bt  # noqa: E402


def run_loop(loader: Any, epochs: int, step_s: float,
             on_epoch_end: Callable[[int], str]) -> List[tuple[float, float, str]]:
    out = []
    for epoch in range(epochs):
        start = time.perf_counter()
        it: Iterator[Any] = iter(loader)
        first = time.perf_counter() - start
        waits: List[float] = []
        while True:
            t = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            waits.append(time.perf_counter() - t)
            bt._consume(batch)
            time.sleep(step_s)
        elapsed = time.perf_counter() - start
        stall = sum(waits)
        print(f"epoch {epoch}: {elapsed:.3f} s, stall {stall:.3f} s; iter() {1e3 * first:.0f} ms; per batch (ms): "
              + " ".join(f"{1e3 * w:.0f}" for w in waits), flush=True)
        out.append((elapsed, stall, on_epoch_end(epoch)))
    return out


if __name__ == "__main__":
    bt.run_loop = run_loop
    bt.main()
