"""``parquet``: a sample is one row, as ``pyarrow.Table.to_pylist()`` gives it: a dict, column name -> Python value
(the label column, when the dataset has one, is the target instead). Each payload is one Arrow IPC record batch
message of one row, in the schema the sidecar sent once in the layout."""

from __future__ import annotations

import base64
from typing import Any, List, Optional, Sequence

import pyarrow as pa

from ..protocol import DatasetInfo

__all__ = ["ParquetDecoder"]


class ParquetDecoder:
    """Payloads -> ``{column: value}`` dicts; ``(row, label)`` when the dataset has a label column. Picklable."""

    def __init__(self, info: DatasetInfo) -> None:
        layout = info.layout or {}
        try:
            self.schema: pa.Schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(layout["arrow_schema"])))
        except (KeyError, TypeError, ValueError, pa.ArrowInvalid) as e:
            raise ValueError(f"dataset {info.name!r}: the sidecar's parquet layout has no usable Arrow schema ({e})") from None
        self.labelled = layout.get("label") is not None

    def decode(self, payloads: Sequence[memoryview], labels: Sequence[Optional[int]],
               keys: Sequence[str]) -> List[Any]:
        rows = [pa.ipc.read_record_batch(pa.py_buffer(p), self.schema).to_pylist()[0] for p in payloads]
        if self.labelled:
            return list(zip(rows, labels))
        return rows
