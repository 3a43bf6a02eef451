"""Probe (not a benchmark table): what copying a payload costs inside a DataLoader worker, with glibc's
heap defaults and with the setting unstall's workers use (unstall/_alloc.py).

One DataLoader worker fetches batches of 64 payloads of 110 KB from a warm sidecar cache and copies each into
a fresh ``bytes`` (the default loader); per batch it reports the copy's time per payload and the minor page
faults it took. Run once with glibc's defaults (``UNSTALL_WORKER_MALLOC=system``) and once with unstall's.

    .venv/bin/python benchmarks/probe_worker_copy.py
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, List, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "python-shim" / "src"), str(REPO / "benchmarks")]

BATCH = 64
SIZE = 110_000


def _copy_and_count(batch: List[Tuple[Any, Any]]) -> Tuple[float, int]:
    """collate_fn: the samples are memoryviews (loader=memoryview); copy each as the default loader would."""
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = time.perf_counter()
    copies = [bytes(view) for view, _ in batch]
    dt = time.perf_counter() - t0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    del copies
    return dt / len(batch), faults // len(batch)


def child(root: Path, home: Path) -> None:
    import unstall
    from unstall.torch import DataLoader, Dataset

    with unstall.Sidecar(home=home, cache_capacity=256 << 20, memory_budget=1 << 30) as sidecar:
        ds = Dataset("probe", root=root, sidecar=sidecar, loader=memoryview)
        loader = DataLoader(ds, batch_size=BATCH, shuffle=True, seed=0, num_workers=1, persistent_workers=True,
                            collate_fn=_copy_and_count)
        for _ in range(2):  # fill the cache, warm the worker
            for _ in loader:
                pass
        per = [r for _ in range(3) for r in loader]
        us = statistics.median(t for t, _ in per) * 1e6
        faults = statistics.median(f for _, f in per)
        print(f"  copy of one {SIZE // 1000} KB payload: {us:.0f} us, {faults:.0f} minor page faults (medians of "
              f"{len(per)} batches)")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(Path(sys.argv[2]), Path(sys.argv[3]))
        return 0
    from bench_loader import generate

    base = Path.home() / ".cache" / "unstall" / "bench"
    root = base / f"s{SIZE}"
    generate(root, SIZE, 200_000_000, seed=SIZE)
    for label, setting in (("glibc's defaults (UNSTALL_WORKER_MALLOC=system)", "system"),
                           ("unstall's worker setting (default)", "")):
        print(f"{label}:", flush=True)
        env = dict(os.environ, UNSTALL_WORKER_MALLOC=setting, UNSTALL_EPOCH_LOG="0")
        subprocess.run([sys.executable, __file__, "--child", str(root), str(base / "home-probe")], env=env,
                       check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
