"""Parquet and HDF5 datasets through a real sidecar and torch DataLoaders: files written by pyarrow.parquet and
h5py, read back value for value, with labels, over 2 epochs with 2 workers; truncated and corrupt files give
errors that name the file and where. (The same over S3: test_s3.py.)"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pyarrow.parquet as pq
import pytest

import unstall
from unstall.torch import Dataset
from datagen import make_hdf5_file, make_parquet_files
from format_checks import check_hdf5, check_parquet


def test_parquet_rows_columns_and_labels(sidecar: unstall.Sidecar, tmp_path: Path) -> None:
    rows = make_parquet_files(tmp_path / "pq", files=2, rows=23, row_group_size=5, seed=1)
    ds = Dataset("pq-local", root=tmp_path / "pq", format="parquet", options={"label": "label"}, sidecar=sidecar)
    assert ds.info.layout is not None and ds.info.layout["columns"] == ["pixels", "caption", "embedding", "score"]
    check_parquet(ds, rows)
    only = Dataset("pq-caption", root=tmp_path / "pq" / "part-1.parquet", format="parquet",
                   options={"columns": ["caption"]}, sidecar=sidecar)
    assert [only[i] for i in (0, 1)] == [{"caption": rows[23 + i]["caption"]} for i in (0, 1)]  # no label: the row


def test_hdf5_chunked_and_contiguous(sidecar: unstall.Sidecar, tmp_path: Path) -> None:
    path = tmp_path / "train.h5"
    make_hdf5_file(path, rows=30, seed=2)
    for dataset in ("images", "features"):
        ds = Dataset(f"h5-{dataset}", root=path, format="hdf5", options={"dataset": dataset, "label": "labels"},
                     sidecar=sidecar)
        check_hdf5(ds, path, dataset)
    assert ds.info.layout == {"dtype": "<f4", "shape": [7], "dataset": "features", "label": "labels"}


def test_options_are_checked(sidecar: unstall.Sidecar, tmp_path: Path) -> None:
    make_parquet_files(tmp_path / "pq", files=1, rows=4, row_group_size=2)
    with pytest.raises(unstall.SidecarError, match="unknown option 'colums'"):
        Dataset("pq-typo", root=tmp_path / "pq", format="parquet", options={"colums": ["x"]}, sidecar=sidecar)
    with pytest.raises(unstall.SidecarError, match=r"part-0.parquet' has no column 'nope'"):
        Dataset("pq-nope", root=tmp_path / "pq", format="parquet", options={"columns": ["nope"]}, sidecar=sidecar)
    with pytest.raises(unstall.SidecarError, match="option 'dataset' is required"):
        Dataset("h5-none", root=tmp_path / "pq", format="hdf5", sidecar=sidecar)


def test_a_truncated_parquet_file_is_named_with_its_size(sidecar: unstall.Sidecar, tmp_path: Path) -> None:
    make_parquet_files(tmp_path / "pq", files=1, rows=10, row_group_size=5)
    data = (tmp_path / "pq" / "part-0.parquet").read_bytes()
    (tmp_path / "pq" / "part-0.parquet").write_bytes(data[:-50])
    with pytest.raises(unstall.SidecarError, match=rf"part-0.parquet' \({len(data) - 50} bytes\): cannot read its footer"):
        Dataset("pq-cut", root=tmp_path / "pq", format="parquet", sidecar=sidecar)
    assert sidecar.protocol_version() == 1  # still serving


def test_a_corrupt_parquet_row_group_is_named_with_its_offset(sidecar: unstall.Sidecar, tmp_path: Path) -> None:
    make_parquet_files(tmp_path / "pq", files=1, rows=10, row_group_size=5)
    path = tmp_path / "pq" / "part-0.parquet"
    group = pq.ParquetFile(path).metadata.row_group(1)
    columns = [group.column(c) for c in range(group.num_columns)]
    start = min(c.dictionary_page_offset or c.data_page_offset for c in columns)
    size = sum(c.total_compressed_size for c in columns)
    data = bytearray(path.read_bytes())
    data[start + 8:start + size - 16] = b"\xa5" * (size - 24)
    path.write_bytes(bytes(data))
    with pytest.raises(unstall.SidecarError, match=rf"part-0.parquet.*row group 1 \(5 rows at byte offset {start}"):
        Dataset("pq-bad", root=tmp_path / "pq", format="parquet", sidecar=sidecar)


def test_a_corrupt_hdf5_chunk_is_named_with_its_offset(sidecar: unstall.Sidecar, tmp_path: Path) -> None:
    path = tmp_path / "bad.h5"
    make_hdf5_file(path, rows=12)
    with h5py.File(path) as f:
        info = f["images"].id.get_chunk_info_by_coord((4, 0, 0, 0))  # the chunk holding rows 4..7
    data = bytearray(path.read_bytes())
    data[info.byte_offset + 4:info.byte_offset + info.size] = bytes(info.size - 4)
    path.write_bytes(bytes(data))
    ds = Dataset("h5-bad", root=path, format="hdf5", options={"dataset": "images"}, sidecar=sidecar)
    assert ds[0].shape == (6, 5, 3)  # other chunks read fine (no label: the row alone)
    with pytest.raises(unstall.SidecarError, match=rf"bad.h5' at byte offset {info.byte_offset}"):
        ds[5]
    assert ds[11].shape == (6, 5, 3)  # the sidecar keeps serving


def test_a_truncated_hdf5_file_is_named_with_the_offset(sidecar: unstall.Sidecar, tmp_path: Path) -> None:
    path = tmp_path / "cut.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(40, dtype="<f8").reshape(10, 4))
        offset = f["x"].id.get_offset()
    data = path.read_bytes()
    path.write_bytes(data[:-16])
    with pytest.raises(unstall.SidecarError, match=rf"cut.h5.*byte offset {offset}\.\.{len(data)}"):
        Dataset("h5-cut", root=path, format="hdf5", options={"dataset": "x"}, sidecar=sidecar)
