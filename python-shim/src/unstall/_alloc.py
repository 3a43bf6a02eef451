"""The C allocator of DataLoader worker processes: keep freed heap memory for the next batch.

A worker turns each payload into a fresh Python object (``bytes(view)`` for the default loader, a decoded
image for most transforms) and frees the whole batch after ``collate_fn``. With glibc's defaults a batch's
worth of freed memory at the top of the heap is handed back to the kernel at once (``M_TRIM_THRESHOLD``,
128 KiB) and the next batch faults every page in again, zero-filled: copying a 110 KB payload then costs
several times the copy itself. In unstall's workers the heap keeps up to ``TRIM_THRESHOLD`` of free memory
and allocations up to ``MMAP_THRESHOLD`` come from it, so steady-state batches reuse warm pages. A worker's
resident memory then stays at its peak instead of falling between batches.

Only in DataLoader worker processes (``torch.utils.data.get_worker_info()`` is set), only on glibc, never
when the user already chose (``MALLOC_TRIM_THRESHOLD_``/``MALLOC_MMAP_THRESHOLD_`` in the environment,
glibc's own variables), and not at all with ``UNSTALL_WORKER_MALLOC=system``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Optional

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune_allocator", "tune_worker_allocator"]

TRIM_THRESHOLD = 512 << 20  # free heap kept for reuse
MMAP_THRESHOLD = 32 << 20  # glibc's own ceiling for its dynamic threshold: larger blocks are mmap'ed

_M_TRIM_THRESHOLD = -1  # <malloc.h>
_M_MMAP_THRESHOLD = -3

_checked_pid = 0
_applied = False


def _mallopt() -> Optional[ctypes._CFuncPtr]:  # type: ignore[name-defined]
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallopt  # glibc only (musl and macOS have none)
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def tune_allocator() -> bool:
    """Applies the settings above to this process; False where they do not apply (not glibc, chosen by
    the user through glibc's variables, or ``UNSTALL_WORKER_MALLOC=system``)."""
    if os.environ.get("UNSTALL_WORKER_MALLOC", "").strip().lower() == "system":
        return False
    if "MALLOC_TRIM_THRESHOLD_" in os.environ or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    mallopt = _mallopt()
    if mallopt is None:
        return False
    return bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def tune_worker_allocator() -> bool:
    """``tune_allocator()`` once per process, and only in a DataLoader worker (cheap after the first call).
    Returns whether this process runs with the settings."""
    global _checked_pid, _applied
    pid = os.getpid()
    if _checked_pid != pid:
        _checked_pid = pid
        from torch.utils.data import get_worker_info

        _applied = get_worker_info() is not None and tune_allocator()
    return _applied
