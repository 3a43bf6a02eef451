"""Parquet rows: each payload is one Arrow IPC record batch message of one row, in the schema the sidecar
sent once in the dataset's description. A row decodes to what ``pyarrow.Table.to_pylist()`` gives for it: a
dict, column name -> Python value (the label column, when the dataset has one, is the target instead)."""

from __future__ import annotations

import base64
from typing import Any

import pyarrow as pa

from ..protocol import DatasetInfo

__all__ = ["RowDecoder"]


class RowDecoder:
    """``loader`` of a Parquet dataset: payload -> ``{column: value}``. Picklable (for DataLoader workers)."""

    def __init__(self, info: DatasetInfo) -> None:
        fi = info.format_info or {}
        if "arrow_schema" not in fi:
            raise ValueError(f"dataset {info.name!r}: its description carries no Arrow schema (format_info)")
        self.schema: pa.Schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(fi["arrow_schema"])))

    def __call__(self, payload: memoryview) -> dict[str, Any]:
        rows: list[dict[str, Any]] = pa.ipc.read_record_batch(pa.py_buffer(payload), self.schema).to_pylist()
        return rows[0]
