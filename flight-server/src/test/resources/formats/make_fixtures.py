"""Writes the Parquet and HDF5 fixtures of ParquetFormatTest and Hdf5FormatTest with the reference writers
(pyarrow.parquet, h5py). Values are formulas of the row number, which the Java tests compute again.

    .venv/bin/python flight-server/src/test/resources/formats/make_fixtures.py
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
ROWS = 10


def parquet_table() -> pa.Table:
    i = np.arange(ROWS)
    return pa.table({
        "x": pa.array(i * 3, pa.int64()),
        "f": pa.array(i / 4, pa.float32()),
        "s": pa.array([None if k % 4 == 3 else f"row {k}" for k in i], pa.string()),
        "v": pa.array([None if k == 5 else [k + j / 2 for j in range(k % 3)] for k in i], pa.list_(pa.float64())),
        "b": pa.array([bytes([k]) * k for k in i], pa.binary()),
        "i8": pa.array(-i, pa.int8()),
        "u16": pa.array(i * 1000, pa.uint16()),
        "y": pa.array(i % 3, pa.int64()),
    })


def main() -> None:
    pq.write_table(parquet_table(), HERE / "rows.parquet", row_group_size=4, compression="snappy")
    pq.write_table(parquet_table(), HERE / "rows-zstd.parquet", row_group_size=3, compression="zstd")
    with h5py.File(HERE / "arrays.h5", "w") as f:
        f.create_dataset("contig", data=np.arange(ROWS * 2 * 3, dtype="<f4").reshape(ROWS, 2, 3) / 2)
        f.create_dataset("chunked", data=np.arange(ROWS * 5 * 4, dtype="<i2").reshape(ROWS, 5, 4) - 100,
                         chunks=(3, 2, 3), compression="gzip", shuffle=True)
        f.create_dataset("big", data=np.arange(ROWS * 3, dtype=">f8").reshape(ROWS, 3), chunks=(4, 3))
        f.create_dataset("labels", data=np.arange(ROWS, dtype="<i8") % 4)
    with h5py.File(HERE / "contig.h5", "w") as f:  # one dataset, its data last in the file: for cutting
        f.create_dataset("x", data=np.arange(ROWS * 64, dtype="<f8").reshape(ROWS, 64))


if __name__ == "__main__":
    main()
