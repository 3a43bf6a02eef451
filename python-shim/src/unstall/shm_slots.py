"""A shared-memory member's mappings of its prep group's /dev/shm slot files.

The sidecar stages prepared batches in a few /dev/shm files ("slots") that it reuses batch after batch
(docs/PREP.md, "Zero copy"). A member maps each slot once, with its pages populated in one call, and hands out
read-only numpy views of the batch in it. A slot is written again only after every member that got it said it let
go: each view carries a finalizer that records its ``(epoch, batch)`` when the view (and every array or tensor
made from it) is gone, and the member reports those with its next ``prep.next``. A view that is still alive is
never reported, so the batch under it never changes.

``on_map(path, mapping)`` runs once per mapping when it is made, and ``on_unmap(path, token)`` (``token``: what
``on_map`` returned) once before it goes away: when it is retired (its file unlinked, the oldest beyond
``limit``, ``clear()``) and no view of it is left. ``unstall.device.PinnedSlots`` registers mappings as pinned
memory this way.
"""

from __future__ import annotations

import collections
import mmap
import os
import threading
import weakref
from typing import Any, Callable, Optional, Tuple

import numpy as np

__all__ = ["SlotMaps"]

_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux: map every page now (one call, not a fault per page)


class _Slot:
    """One mapping, its live views, and whether it is retired (unmapped once no view is left)."""

    __slots__ = ("path", "mm", "token", "views", "retired")

    def __init__(self, path: str, mm: mmap.mmap, token: Any) -> None:
        self.path, self.mm, self.token = path, mm, token
        self.views = 0
        self.retired = False


class SlotMaps:
    """The member's slot mappings (at most ``limit`` kept; a file the sidecar retired is unmapped once no view
    of it is left) and the batches whose views are gone, to report. ``on_map``/``on_unmap``: see the module."""

    def __init__(self, limit: int = 32, on_map: Optional[Callable[[str, mmap.mmap], Any]] = None,
                 on_unmap: Optional[Callable[[str, Any], None]] = None) -> None:
        self._limit = limit
        self._on_map = on_map
        self._on_unmap = on_unmap
        self._maps: collections.OrderedDict[str, _Slot] = collections.OrderedDict()
        self._all: dict[int, _Slot] = {}  # every mapping not unmapped yet, retired ones with live views too
        self._released: collections.deque[Tuple[int, int]] = collections.deque()
        self._lock = threading.RLock()  # finalizers run on whichever thread drops a view (reentrant: a GC pass)

    def view(self, path: str, dtype: np.dtype, shape: Tuple[int, ...], epoch: int, batch: int) -> np.ndarray:
        """A read-only ``shape`` array of ``dtype`` at the start of slot ``path``; when it and every array or
        tensor over it are gone, ``(epoch, batch)`` is reported released."""
        slot = self._maps.get(path)
        if slot is None:
            slot = self._open(path)
        else:
            self._maps.move_to_end(path)
        count = int(np.prod(shape, dtype=np.int64))
        flat = np.frombuffer(slot.mm, dtype=dtype, count=count)
        # The finalizer goes on `flat`, not on the view handed out: numpy points every view of a view (a slice, a
        # reshape, a transpose) at the first array of the chain, so `flat` lives exactly as long as any array or
        # tensor over this batch does (torch.from_numpy keeps its array, which keeps `flat`).
        with self._lock:
            slot.views += 1
        f = weakref.finalize(flat, self._dropped, slot, (epoch, batch))
        f.atexit = False
        return flat.reshape(shape)

    def _dropped(self, slot: _Slot, released: Tuple[int, int]) -> None:
        self._released.append(released)
        with self._lock:
            slot.views -= 1
            last = slot.views == 0 and slot.retired
        if last:
            self._unmap(slot)

    def take_released(self) -> list[list[int]]:
        """The batches let go of since the last call (each once), as ``prep.next``'s ``"released"``."""
        out = []
        while True:
            try:
                e, b = self._released.popleft()  # finalizers append from whichever thread drops a view
            except IndexError:
                return out
            out.append([e, b])

    def held(self) -> int:
        """Views (batches) over the slots still alive: what this member has not let go of yet."""
        with self._lock:
            return sum(slot.views for slot in self._all.values())

    def clear(self) -> None:
        """Forgets every mapping (views still alive keep theirs, unmapped when the last one is gone)."""
        while self._maps:
            self._retire(self._maps.popitem(last=False)[1])

    def _retire(self, slot: _Slot) -> None:
        with self._lock:
            slot.retired = True
            idle = slot.views == 0
        if idle:
            self._unmap(slot)

    def _unmap(self, slot: _Slot) -> None:
        # Before the mapping goes: the last view's finalizer runs before numpy lets go of the buffer.
        with self._lock:
            self._all.pop(id(slot), None)
        if self._on_unmap is not None:
            token, slot.token = slot.token, None
            self._on_unmap(slot.path, token)

    def _open(self, path: str) -> _Slot:
        # A slot not seen yet: first drop mappings of files the sidecar retired (unlinked), then the oldest.
        for p in [p for p in self._maps if not os.path.exists(p)]:
            self._retire(self._maps.pop(p))
        while len(self._maps) >= self._limit:
            self._retire(self._maps.popitem(last=False)[1])
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        slot = self._maps[path] = _Slot(path, mm, self._on_map(path, mm) if self._on_map is not None else None)
        with self._lock:
            self._all[id(slot)] = slot
        return slot
