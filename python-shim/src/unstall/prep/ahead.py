"""A prep loader's device prefetcher across epochs (``EpochPrefetch``): the next epoch's first batches are read
while the loop finishes an epoch, and are handed to the next ``for``, never read twice nor dropped, however the loop
leaves the epoch: at its end, with ``break``, or by letting go of its iterator (``zip`` of loaders, ``islice``)."""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterator, Optional, Sequence, Tuple

__all__ = ["EPOCH_END", "Crossing", "EpochPrefetch"]

EPOCH_END = object()  # the source's mark between an epoch's batches and the next epoch's


class Crossing:
    """Whether a source went on into epoch ``e + 1``, decided once against the loop leaving epoch ``e``: the source
    crosses only while the loop is still in the epoch (``cross``), and the loop that leaves learns whether it did
    (``leave``), so the next epoch's batches are either unread or kept."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._left: set[int] = set()
        self._crossed: set[int] = set()

    def cross(self, epoch: int) -> bool:
        """The source, before it reads past ``epoch``: False when the loop already left it (the source stops)."""
        with self._lock:
            if epoch in self._left:
                return False
            self._crossed.add(epoch)
            return True

    def leave(self, epoch: int) -> bool:
        """The loop leaves ``epoch``: True when the source already reads the next epoch."""
        with self._lock:
            self._left.add(epoch)
            return epoch in self._crossed


class EpochPrefetch:
    """The prefetcher of a loader's device batches, kept across epochs.

    ``make(epoch, indices, crossing)`` starts a prefetcher over a source that yields ``epoch``'s batches, then, after
    ``crossing.cross(epoch)`` allowed it, ``EPOCH_END`` and the next epoch's from its first (``first(epoch)``: that
    epoch's indices). ``batches(epoch, indices)`` yields an epoch's batches from the prefetcher the last epoch left,
    when it reads these, else from a new one."""

    def __init__(self, make: Callable[[int, Sequence[int], Crossing], Any],
                 first: Callable[[int], Sequence[int]]) -> None:
        self._make = make
        self._first = first
        self.kept: Optional[Tuple[int, list[int], Any, Crossing]] = None  # (epoch, its indices, prefetcher, crossing)
        self._leave_live: Optional[Callable[[], None]] = None  # the open epoch's, until its loop left
        self.live: Any = None  # the open epoch's prefetcher

    def batches(self, epoch: int, indices: Sequence[int]) -> Iterator[Any]:
        if self._leave_live is not None:  # an earlier epoch's iterator is still open: its loop left it now
            self._leave_live()
        taken = self._take(epoch, indices)
        prefetcher, crossing = taken if taken is not None else (None, Crossing())
        if prefetcher is None:
            prefetcher = self._make(epoch, indices, crossing)
        live: list[Any] = [prefetcher]

        def leave() -> None:
            """The loop left the epoch before its end: a prefetcher that reads the next epoch is kept for it (the
            rest of this epoch's batches, already read, dropped), else closed before it reads on."""
            p, live[0] = live[0], None
            if self._leave_live is leave:
                self._leave_live = self.live = None
            if p is None:
                return
            if crossing.leave(epoch) and self._drain(p):
                self.kept = (epoch + 1, list(self._first(epoch + 1)), p, crossing)
            else:
                p.close()

        self._leave_live, self.live = leave, prefetcher
        try:
            for batch in prefetcher:
                if batch is EPOCH_END:  # the next epoch's first batches are in flight: kept for the next ``for``
                    live[0] = None
                    self.kept = (epoch + 1, list(self._first(epoch + 1)), prefetcher, crossing)
                    return
                yield batch
        finally:
            leave()

    @staticmethod
    def _drain(prefetcher: Any) -> bool:
        """Hands out what is left of the epoch up to its ``EPOCH_END``: False when the source ended or failed."""
        try:
            for batch in prefetcher:
                if batch is EPOCH_END:
                    return True
        except Exception:  # noqa: BLE001  (the next epoch starts a new prefetcher, which meets the error again)
            return False
        return False

    def _take(self, epoch: int, indices: Sequence[int]) -> Optional[Tuple[Any, Crossing]]:
        """The prefetcher the last epoch left with this epoch's first batches in flight, if this ``for`` reads them
        (else it is closed: ``set_epoch`` picked another epoch)."""
        kept, self.kept = self.kept, None
        if kept is None:
            return None
        if kept[0] == epoch and list(indices) == kept[1]:
            return kept[2], kept[3]
        kept[2].close()
        return None

    def close(self) -> None:
        """Closes the kept prefetcher and leaves the open epoch (its prefetcher closed)."""
        if self._leave_live is not None:
            self._leave_live()
        kept, self.kept = self.kept, None
        if kept is not None:
            kept[2].close()
