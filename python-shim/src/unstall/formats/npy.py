"""``npy`` and ``npz``: a sample is one row of an array (along its first axis), as ``numpy.load(f)[i]``."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from ..protocol import DatasetInfo

__all__ = ["NpyDecoder"]


class NpyDecoder:
    """Each payload is one row's bytes: an array of the file's dtype (byte order included) and row shape that
    owns its memory; ``(row, label)`` when the dataset has a label array."""

    def __init__(self, info: DatasetInfo) -> None:
        layout = info.layout or {}
        try:
            self.dtype = np.dtype(str(layout["dtype"]))
            self.shape: Tuple[int, ...] = tuple(int(n) for n in layout.get("shape", ()))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"dataset {info.name!r}: the sidecar's {info.format} layout {layout!r} is unusable ({e})") from None
        self.labelled = layout.get("label") is not None

    def decode(self, payloads: Sequence[memoryview], labels: Sequence[Optional[int]],
               keys: Sequence[str]) -> List[Any]:
        rows = [np.frombuffer(p, dtype=self.dtype).reshape(self.shape).copy() for p in payloads]
        if self.labelled:
            return list(zip(rows, labels))
        return rows
