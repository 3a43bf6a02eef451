"""``python -m unstall.analyze.warm``: reads a whole dataset once through Flight so that the sidecar's
cache holds what fits, with a progress bar; prints one JSON line. Run by ``child.warm_cache`` in its
own process, configured by ``UNSTALL_WARM_*``."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from ..client import FlightClient
from ..errors import SidecarError
from .child import ProgressFile

CHUNK_BYTES = 16 << 20


def main() -> int:
    location = os.environ["UNSTALL_WARM_LOCATION"]
    name = os.environ["UNSTALL_WARM_DATASET"]
    require_all = os.environ.get("UNSTALL_WARM_REQUIRE_ALL") == "1"
    progress = ProgressFile(Path(p) if (p := os.environ.get("UNSTALL_WARM_PROGRESS")) else None)
    with FlightClient(location, os.environ.get("UNSTALL_WARM_TOKEN") or None) as client:
        try:
            info = client.describe(name)
            cache = client.stats().cache
            if require_all and cache.capacity_bytes < info.total_bytes:
                return _out(status="error", error=(
                    f"dataset {name!r} ({info.total_bytes} bytes) does not fit the sidecar's cache "
                    f"({cache.capacity_bytes} bytes): the 'cached' run needs the whole dataset in memory; "
                    "raise --max-cache or analyze a subset"))
            n = info.num_samples
            # Small chunks (~1/64 of the dataset) so that the storage bandwidth can be timed in steady state.
            chunk = max(1, min(CHUNK_BYTES, info.total_bytes // 64))
            per = max(1, min(4096, chunk // max(1, info.total_bytes // max(n, 1))))
            marks = []  # (seconds, bytes read so far)
            t0 = time.perf_counter()
            done_bytes = 0
            from ..progress import bar

            with bar(total=n, desc=f"warming cache ({name})", unit="sample") as pbar:
                for start in range(0, n, per):
                    ids = list(range(start, min(n, start + per)))
                    batch = client.fetch(name, ids, epoch=0)
                    done_bytes += sum(len(b) for b in batch.column("payload").to_pylist())
                    marks.append((time.perf_counter() - t0, done_bytes))
                    pbar.update(len(ids))
                    progress.update("warm", start + len(ids), n)
            st = client.stats()
        except SidecarError as e:
            return _out(status="error", error=f"warming the cache failed: {e}")
    return _out(status="ok", dataset_bytes=info.total_bytes, num_samples=n, capacity_bytes=st.cache.capacity_bytes,
                seconds=marks[-1][0] if marks else 0.0, storage_Bps=_steady_rate(marks),
                used_bytes=st.cache.used_bytes, entries=st.cache.entries)


def _steady_rate(marks: list) -> float | None:
    """Bytes/s over the second half of the pass: a link's initial burst (the sidecar's throttle allows
    100 ms of it) and connection set-up stay out of it. This is DS-Analyzer's separate storage
    bandwidth measurement."""
    if len(marks) < 4:
        return None
    (ta, ba), (tb, bb) = marks[len(marks) // 2 - 1], marks[-1]
    return (bb - ba) / (tb - ta) if tb > ta else None


def _out(**doc: object) -> int:
    print(json.dumps(doc))
    return 0 if doc.get("status") == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
