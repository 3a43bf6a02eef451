"""HDF5 rows: each payload is one row of the dataset as stored (C order, the file's byte order). A row decodes
to what ``h5py``'s ``dset[i]`` gives: a writable numpy array of the dataset's dtype and the row's shape, or a
numpy scalar for a one-dimensional dataset."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..protocol import DatasetInfo

__all__ = ["ArrayDecoder"]


class ArrayDecoder:
    """``loader`` of an HDF5 dataset: payload -> ``numpy.ndarray`` (a copy: the payload may be shared memory)."""

    def __init__(self, info: DatasetInfo) -> None:
        fi = info.format_info or {}
        try:
            self.dtype = np.dtype(str(fi["dtype"]))
            self.shape = tuple(int(n) for n in fi["shape"])
        except (KeyError, TypeError) as e:
            raise ValueError(f"dataset {info.name!r}: its description has no dtype and shape (format_info)") from e

    def __call__(self, payload: memoryview) -> Any:
        row = np.frombuffer(payload, dtype=self.dtype)
        if not self.shape:
            return row[0].copy()  # a numpy scalar, as h5py gives for dset[i] of a 1-d dataset
        return row.reshape(self.shape).copy()
