"""Decoders of formats whose payload is not the stored bytes: format name -> a factory that takes the dataset's
description (its ``format_info``) and returns the default ``loader`` of ``unstall.torch.Dataset``."""

from __future__ import annotations

from typing import Any, Callable

from . import hdf5, parquet
from ..protocol import DatasetInfo

__all__ = ["DECODERS"]

DECODERS: dict[str, Callable[[DatasetInfo], Callable[[memoryview], Any]]] = {
    "parquet": parquet.RowDecoder,
    "hdf5": hdf5.ArrayDecoder,
}
