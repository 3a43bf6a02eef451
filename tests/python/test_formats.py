"""The formats decoded by ``unstall.formats`` on local files written by their reference writers: every sample's
exact bytes/values and label over 2 epochs of a 2-worker DataLoader, what the format's own Python reader yields,
and errors naming file and offset for truncated and corrupt files. (The same files in a bucket: test_s3.py.)"""

from __future__ import annotations

import re
import tarfile
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import unstall
from unstall.torch import Dataset
from format_cases import Case, assert_epochs, csv_case, npy_case, npz_case, webdataset_case

CASES: dict[str, Callable[[Path], Case]] = {
    "webdataset-dict": lambda root: webdataset_case(root, payload=False),
    "webdataset-tuple": lambda root: webdataset_case(root, payload=True),
    "npy": npy_case,
    "npz": npz_case,
    "csv": csv_case,
}


@pytest.mark.parametrize("case", list(CASES))
def test_two_epochs_with_two_workers_yield_every_sample_exactly(sidecar: unstall.Sidecar, tmp_path: Path,
                                                                 case: str) -> None:
    c = CASES[case](tmp_path / "data")
    assert_epochs(c, f"fmt-{case}", sidecar, str(c.root))


def test_decoders_travel_to_workers_over_flight_too(sidecar: unstall.Sidecar, tmp_path: Path) -> None:
    c = webdataset_case(tmp_path, payload=False)  # the layout comes with the Flight description
    ds = assert_epochs(c, "fmt-wds-flight", sidecar, str(c.root), transport="flight")
    assert ds.transport == "flight"


def test_webdataset_dicts_are_what_webdataset_yields(sidecar: unstall.Sidecar, tmp_path: Path) -> None:
    import webdataset as wds

    webdataset_case(tmp_path, payload=False)
    shards = sorted(str(p) for p in tmp_path.glob("*.tar"))
    theirs = list(wds.WebDataset(shards, shardshuffle=False))
    ds = Dataset("fmt-wds-order", root=str(tmp_path), format="webdataset", sidecar=sidecar)
    ours = [ds[i] for i in range(len(ds))]
    where = ("__url__", "__local_path__")  # theirs: the path given; ours: the sidecar's URI of the shard
    assert [{k: v for k, v in s.items() if k not in where} for s in ours] == \
        [{k: v for k, v in s.items() if k not in where} for s in theirs]
    assert ours[0]["__url__"] == (tmp_path / "shard-00000.tar").as_uri()


def test_rows_are_what_numpy_and_pyarrow_read(sidecar: unstall.Sidecar, tmp_path: Path) -> None:
    import pyarrow.csv as pacsv

    npz_case(tmp_path / "z")
    x = np.load(tmp_path / "z" / "data.npz")["x_train"]
    ds = Dataset("fmt-npz-order", root=str(tmp_path / "z" / "data.npz"), format="npz", options={"array": "x_train"},
                 sidecar=sidecar, transform=lambda a: a.astype(np.float64))
    assert all(np.array_equal(ds[i], x[i].astype(np.float64)) for i in range(len(x)))
    csv_case(tmp_path / "c")
    table = pacsv.read_csv(tmp_path / "c" / "table.csv").to_pylist()
    rows = Dataset("fmt-csv-order", root=str(tmp_path / "c"), format="csv", sidecar=sidecar)
    assert [rows[i] for i in range(len(rows))] == table  # the types Arrow infers over the file, and its nulls


def _registration_error(sidecar: unstall.Sidecar, name: str, root: Path, fmt: str, **options: object) -> str:
    with pytest.raises(unstall.SidecarError) as e:
        Dataset(name, root=str(root), format=fmt, options=options or None, sidecar=sidecar)
    return str(e.value)


def test_truncated_and_corrupt_files_are_named_with_their_offset(sidecar: unstall.Sidecar, tmp_path: Path) -> None:
    webdataset_case(tmp_path / "w", payload=True)
    shard = tmp_path / "w" / "shard-00001.tar"
    data = shard.read_bytes()
    with tarfile.open(shard) as t:
        jpg = t.getmembers()[1]
    shard.write_bytes(data[:jpg.offset_data + jpg.size // 2])  # cut inside a member's data
    msg = _registration_error(sidecar, "bad-tar", tmp_path / "w", "webdataset")
    assert re.search(rf"corrupt tar file '{re.escape(str(shard))}' at byte offset {jpg.offset_data - 512}: member "
                     f"'{jpg.name}' .* runs past the end of the file .*truncated", msg), msg
    flipped = bytearray(data)
    flipped[100] ^= 0x01  # the first header's mode field: its checksum no longer matches
    shard.write_bytes(bytes(flipped))
    msg = _registration_error(sidecar, "bad-tar2", tmp_path / "w", "webdataset")
    assert f"corrupt tar file '{shard}' at byte offset 0: header checksum mismatch" in msg, msg

    npy_case(tmp_path / "n")
    part = tmp_path / "n" / "x-1.npy"
    part.write_bytes(part.read_bytes()[:-10])
    msg = _registration_error(sidecar, "bad-npy", tmp_path / "n", "npy", label="labels.npy")
    assert re.search(rf"corrupt npy file '{re.escape(str(part))}' at byte offset \d+: .*truncated", msg), msg

    npz = tmp_path / "z.npz"
    np.savez_compressed(npz, x=np.zeros((3, 2)))
    msg = _registration_error(sidecar, "bad-npz", npz, "npz")
    assert f"member 'x.npy' of '{npz}' is compressed" in msg, msg

    table = tmp_path / "t"
    table.mkdir()
    (table / "t.csv").write_text('a,b\n1,2\n3,"unterminated\n')
    msg = _registration_error(sidecar, "bad-csv", table, "csv")
    assert f"corrupt CSV file '{table / 't.csv'}' at byte offset 8 (line 3): unterminated quoted field" in msg, msg


def test_options_are_checked_and_named(sidecar: unstall.Sidecar, tmp_path: Path) -> None:
    csv_case(tmp_path)
    msg = _registration_error(sidecar, "opt-1", tmp_path, "csv", lable="y")
    assert "unknown option 'lable'" in msg and "label" in msg, msg
    msg = _registration_error(sidecar, "opt-2", tmp_path, "csv", label="nope")
    assert "option 'label' names the column 'nope'" in msg, msg
    with pytest.raises(ValueError, match="option 'types' gives column 'id' the type 'integer'"):
        Dataset("opt-3", root=str(tmp_path), format="csv", options={"types": {"id": "integer"}}, sidecar=sidecar)
