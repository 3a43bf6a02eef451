"""A shared-memory member's mappings of its prep group's /dev/shm slot files.

The sidecar stages prepared batches in a few /dev/shm files ("slots") that it reuses batch after batch
(docs/PREP.md, "Zero copy"). A member maps each slot once, with its pages populated in one call, and hands out
read-only numpy views of the batch in it. A slot is written again only after every member that got it said it let
go: each view carries a finalizer that records its ``(epoch, batch)`` when the view (and every array or tensor
made from it) is gone, and the member reports those with its next ``prep.next``. A view that is still alive is
never reported, so the batch under it never changes.
"""

from __future__ import annotations

import collections
import mmap
import os
import weakref
from typing import Tuple

import numpy as np

__all__ = ["SlotMaps"]

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux: map every page now (one call, not a fault per page)


class SlotMaps:
    """The member's slot mappings (at most ``limit`` kept; a file the sidecar retired is unmapped once no view
    of it is left) and the batches whose views are gone, to report."""

    def __init__(self, limit: int = 32) -> None:
        self._limit = limit
        self._maps: collections.OrderedDict[str, mmap.mmap] = collections.OrderedDict()
        self._released: collections.deque[Tuple[int, int]] = collections.deque()

    def view(self, path: str, dtype: np.dtype, shape: Tuple[int, ...], epoch: int, batch: int) -> np.ndarray:
        """A read-only ``shape`` array of ``dtype`` at the start of slot ``path``; when it and every array or
        tensor over it are gone, ``(epoch, batch)`` is reported released."""
        mm = self._maps.get(path)
        if mm is None:
            mm = self._open(path)
        else:
            self._maps.move_to_end(path)
        count = int(np.prod(shape, dtype=np.int64))
        flat = np.frombuffer(mm, dtype=dtype, count=count)
        # The finalizer goes on `flat`, not on the view handed out: numpy points every view of a view (a slice, a
        # reshape, a transpose) at the first array of the chain, so `flat` lives exactly as long as any array or
        # tensor over this batch does (torch.from_numpy keeps its array, which keeps `flat`).
        f = weakref.finalize(flat, self._released.append, (epoch, batch))
        f.atexit = False
        return flat.reshape(shape)

    def take_released(self) -> list[list[int]]:
        """The batches let go of since the last call (each once), as ``prep.next``'s ``"released"``."""
        out = []
        while True:
            try:
                e, b = self._released.popleft()  # finalizers append from whichever thread drops a view
            except IndexError:
                return out
            out.append([e, b])

    def clear(self) -> None:
        """Forgets every mapping (views still alive keep theirs)."""
        self._maps.clear()

    def _open(self, path: str) -> mmap.mmap:
        # A slot not seen yet: first drop mappings of files the sidecar retired (unlinked), then the oldest.
        for p in [p for p in self._maps if not os.path.exists(p)]:
            del self._maps[p]
        while len(self._maps) >= self._limit:
            self._maps.popitem(last=False)
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self._maps[path] = mm
        return mm
