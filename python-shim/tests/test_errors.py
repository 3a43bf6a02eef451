"""Errors by kind: bad data (the sidecar's marker line) is a DataError with its fields on every path; an internal
fault stays SidecarInternalError. A real pyarrow Flight server stands in for the sidecar's answers."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.flight as fl
import pytest

import unstall
from unstall import protocol
from unstall.client import FlightClient
from unstall.errors import from_java_error, from_status


@pytest.fixture(scope="module")
def golden(fixtures_dir: Path) -> tuple[str, dict[str, Any]]:
    """The golden description (marker line, then message) and what it holds."""
    return ((fixtures_dir / "data-error-v1.txt").read_text(encoding="utf-8"),
            json.loads((fixtures_dir / "data-error-v1.json").read_text(encoding="utf-8")))


def _assert_golden(e: BaseException, expected: dict[str, Any]) -> None:
    assert isinstance(e, unstall.DataError) and isinstance(e, ValueError)
    assert not isinstance(e, unstall.SidecarInternalError)
    f = expected["fields"]
    assert (e.dataset, e.sample, e.key, e.file, e.offset, e.reason) == (
        f["dataset"], f["sample"], f["key"], f["file"], f["offset"], f["reason"])


def test_the_golden_description_is_a_data_error_with_its_fields(golden: tuple[str, dict[str, Any]]) -> None:
    text, expected = golden
    e = from_status("INVALID_ARGUMENT", text)
    _assert_golden(e, expected)
    assert str(e) == expected["message"] and e.code == "INVALID_ARGUMENT"
    # Over the local socket: an ERROR frame, code 1 (INVALID_ARGUMENT), the same text.
    reply = protocol.decode_local_reply(b"\x01\x01" + text.encode())
    assert isinstance(reply, protocol.LocalError)
    _assert_golden(from_status(reply.status, reply.message), expected)
    # Over Py4J: the Java stack trace text py4j hands back.
    trace = f"An error occurred while calling t.registerDataset.\n: java.io.IOException: {text}\n\tat x.y(Z.java:1)\n"
    _assert_golden(from_java_error(Exception(trace)), expected)


def test_the_fields_survive_torch_re_raising_it_and_pickling(golden: tuple[str, dict[str, Any]]) -> None:
    from torch.utils.data._utils import ExceptionWrapper

    text, expected = golden
    try:
        raise from_status("INVALID_ARGUMENT", text)
    except unstall.DataError:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 3")
    with pytest.raises(unstall.DataError, match=r"^Caught DataError in DataLoader worker process 3") as err:
        wrapped.reraise()
    _assert_golden(err.value, expected)
    assert expected["message"] in str(err.value) and "unstall.data-error" not in str(err.value)
    _assert_golden(pickle.loads(pickle.dumps(err.value)), expected)


def test_no_marker_no_data_error() -> None:
    assert type(from_status("INVALID_ARGUMENT", "bad option 'x'")) is unstall.InvalidRequestError
    assert type(from_status("INTERNAL", "NullPointerException")) is unstall.SidecarInternalError
    # The marker means bad data only where the sidecar can send it: a refused argument, not another status.
    marked = "unstall.data-error: {}\nboom"
    assert type(from_status("INTERNAL", marked)) is unstall.SidecarInternalError
    e = unstall.DataError("a message of the user's own")
    assert (e.dataset, e.sample, e.key, e.file, e.offset, e.reason) == (None,) * 6 and not getattr(e, "__notes__", [])


class _Answers(fl.FlightServerBase):
    """DoGet answers by the ticket: the golden data error, a bad request, or an internal fault."""

    def __init__(self, data_error: str) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.data_error = data_error

    def do_get(self, context: Any, ticket: fl.Ticket) -> fl.RecordBatchStream:
        dataset = protocol.decode_ticket(ticket.ticket).dataset
        if dataset == "bad-data":
            raise pa.ArrowInvalid(self.data_error)
        if dataset == "bad-request":
            raise pa.ArrowInvalid("sample id 9 out of range for dataset 'bad-request' (size 2, valid ids 0..1)")
        raise fl.FlightInternalError("java.lang.NullPointerException: a bug")


@pytest.fixture(scope="module")
def answers(golden: tuple[str, dict[str, Any]]) -> Iterator[FlightClient]:
    with _Answers(golden[0]) as server, FlightClient(f"grpc://127.0.0.1:{server.port}", "0" * 64) as client:
        yield client


def test_over_flight_each_kind_is_its_own_class(answers: FlightClient, golden: tuple[str, dict[str, Any]]) -> None:
    with pytest.raises(unstall.DataError) as err:
        answers.fetch("bad-data", [0])
    _assert_golden(err.value, golden[1])
    assert str(err.value).startswith(golden[1]["message"])  # a pyarrow server appends its Python traceback
    with pytest.raises(unstall.InvalidRequestError, match="sample id 9 out of range") as bad:
        answers.fetch("bad-request", [9])
    assert not isinstance(bad.value, unstall.DataError)
    with pytest.raises(unstall.SidecarInternalError, match="NullPointerException: a bug"):
        answers.fetch("a-bug", [0])
