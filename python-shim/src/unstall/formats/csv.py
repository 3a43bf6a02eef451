"""``csv``: a sample is one row, parsed by Arrow's CSV reader with the columns and types the sidecar inferred
over the whole file (or that ``options={"types": ...}`` declared): ``{column: value}`` as
``pyarrow.Table.to_pylist()`` gives it (None for nulls), and ``(row, label)`` with a ``label`` column."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import pyarrow as pa
import pyarrow.csv as pacsv

from ..protocol import DatasetInfo

__all__ = ["CsvDecoder"]


class CsvDecoder:
    """Parses a batch's rows in one call of ``pyarrow.csv.read_csv``."""

    def __init__(self, info: DatasetInfo) -> None:
        layout = info.layout or {}
        try:
            self.columns: List[str] = [str(c) for c in layout["columns"]]
            self.delimiter = str(layout["delimiter"])
            self.label: Optional[str] = layout.get("label")
            declared = dict(layout["types"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"dataset {info.name!r}: the sidecar's csv layout {layout!r} is unusable ({e})") from None
        self.types: Dict[str, pa.DataType] = {}
        for column, name in declared.items():
            try:
                self.types[column] = pa.type_for_alias(str(name))
            except ValueError:
                raise ValueError(f"dataset {info.name!r}: option 'types' gives column {column!r} the type {name!r}, "
                                 "which is not an Arrow type name (int64, double, string, bool, timestamp[s], ...)") from None
        self.labelled = self.label is not None

    def decode(self, payloads: Sequence[memoryview], labels: Sequence[Optional[int]],
               keys: Sequence[str]) -> List[Any]:
        table = pacsv.read_csv(
            pa.py_buffer(b"\n".join(payloads)),
            read_options=pacsv.ReadOptions(column_names=self.columns, use_threads=False),
            parse_options=pacsv.ParseOptions(delimiter=self.delimiter, newlines_in_values=True),
            convert_options=pacsv.ConvertOptions(column_types=self.types),
        )
        rows = table.to_pylist()
        if len(rows) != len(payloads):
            raise ValueError(f"csv rows {list(keys)[:3]}...: Arrow parsed {len(rows)} rows from {len(payloads)}")
        if self.label is None:
            return rows
        return [(row, row.pop(self.label)) for row in rows]
