"""Property tests (hypothesis) of the wire codecs in ``unstall.protocol``, against the golden fixtures that the
Java parser is tested with (``protocol/fixtures``: Java's ``ProtocolFixturesTest`` and the Jazzer targets
``ProtocolFuzzTest``, ``ActionBodiesFuzzTest``; docs/ARCHITECTURE.md, "Fuzzing").

- What the shim encodes decodes back to the same values (FETCH tickets, PLAN messages, PREP tickets, the local
  socket's requests and BATCH replies).
- Every golden fixture decodes to the values the Java tests assert.
- Arbitrary bytes, and mutations of the fixtures, make a decoder either return a message that encodes back to
  exactly those bytes (one message, one encoding, as the Java targets require) or raise its documented error,
  a ValueError starting with ``malformed``; nothing else.

Bounded (``max_examples``, no deadline, no example database) so that the file runs in seconds.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Callable, Optional, Union

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from unstall import protocol
from unstall.protocol import (
    FetchTicket,
    LocalBatch,
    LocalError,
    LocalOk,
    Plan,
    PrepRates,
    PrepTicket,
    decode_local_reply,
    decode_local_request,
    decode_plan,
    decode_prep_ticket,
    decode_ticket,
    encode_fetch_ticket,
    encode_plan,
    encode_prep_ticket,
)

FIXTURES = Path(__file__).resolve().parents[2] / "protocol" / "fixtures"
BOUNDED = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)
# Names: any Unicode text (hypothesis leaves out lone surrogates, which have no UTF-8 form) of 1..1024 UTF-8 bytes.
NAMES = st.text(min_size=1, max_size=40).filter(lambda s: len(s.encode("utf-8")) <= protocol.MAX_NAME_BYTES)
IDS = st.lists(U64, min_size=1, max_size=40)

Decoder = Callable[[bytes], object]


def _fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def _doc(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def _malformed(e: ValueError, *prefixes: str) -> None:
    assert str(e).startswith(prefixes), repr(e)


# -- encode, then decode: the same values --------------------------------------------------------


@BOUNDED
@given(NAMES, U32, IDS)
def test_fetch_tickets_round_trip(name: str, epoch: int, ids: list[int]) -> None:
    data = encode_fetch_ticket(name, ids, epoch)
    assert len(data) == 16 + len(name.encode("utf-8")) + 8 * len(ids)
    assert decode_ticket(data) == FetchTicket(name, epoch, tuple(ids))
    with pytest.raises(ValueError, match="^malformed ticket: kind 1 is not valid here"):
        decode_plan(data)


@BOUNDED
@given(NAMES, U32, IDS)
def test_plans_round_trip(name: str, epoch: int, ids: list[int]) -> None:
    data = encode_plan(name, np.array(ids, dtype=np.uint64), epoch)
    assert decode_plan(data) == Plan(name, epoch, tuple(ids))
    with pytest.raises(ValueError, match="^malformed ticket: kind 2 is not valid here"):
        decode_ticket(data)


@BOUNDED
@given(NAMES, U64, U32, U32)
def test_prep_tickets_round_trip(group: str, member: int, epoch: int, batch: int) -> None:
    data = encode_prep_ticket(group, member, epoch, batch)
    assert len(data) == 24 + len(group.encode("utf-8"))
    assert decode_prep_ticket(data) == PrepTicket(group, member, epoch, batch)
    assert decode_prep_ticket(data).encode() == data


SECONDS = st.floats(min_value=0, exclude_min=True, allow_infinity=False)


@BOUNDED
@given(NAMES, U64, U32, U32, SECONDS, SECONDS)
def test_prep_tickets_with_rates_round_trip(group: str, member: int, epoch: int, batch: int, decode_s: float,
                                            step_s: float) -> None:
    t = PrepTicket(group, member, epoch, batch, PrepRates(decode_s, step_s))
    data = t.encode()
    assert len(data) == 24 + len(group.encode("utf-8")) + 16
    assert decode_prep_ticket(data) == t


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, 0.0, -0.0])
def test_prep_ticket_rates_that_are_not_positive_seconds_are_malformed_naming_the_field(bad: float) -> None:
    good = _fixture("prep-ticket-rates-v1.bin")
    at = len(good) - 16
    for offset, field in ((at, "decode_s_per_sample"), (at + 8, "step_s")):
        data = good[:offset] + struct.pack("<d", bad) + good[offset + 8:]
        with pytest.raises(ValueError, match=f"^malformed ticket: at byte {offset}: rates.{field} \\(seconds, a positive"):
            decode_prep_ticket(data)
    with pytest.raises(ValueError, match="^rates.step_s \\(seconds, a positive number\\) is required"):
        encode_prep_ticket("g", 1, 0, 0, PrepRates(1e-3, bad))


@BOUNDED
@given(st.binary(max_size=300), U64, U32, IDS, NAMES, st.text(max_size=40))
def test_local_requests_round_trip(token: bytes, session: int, epoch: int, ids: list[int], dataset: str,
                                   name: str) -> None:
    hello = decode_local_request(protocol.encode_local_hello(token))
    assert (hello.kind, hello.token) == (protocol.LOCAL_HELLO, token)
    for kind, encode in ((protocol.LOCAL_FETCH, protocol.encode_local_fetch), (protocol.LOCAL_PLAN, protocol.encode_local_plan)):
        r = decode_local_request(encode(session, ids, epoch))
        assert (r.kind, r.session, r.epoch, r.ids.tolist()) == (kind, session, epoch, ids)
    assert decode_local_request(protocol.encode_local_close(session)).session == session
    assert decode_local_request(protocol.encode_local_open(dataset, name)).doc == {"dataset": dataset, "name": name}


ROWS = st.lists(
    st.tuples(st.integers(-(2**63), 2**63 - 1), st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), U64,
              U32, st.text(max_size=12)),
    max_size=12,
)


@BOUNDED
@given(ROWS, st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=4), st.data())
def test_local_batch_replies_round_trip(rows: list[tuple[int, Optional[int], int, int, str]], segments: list[str],
                                        data: st.DataObject) -> None:
    segs = [data.draw(st.integers(0, len(segments) - 1)) for _ in rows]
    ids, labels, offsets, lengths, keys = (list(c) for c in zip(*rows)) if rows else ([], [], [], [], [])
    b = decode_local_reply(protocol.encode_local_batch(ids, labels, offsets, lengths, segs, keys, segments))
    assert isinstance(b, LocalBatch)
    assert b.ids.tolist() == ids and b.offsets.tolist() == offsets and b.lengths.tolist() == lengths
    assert [lab if ok else None for lab, ok in zip(b.labels.tolist(), b.label_valid.tolist())] == labels
    assert (b.segs.tolist(), b.keys, b.segments) == (segs, keys, segments)


# -- the golden fixtures decode to what the Java tests assert ------------------------------------


def test_golden_fixtures_decode_to_the_values_java_asserts() -> None:
    doc = _doc("ticket-fetch-v1.json")
    assert decode_ticket(_fixture("ticket-fetch-v1.bin")) == FetchTicket(doc["dataset"], doc["epoch"], tuple(doc["ids"]))
    doc = _doc("plan-v1.json")
    assert decode_plan(_fixture("plan-v1.bin")) == Plan(doc["dataset"], doc["epoch"], tuple(doc["ids"]))
    doc = _doc("prep-ticket-v1.json")
    assert decode_prep_ticket(_fixture("prep-ticket-v1.bin")) == PrepTicket(doc["group"], doc["member"], doc["epoch"], doc["batch"])
    doc = _doc("prep-ticket-rates-v1.json")
    assert decode_prep_ticket(_fixture("prep-ticket-rates-v1.bin")) == PrepTicket(
        doc["group"], doc["member"], doc["epoch"], doc["batch"], PrepRates(**doc["rates"]))
    doc = _doc("local-fetch-v1.json")
    r = decode_local_request(_fixture("local-fetch-v1.bin"))
    assert (r.kind, r.session, r.epoch, r.ids.tolist()) == (doc["kind"], doc["session"], doc["epoch"], doc["ids"])
    doc = _doc("local-prep-next-v1.json")
    r = decode_local_request(_fixture("local-prep-next-v1.bin"))
    assert (r.kind, r.action, r.body) == (doc["kind"], doc["action"], doc["body"].encode())
    doc = _doc("local-batch-v1.json")
    b = decode_local_reply(_fixture("local-batch-v1.bin"))
    assert isinstance(b, LocalBatch)
    assert [lab if ok else None for lab, ok in zip(b.labels.tolist(), b.label_valid.tolist())] == doc["labels"]
    assert (b.ids.tolist(), b.offsets.tolist(), b.lengths.tolist(), b.segs.tolist(), b.keys, b.segments) == tuple(
        doc[k] for k in ("ids", "offsets", "lengths", "segs", "keys", "segments"))
    # The golden batch (ProtocolFixturesTest.goldenBatchHasTheWireSchema): ids 7, 8; label 3, null; keys; payloads.
    with pa.ipc.open_stream(_fixture("batch-v1.arrows")) as reader:
        assert reader.schema == protocol.BATCH_SCHEMA
        rb = reader.read_next_batch()
    protocol.check_batch(rb)
    sb = protocol.SampleBatch.from_arrow(rb)
    assert sb.ids.tolist() == [7, 8] and sb.label_list() == [3, None]
    assert sb.keys == ["cat/7.jpg", "shard-0.tfrecord@0"]
    assert [bytes(p) for p in sb.payloads] == [b"\xff\xd8\x00\x01", b""]


def test_malformed_fixtures_are_refused_as_java_refuses_them() -> None:
    cases = json.loads((FIXTURES / "malformed-tickets.json").read_text())
    assert "bad-utf8-name.bin" in [c["file"] for c in cases]  # Java used to accept it (lenient decoding)
    for c in cases:
        with pytest.raises(ValueError) as err:
            decode_ticket(_fixture(c["file"]))
        _malformed(err.value, c["error_prefix"])


# -- arbitrary bytes: a message that encodes back to them, or ValueError("malformed ...") ---------


def _reencode(msg: object) -> bytes:
    if isinstance(msg, FetchTicket):
        return msg.encode()
    if isinstance(msg, Plan):
        return msg.encode()
    assert isinstance(msg, PrepTicket)
    return msg.encode()


def _check_ticket_like(decode: Decoder, data: bytes) -> None:
    try:
        msg = decode(data)
    except ValueError as e:
        _malformed(e, "malformed ticket: ")
        return
    assert _reencode(msg) == data


def _check_local_request(data: bytes) -> None:
    try:
        r = decode_local_request(data)
    except ValueError as e:
        _malformed(e, "malformed request: ")
        return
    if r.kind == protocol.LOCAL_HELLO:
        assert protocol.encode_local_hello(r.token) == data
    elif r.kind in (protocol.LOCAL_FETCH, protocol.LOCAL_PLAN):
        assert r.ids is not None and r.session is not None and r.epoch is not None
        assert struct.pack("<BQII", r.kind, r.session, r.epoch, r.ids.size) + r.ids.tobytes() == data
    elif r.kind == protocol.LOCAL_CLOSE:
        assert protocol.encode_local_close(r.session or 0) == data
    elif r.kind == protocol.LOCAL_CACHED:
        assert protocol.encode_local_cached(r.session or 0) == data
    elif r.kind == protocol.LOCAL_PREP:
        assert r.action is not None and r.body is not None
        assert protocol.encode_local_prep(r.action, r.body) == data
    else:
        assert r.kind == protocol.LOCAL_OPEN and isinstance(r.doc, dict)


def _check_local_reply(data: bytes) -> None:
    try:
        r: Union[LocalOk, LocalError, LocalBatch] = decode_local_reply(data)
    except ValueError as e:
        _malformed(e, "malformed reply: ")
        return
    if isinstance(r, LocalBatch):
        n = len(r.ids)
        assert len(r.keys) == n and all(0 <= s < len(r.segments) for s in r.segs.tolist())


TICKET_DECODERS = [decode_ticket, decode_plan, decode_prep_ticket]


@BOUNDED
@given(st.binary(max_size=200))
def test_arbitrary_bytes_to_the_ticket_decoders(data: bytes) -> None:
    for decode in TICKET_DECODERS:
        _check_ticket_like(decode, data)


@BOUNDED
@given(st.binary(max_size=200))
@example(b"\x02" + b"[" * 100_000)  # JSON nested past the interpreter's stack: was a RecursionError
def test_arbitrary_bytes_to_the_local_request_decoder(data: bytes) -> None:
    _check_local_request(data)


@BOUNDED
@given(st.binary(max_size=300))
@example(b"\x00" + b"{\"a\":" * 50_000)
@example(protocol.encode_local_batch([1], [None], [0], [1], [0], ["k"], ["cache-0"])[:-9] + b"\x07\x00cache-\xff")
def test_arbitrary_bytes_to_the_local_reply_decoder(data: bytes) -> None:
    _check_local_reply(data)


GOLDEN: dict[str, list[Callable[[bytes], object]]] = {
    "ticket-fetch-v1.bin": TICKET_DECODERS,
    "plan-v1.bin": TICKET_DECODERS,
    "prep-ticket-v1.bin": TICKET_DECODERS,
    "prep-ticket-rates-v1.bin": TICKET_DECODERS,
    "bad-utf8-name.bin": TICKET_DECODERS,
    "peer-ticket-v1.bin": TICKET_DECODERS,  # sidecar to sidecar: every shim decoder refuses it
    "local-fetch-v1.bin": [_check_local_request],
    "local-prep-next-v1.bin": [_check_local_request],
    "local-cached-v1.bin": [_check_local_request],
    "local-batch-v1.bin": [_check_local_reply],
}


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, bytes]:
    """A golden fixture with a few bytes overwritten, cut off or appended: near-valid input, where the checks are."""
    name = draw(st.sampled_from(sorted(GOLDEN)))
    b = bytearray(_fixture(name))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["set", "cut", "append", "insert"]))
        pos = draw(st.integers(0, max(0, len(b) - 1)))
        if op == "set" and b:
            b[pos] = draw(st.integers(0, 255))
        elif op == "cut":
            del b[pos:]
        elif op == "append":
            b += draw(st.binary(min_size=1, max_size=16))
        else:
            b[pos:pos] = draw(st.binary(min_size=1, max_size=8))
    return name, bytes(b)


@settings(BOUNDED, max_examples=400)
@given(mutated())
def test_mutated_fixtures(case: tuple[str, bytes]) -> None:
    name, data = case
    for check in GOLDEN[name]:
        if check in TICKET_DECODERS:
            _check_ticket_like(check, data)
        else:
            check(data)


# -- the JSON documents the sidecar sends: any JSON value is parsed or refused with ValueError ------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
STATS_FIELDS = ("v", "cache", "datasets", "sessions", "policy", "capacity_bytes", "used_bytes", "entries", "epochs",
                "total", "samples", "hits", "0", "served_to_peers", "peer_hits", "cluster", "members", "settled")
DESCRIPTION_FIELDS = ("v", "name", "format", "uri", "num_samples", "total_bytes", "classes")


def _near(fields: tuple[str, ...]) -> st.SearchStrategy[object]:
    """JSON objects with the document's own keys (else nearly every example fails at the first lookup)."""
    return st.recursive(
        st.dictionaries(st.sampled_from(fields), JSON_VALUES | st.just(1), max_size=len(fields)),
        lambda children: st.dictionaries(st.sampled_from(fields), children | JSON_VALUES, max_size=len(fields)),
        max_leaves=10,
    )


@settings(BOUNDED, max_examples=60)  # generating nested JSON is the slow part
@given(st.one_of(JSON_VALUES, _near(STATS_FIELDS)))
@example({"v": 1, "cache": []})
@example({"v": 1, "cache": {"policy": "minio", "capacity_bytes": 1, "used_bytes": 0, "entries": 0}, "datasets": []})
def test_any_json_to_the_stats_parser(doc: object) -> None:
    try:
        protocol.parse_stats(json.dumps(doc))
    except ValueError as e:
        _malformed(e, "stats: ")


@settings(BOUNDED, max_examples=60)
@given(st.one_of(JSON_VALUES, _near(DESCRIPTION_FIELDS)))
@example({"v": 1, "name": "x", "format": "tfrecord", "uri": "u", "num_samples": None, "total_bytes": 1})
def test_any_json_to_the_description_parser(doc: object) -> None:
    try:
        protocol.parse_description(json.dumps(doc))
    except ValueError as e:
        _malformed(e, "dataset description: ")

