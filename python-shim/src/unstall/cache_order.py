"""Cache-aware order (``unstall.torch.DataLoader(order="cache_first")``): each epoch's seeded order, reordered within
windows of ``window`` consecutive positions so that every window serves the samples the sidecar holds first and its
misses last, while the sidecar reads those misses ahead (the reordered order is the epoch's clairvoyant plan).

What Seneca calls opportunistic data sampling and Quiver substitutable hits, bounded: a sample moves at most
``window - 1`` positions from where the seeded permutation put it, and never into another window, so every sample is
still delivered exactly once per epoch and the order's randomness is what the permutation gave, up to the window.

The reorder is a function of (the seeded order, the cache snapshot, ``window``): one snapshot of which samples of the
dataset are cached (memory cache or disk tier) is taken when an epoch starts, and a loader's ``state_dict`` carries
it (compressed) for the epoch in progress, so a restored loader continues exactly the same order.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import zlib
from dataclasses import dataclass
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

__all__ = ["ORDERS", "CacheOrderStats", "CacheFirst", "window_positions", "cache_first", "encode_snapshot",
           "decode_snapshot", "snapshot_digest", "order_window", "restored_snapshot"]

ORDERS = ("sampler", "cache_first")
"""The ``order`` of ``unstall.torch.DataLoader``: the sampler's own, or reordered cache first within a window."""


def order_window(order: str, window: Optional[int], batch_size: int) -> Optional[int]:
    """A loader's ``order``/``order_window`` checked: None for the sampler's order, else the window (default 4
    batches); a ValueError naming the argument at fault."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(map(repr, ORDERS))}, got {order!r}")
    if order != "cache_first":
        if window is not None:
            raise ValueError("order_window applies to order='cache_first' only")
        return None
    return _checked(4 * batch_size if window is None else window)


def _checked(window: Any) -> int:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"order_window (positions a sample may move) must be an int >= 1, got {window!r}")
    return window


def window_positions(hits: np.ndarray, window: int) -> np.ndarray:
    """The reordered positions: ``out[j]`` is the seeded position served at position ``j``. Windows are the aligned
    runs of ``window`` positions of the seeded order; within each, the positions of hits (``hits[p]`` true) come
    first, then those of misses, each in their seeded order."""
    n = len(hits)
    key = (np.arange(n, dtype=np.int64) // window) * 2 + (~np.asarray(hits, dtype=bool))
    return np.argsort(key, kind="stable")


def cache_first(order: Sequence[int], cached: np.ndarray, window: int) -> List[int]:
    """``order`` (sample ids) reordered cache first within each window of ``window`` positions; ``cached[id]`` says
    whether sample ``id`` is cached."""
    ids = np.asarray(order, dtype=np.int64)
    return ids[window_positions(cached[ids], window)].tolist()


@dataclass(frozen=True)
class CacheOrderStats:
    """How much of the seeded order's randomness a cache-first epoch kept, and what it served first.

    ``spearman``: the rank correlation between the positions of the reordered and the seeded order (1.0: unchanged);
    ``max_displacement``: the most positions a sample moved, always below ``window``; ``cached``: samples of the
    epoch's order that the snapshot holds; ``snapshot_digest``: names the snapshot the order was computed from (two
    epochs with the same seed, epoch and digest have the same order)."""

    epoch: int
    window: int
    samples: int
    cached: int
    spearman: float
    max_displacement: int
    snapshot_digest: str

    @classmethod
    def of(cls, epoch: int, window: int, hits: np.ndarray, positions: np.ndarray, digest: str) -> CacheOrderStats:
        n = len(positions)
        moved = np.abs(np.arange(n, dtype=np.int64) - positions)
        rho = 1.0 if n < 2 else 1.0 - 6.0 * float(np.sum(moved.astype(np.float64) ** 2)) / (n * (n * n - 1.0))
        return cls(epoch=epoch, window=window, samples=n, cached=int(np.count_nonzero(hits)), spearman=rho,
                   max_displacement=int(moved.max()) if n else 0, snapshot_digest=digest)


def snapshot_digest(cached: np.ndarray) -> str:
    """A short digest of a snapshot (hex, 16 digits): equal snapshots, equal digests."""
    packed = np.packbits(np.asarray(cached, dtype=bool), bitorder="little").tobytes()
    return hashlib.sha256(len(cached).to_bytes(8, "little") + packed).hexdigest()[:16]


def encode_snapshot(cached: np.ndarray) -> str:
    """A snapshot as a state value: base64 of the zlib-compressed bitmap (a plain ``str`` for ``torch.save``)."""
    packed = np.packbits(np.asarray(cached, dtype=bool), bitorder="little").tobytes()
    return base64.b64encode(zlib.compress(packed, 9)).decode("ascii")


def decode_snapshot(text: Any, samples: int, what: str) -> np.ndarray:
    """``encode_snapshot``'s inverse for a dataset of ``samples`` samples, or a ValueError naming ``what``."""
    try:
        packed = zlib.decompress(base64.b64decode(str(text), validate=True))
    except (binascii.Error, zlib.error, ValueError) as e:
        raise ValueError(f"{what}: 'cache_snapshot' is not a snapshot (base64 of a zlib bitmap): {e}") from None
    if len(packed) != (samples + 7) // 8:
        raise ValueError(f"{what}: 'cache_snapshot' holds {len(packed) * 8} bits, not those of a dataset of {samples} "
                         "samples")
    return np.unpackbits(np.frombuffer(packed, dtype=np.uint8), count=samples, bitorder="little").astype(bool)


class CacheFirst:
    """A loader's cache-first order: ``reorder(epoch, order)`` (the ``EpochSampler``'s hook) takes the epoch's
    snapshot with ``query`` (one sidecar round trip), or the one a restored state carried for that epoch, and returns
    the reordered order; ``stats`` describes the latest epoch's."""

    def __init__(self, window: int, query: Callable[[], np.ndarray]) -> None:
        self.window = _checked(window)
        self._query = query
        self._snapshot: Optional[Tuple[int, np.ndarray]] = None  # (epoch, snapshot) of the latest or restored epoch
        self._restored = False  # the snapshot came from a state: the next iteration of its epoch uses it
        self.stats: Optional[CacheOrderStats] = None

    def reorder(self, epoch: int, order: List[int]) -> List[int]:
        if self._restored and self._snapshot is not None and self._snapshot[0] == epoch:
            cached = self._snapshot[1]
        else:
            cached = self._query()
        self._restored = False
        self._snapshot = (epoch, cached)
        ids = np.asarray(order, dtype=np.int64)
        hits = cached[ids]
        positions = window_positions(hits, self.window)
        self.stats = CacheOrderStats.of(epoch, self.window, hits, positions, snapshot_digest(cached))
        return ids[positions].tolist()

    def state(self, epoch: int, mid_epoch: bool) -> dict[str, Any]:
        """The state keys: ``cache_window``, and for a position inside ``epoch`` its ``cache_snapshot``."""
        state: dict[str, Any] = {"cache_window": self.window}
        if mid_epoch and self._snapshot is not None and self._snapshot[0] == epoch:
            state["cache_snapshot"] = encode_snapshot(self._snapshot[1])
        return state

    def restore(self, state: Mapping[str, Any], epoch: int, samples: int, what: str) -> None:
        """Takes a state's window check and snapshot: ``epoch``, when it is iterated next, is reordered from it."""
        cached = restored_snapshot(state, self.window, samples, what)
        self._snapshot = None if cached is None else (epoch, cached)
        self._restored = cached is not None


def restored_snapshot(state: Mapping[str, Any], window: Optional[int], samples: int, what: str) -> Optional[np.ndarray]:
    """A state's cache-first keys checked against a loader's ``window`` (None: the sampler's order): the snapshot of
    its epoch in progress, or None; a ValueError naming the difference."""
    taken = state.get("cache_window")
    if window is None:
        if taken is not None:
            raise ValueError(f"{what} state_dict was taken from a loader with order='cache_first' (order_window="
                             f"{taken!r}); this one's order is 'sampler' (build it with the same order)")
        return None
    if taken is None:
        raise ValueError(f"{what} state_dict was taken from a loader with order='sampler'; this one's order is "
                         "'cache_first' (build it with the same order)")
    if taken != window:
        raise ValueError(f"{what} state_dict was taken with order_window={taken!r}; this loader's is {window}")
    return decode_snapshot(state["cache_snapshot"], samples, what) if "cache_snapshot" in state else None
