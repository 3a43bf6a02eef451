"""What a hybrid member (``decode(device="mixed", cpu_load=...)``) measures for the sidecar's split of each batch:
its device's decode seconds per sample it decodes, and its training step, the time the loop spends between batches
outside ``next()`` (what the model takes, not the wait for data). Both are moving averages, sent with each read
(``unstall.protocol.encode_prep_next``, or ``encode_prep_ticket`` over Flight); the sidecar splits from them
(docs/PREP.md, "Decoding on the GPU")."""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, Deque, Optional, Tuple, TypeVar

from ..protocol import PrepRates

__all__ = ["MemberRates"]

T = TypeVar("T")

# Weight of the newest batch in the moving averages: a few batches' noise smoothed, a change followed within ~10.
_ALPHA = 0.2


class MemberRates:
    """A member's moving averages of its device's decode seconds per sample (:meth:`timed`) and of its training step
    (:meth:`stepped`); :meth:`report` gives them once both were measured.

    On CUDA the decode is timed by events recorded around it on the decoding thread's stream, read once they
    completed (queried, never waited for), so timing never blocks the prefetcher; elsewhere by the wall clock."""

    def __init__(self) -> None:
        self._decode: Optional[float] = None
        self._step: Optional[float] = None
        self._pending: Deque[Tuple[Any, Any, int]] = collections.deque()  # (start, end, samples) not yet read
        self._lock = threading.Lock()

    def timed(self, device: Any, samples: int, decode: Callable[[], T]) -> T:
        """``decode()``, timed as the device's work on ``samples`` encoded samples (none: not timed)."""
        if samples <= 0:
            return decode()
        if device.type != "cuda":
            t0 = time.perf_counter()
            out = decode()
            self._average("_decode", (time.perf_counter() - t0) / samples)
            return out
        import torch

        stream = torch.cuda.current_stream(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        out = decode()
        end.record(stream)
        self._pending.append((start, end, samples))
        self._read_completed()
        return out

    def _read_completed(self) -> None:
        while self._pending and self._pending[0][1].query():
            start, end, samples = self._pending.popleft()
            self._average("_decode", start.elapsed_time(end) / 1e3 / samples)

    def decoded(self, per_sample: float) -> None:
        """The device's decode seconds per sample, measured where the decode ran (a decode worker)."""
        self._average("_decode", per_sample)

    def stepped(self, seconds: float) -> None:
        """The loop spent ``seconds`` between two batches, outside ``next()``."""
        self._average("_step", seconds)

    def _average(self, name: str, value: float) -> None:
        with self._lock:
            old = getattr(self, name)
            setattr(self, name, value if old is None else old + _ALPHA * (value - old))

    def report(self) -> Optional[PrepRates]:
        """The averages to send, or None until both were measured."""
        decode, step = self._decode, self._step
        if decode is None or step is None or decode <= 0 or step <= 0:
            return None
        return PrepRates(decode, step)
