"""The loader's work counters for ``unstall.tracing``: a small shared-memory table with one row per process (the
process that iterates and each DataLoader worker) of fetch and prep work, and the calls a ``Dataset`` records
them with."""

from __future__ import annotations

import os
import tempfile
import weakref
from typing import Any, Dict, Optional

import numpy as np


__all__ = [
    "FETCH_CALLS",
    "FETCH_NS",
    "FETCH_BYTES",
    "FETCH_SAMPLES",
    "PREP_NS",
    "PREP_SAMPLES",
    "SHM_CALLS",
    "PREP_CPU_NS",
    "WorkCounters",
    "record_fetch",
    "record_prep",
    "bind_sidecar",
]

# ---------------------------------------------------------------------------------------------
# Work counters: one row per process (row 0 = the process that iterates, row k = worker k-1)

FETCH_CALLS, FETCH_NS, FETCH_BYTES, FETCH_SAMPLES, PREP_NS, PREP_SAMPLES, SHM_CALLS, PREP_CPU_NS = range(8)
_COLUMNS = 8


class WorkCounters:
    """A small int64 table in shared memory (a file under /dev/shm), one row per process; each process
    only writes its own row, so no locks. Only its path travels to the workers (in the Dataset)."""

    def __init__(self, rows: int, path: Optional[str] = None) -> None:
        self.rows = rows
        if path is None:
            base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
            fd, path = tempfile.mkstemp(prefix="unstall-counters-", dir=base)
            os.ftruncate(fd, rows * _COLUMNS * 8)
            os.close(fd)
            self._owner: Optional[int] = os.getpid()
            weakref.finalize(self, _unlink, path, self._owner)
        else:
            self._owner = None
        self.path = path
        self.table = np.memmap(path, dtype=np.int64, mode="r+", shape=(rows, _COLUMNS))

    def totals(self) -> np.ndarray:
        return np.array(self.table.sum(axis=0))

    def row(self, r: int) -> np.ndarray:
        return np.array(self.table[r])


def _unlink(path: str, owner: int) -> None:
    if os.getpid() == owner:
        try:
            os.unlink(path)
        except OSError:
            pass


_opened: Dict[str, WorkCounters] = {}


def _my_row(dataset: Any) -> Optional[np.ndarray]:
    """The counters row of this process for ``dataset`` (an ``unstall.torch.Dataset``), or None when no
    stall observer counts for it."""
    path = dataset.work_counters
    if path is None:
        return None
    counters = _opened.get(path)
    if counters is None:
        try:
            rows = os.path.getsize(path) // (_COLUMNS * 8)
            counters = _opened[path] = WorkCounters(rows, path)
        except (OSError, ValueError):
            dataset.work_counters = None  # this process's copy: stop trying
            return None
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    r = 0 if info is None else info.id + 1
    return counters.table[r] if r < counters.rows else None


def record_fetch(dataset: Any, samples: int, nbytes: int, ns: int, transport: str = "flight") -> None:
    """Called by ``Dataset.fetch_samples`` after each request (a local-socket FETCH or a Flight DoGet)."""
    row = _my_row(dataset)
    if row is not None:
        row[FETCH_CALLS] += 1
        if transport == "shm":
            row[SHM_CALLS] += 1
        row[FETCH_NS] += ns
        row[FETCH_BYTES] += nbytes
        row[FETCH_SAMPLES] += samples


def record_prep(dataset: Any, samples: int, ns: int, cpu_ns: int = 0) -> None:
    """Called by ``Dataset._convert`` after loader/transform of a batch: its wall time and the thread's CPU time."""
    row = _my_row(dataset)
    if row is not None:
        row[PREP_NS] += ns
        row[PREP_SAMPLES] += samples
        row[PREP_CPU_NS] += cpu_ns


# The Sidecar a Dataset was built with. Kept here, weakly keyed, rather than on the Dataset: a Sidecar
# (Py4J gateway, maybe the sidecar's own process) must never travel with the Dataset to DataLoader workers,
# and only this process's stats need it.
_sidecars: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def bind_sidecar(dataset: Any, sidecar: Any) -> None:
    try:
        _sidecars[dataset] = sidecar
    except TypeError:
        pass


def _dataset_stats(dataset: Any) -> Any:
    """The sidecar's per-dataset counters over the control plane (never Flight: this process may
    still fork DataLoader workers), or None."""
    sidecar = _sidecars.get(dataset)
    if sidecar is None or not getattr(sidecar, "has_control_plane", False):
        return None
    try:
        return sidecar.stats().dataset(dataset.name)
    except Exception:
        return None
