"""Bad input, each on its own: the error names what is wrong, and the sidecar keeps serving."""

from __future__ import annotations

import functools
import json
import tarfile
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pytest

import unstall
from unstall import prep
from unstall.client import FlightClient
from unstall.protocol import encode_fetch_ticket
from unstall.torch import DataLoader, Dataset
from batches import keep
from datagen import Record, make_image_folder, make_tfrecord_shards
from format_cases import webdataset_case
from waits import wait_until

FIXTURES = Path(__file__).resolve().parents[2] / "protocol" / "fixtures"


@pytest.fixture(scope="module")
def small_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("small")
    make_image_folder(root, ["x", "y"], per_class=3, seed=9, extras=False)
    return root


def _auth(sidecar: unstall.Sidecar) -> fl.FlightCallOptions:
    return fl.FlightCallOptions(headers=[(b"authorization", b"Bearer " + sidecar.token.encode())])


def test_unknown_dataset_is_named(sidecar: unstall.Sidecar, small_root: Path) -> None:
    sidecar.register_dataset("known", small_root)
    with pytest.raises(unstall.DatasetNotFoundError, match="nope-ds") as err:
        Dataset("nope-ds", sidecar=sidecar)
    assert isinstance(err.value, KeyError)
    with sidecar.flight_client() as c:
        with pytest.raises(unstall.DatasetNotFoundError, match="nope-ds.*known|known.*nope-ds"):
            c.fetch("nope-ds", [0])
        with pytest.raises(unstall.DatasetNotFoundError, match="nope-ds"):
            c.describe("nope-ds")


def test_malformed_tickets_with_raw_pyarrow_then_a_good_request(sidecar: unstall.Sidecar, small_root: Path) -> None:
    sidecar.register_dataset("imgs", small_root)  # the fixtures' dataset name
    cases = json.loads((FIXTURES / "malformed-tickets.json").read_text())
    with fl.connect(sidecar.flight_location) as client:
        for case in cases + [{"file": None, "error_prefix": "malformed ticket: bad magic"}]:
            data = (FIXTURES / case["file"]).read_bytes() if case["file"] else b"garbage!" * 4
            with pytest.raises(pa.ArrowInvalid, match="INVALID_ARGUMENT|invalid argument") as err:
                client.do_get(fl.Ticket(data), _auth(sidecar)).read_all()
            assert case["error_prefix"] in str(err.value), (case, str(err.value))
            good = client.do_get(fl.Ticket(encode_fetch_ticket("imgs", [0, 2])), _auth(sidecar)).read_all()
            assert good.column("id").to_pylist() == [0, 2]
        golden = fl.Ticket((FIXTURES / "ticket-fetch-v1.bin").read_bytes())
        with pytest.raises(pa.ArrowInvalid, match="sample id 7 .*'imgs'"):  # the golden ids exceed this dataset
            client.do_get(golden, _auth(sidecar)).read_all()


def test_sample_id_out_of_range(sidecar: unstall.Sidecar, small_root: Path) -> None:
    ds = Dataset("range", root=small_root, sidecar=sidecar)
    with pytest.raises(unstall.InvalidRequestError, match=r"(?s)\b6\b.*'range'.*\b6\b") as err:
        ds.fetch([0, 6])
    assert isinstance(err.value, ValueError)
    with pytest.raises(IndexError, match="-1"):
        ds[-1]
    assert ds[5][1] == 1  # still serving


def test_file_deleted_after_registration(sidecar: unstall.Sidecar, tmp_path: Path) -> None:
    root = tmp_path / "del"
    make_image_folder(root, ["a", "b"], per_class=4, seed=10, extras=False)
    ds = Dataset("deleted", root=root, sidecar=sidecar)
    index = 6
    key = ds.fetch([index]).column("key")[0].as_py()  # now cached ...
    assert key.startswith("b/img002.")
    ds2 = Dataset("deleted2", root=root, sidecar=sidecar)  # ... so use a dataset that never read it
    (root / key).unlink()
    with pytest.raises(unstall.DataFileNotFoundError, match=key) as err:
        ds2.fetch([0, index])
    assert isinstance(err.value, FileNotFoundError) and "deleted2" in str(err.value)
    loader = DataLoader(ds2, batch_size=8, num_workers=2, collate_fn=keep)
    with pytest.raises(unstall.DataFileNotFoundError, match=r"(?s)in DataLoader worker process \d.*" + key):
        list(loader)
    assert len(ds2.fetch([0, 1, 2])) == 3  # the rest still served


def test_corrupt_tfrecord_record_names_file_and_offset(sidecar: unstall.Sidecar, tmp_path: Path) -> None:
    records = make_tfrecord_shards(tmp_path, shards=2, per_shard=4, size=64, seed=11)
    bad = records[5]  # part-00001.tfrecord, second record
    path = tmp_path / bad.shard
    blob = bytearray(path.read_bytes())
    blob[bad.offset + 12 + 10] ^= 0xFF  # a data byte: the data CRC no longer matches
    path.write_bytes(bytes(blob))
    ds = Dataset("corrupt", root=tmp_path, format="tfrecord", sidecar=sidecar)
    with pytest.raises(unstall.DataError, match=bad.shard) as err:  # bad data, not an internal error
        ds.fetch([4, 5])
    msg = str(err.value)
    assert str(bad.offset) in msg or str(bad.offset + 12) in msg, msg
    assert ds.fetch([4, 6]).column("key").to_pylist() == [records[4].key, records[6].key]


def _corrupt(root: Path, record: Record) -> Path:
    """Flips a data byte of ``record``: its data CRC no longer matches."""
    path = root / record.shard
    blob = bytearray(path.read_bytes())
    blob[record.offset + 12 + 3] ^= 0xFF
    path.write_bytes(bytes(blob))
    return path


def _assert_names_the_record(e: unstall.DataError, dataset: str, sample: int, record: Record, path: Path) -> None:
    assert isinstance(e, ValueError) and not isinstance(e, unstall.SidecarInternalError)
    assert (e.dataset, e.sample, e.key, e.file, e.offset) == (dataset, sample, record.key, str(path), record.offset)
    assert e.reason is not None and e.reason.endswith("data CRC32C mismatch"), e.reason
    assert "unstall.data-error" not in str(e), "the marker line is read, not shown in the message"


@pytest.mark.parametrize("transport", ["flight", "shm"])
def test_a_corrupt_record_is_a_data_error_naming_the_sample_on_both_transports_and_from_workers(
        sidecar: unstall.Sidecar, tmp_path: Path, transport: str) -> None:
    records = make_tfrecord_shards(tmp_path, shards=1, per_shard=6, size=32, seed=12)
    path = _corrupt(tmp_path, records[2])
    name = f"corrupt-{transport}"
    ds = Dataset(name, root=tmp_path, format="tfrecord", sidecar=sidecar, transport=transport)
    with pytest.raises(unstall.DataError) as err:
        ds.fetch([0, 2])
    _assert_names_the_record(err.value, name, 2, records[2], path)
    assert str(err.value).startswith(f"dataset '{name}' sample 2 ('{records[2].key}'): corrupt TFRecord record in "
                                     f"'{path}' at byte offset {records[2].offset}: "), str(err.value)
    # torch re-raises a worker's error from its class and text alone: the fields come back too.
    loader = DataLoader(ds, batch_size=3, num_workers=1, collate_fn=keep)
    with pytest.raises(unstall.DataError, match=r"^Caught DataError in DataLoader worker process 0") as err:
        list(loader)
    _assert_names_the_record(err.value, name, 2, records[2], path)
    assert ds.fetch([3, 4, 5]).num_rows == 3  # still serving


def test_a_corrupt_record_met_by_a_prep_worker_process_is_a_data_error_in_the_main_process(
        sidecar: unstall.Sidecar, tmp_path: Path) -> None:
    records = make_tfrecord_shards(tmp_path, shards=1, per_shard=8, size=16, seed=13)
    path = _corrupt(tmp_path, records[5])
    sidecar.register_dataset("corrupt-prep-workers", tmp_path, format="tfrecord")
    with prep.SharedTransformLoader("corrupt-prep-workers", np.copy, fingerprint="bytes", batch_size=4,
                                    loader=functools.partial(np.frombuffer, dtype=np.uint8), num_workers=1,
                                    shuffle=False, epochs=1, sidecar=sidecar) as loader:
        with pytest.raises(unstall.DataError, match=r"^Caught DataError in DataLoader worker process 0") as err:
            list(loader)
    _assert_names_the_record(err.value, "corrupt-prep-workers", 5, records[5], path)


def test_a_truncated_tar_is_a_data_error_naming_the_dataset_file_and_offset(
        sidecar: unstall.Sidecar, tmp_path: Path) -> None:
    webdataset_case(tmp_path, payload=True)
    shard = tmp_path / "shard-00001.tar"
    data = shard.read_bytes()
    with tarfile.open(shard) as t:
        jpg = t.getmembers()[1]
    shard.write_bytes(data[:jpg.offset_data + jpg.size // 2])  # cut inside a member's data
    with pytest.raises(unstall.DataError, match="runs past the end of the file") as err:  # at registration (Py4J)
        Dataset("cut-tar", root=tmp_path, format="webdataset", options={"payload": "jpg;png"}, sidecar=sidecar)
    e = err.value
    assert (e.dataset, e.sample, e.key, e.file, e.offset) == ("cut-tar", None, None, str(shard), jpg.offset_data - 512)
    assert e.reason is not None and e.reason.startswith(f"corrupt tar file '{shard}' at byte offset "), e.reason


def test_missing_or_wrong_token_is_unauthenticated(sidecar: unstall.Sidecar, small_root: Path) -> None:
    sidecar.register_dataset("auth", small_root)
    ticket = fl.Ticket(encode_fetch_ticket("auth", [0]))
    with fl.connect(sidecar.flight_location) as raw:
        with pytest.raises(fl.FlightUnauthenticatedError):
            raw.do_get(ticket).read_all()
        with pytest.raises(fl.FlightUnauthenticatedError):
            list(raw.list_flights())
        wrong = fl.FlightCallOptions(headers=[(b"authorization", b"Bearer " + b"0" * 64)])
        with pytest.raises(fl.FlightUnauthenticatedError):
            raw.do_get(ticket, wrong).read_all()
        assert raw.do_get(ticket, _auth(sidecar)).read_all().num_rows == 1
    with FlightClient(sidecar.flight_location, "not-the-token") as c:
        with pytest.raises(unstall.AuthenticationError) as err:
            c.fetch("auth", [0])
        assert sidecar.token not in str(err.value)
    with pytest.raises(unstall.AuthenticationError):
        unstall.Sidecar(sidecar.flight_location, token="wrong", control_port=sidecar.control_port)


def test_registration_errors_name_the_problem(sidecar: unstall.Sidecar, small_root: Path, tmp_path: Path) -> None:
    sidecar.register_dataset("taken", small_root)
    with pytest.raises(unstall.SidecarError, match="taken"):
        sidecar.register_dataset("taken", tmp_path)
    missing = tmp_path / "does-not-exist"
    with pytest.raises(unstall.SidecarError, match="does-not-exist"):
        sidecar.register_dataset("missing", missing)
    with pytest.raises(ValueError, match="unknown format"):
        sidecar.register_dataset("fmt", small_root, format="hdf9")


def test_bounds_are_serve_options_and_a_refusal_names_the_option(
        start_sidecar: Callable[..., unstall.Sidecar], small_root: Path) -> None:
    s = start_sidecar("8MiB", extra_args=("--local-connections", "2", "--max-plan-ids", "4"))
    s.register_dataset("imgs", small_root)
    with s.flight_client() as c:
        with pytest.raises(unstall.ResourceExhaustedError, match="--max-plan-ids 4"):
            c.prefetch("imgs", [0, 1, 2, 3, 4], 0)
        assert c.prefetch("imgs", [3, 2, 1, 0], 0) == 4  # the sidecar serves on
    a, b, c3 = s.local_client(), s.local_client(), s.local_client()
    assert a is not None and b is not None and c3 is not None
    try:
        a.connect()
        b.connect()
        with pytest.raises(unstall.ResourceExhaustedError, match="--local-connections"):
            c3.connect()
        a.close()  # one goes away: the next connection is served

        def served() -> bool:
            try:
                c3.connect()
                return True
            except unstall.ResourceExhaustedError:
                return False

        wait_until(served, "a local connection once another closed")
        assert c3.fetch(c3.open_session("imgs", "bounds"), [1, 0], epoch=0).ids.tolist() == [1, 0]
    finally:
        for client in (a, b, c3):
            client.close()
