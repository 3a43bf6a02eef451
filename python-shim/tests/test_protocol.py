"""Golden fixtures (protocol/fixtures) both ways, and the JSON documents."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from unstall import protocol
from unstall.errors import ProtocolMismatchError
from unstall.protocol import (PrepJoin, decode_plan, decode_ticket, encode_fetch_ticket, encode_plan, encode_prep_join,
                              parse_prep_join_reply)


def test_encode_matches_golden_fixture(fixtures_dir: Path) -> None:
    doc = json.loads((fixtures_dir / "ticket-fetch-v1.json").read_text())
    assert doc["kind"] == "fetch" and doc["version"] == protocol.PROTOCOL_VERSION
    expected = (fixtures_dir / "ticket-fetch-v1.bin").read_bytes()
    assert encode_fetch_ticket(doc["dataset"], doc["ids"], doc["epoch"]) == expected
    ticket = protocol.FetchTicket(doc["dataset"], doc["epoch"], tuple(doc["ids"]))
    assert ticket.encode() == expected


def test_peer_ticket_fixture_is_refused_as_a_fetch_ticket(fixtures_dir: Path) -> None:
    """The sidecars' PEER ticket (Java only) shares the id-list layout; the shim never takes it for a FETCH."""
    doc = json.loads((fixtures_dir / "peer-ticket-v1.json").read_text())
    golden = (fixtures_dir / "peer-ticket-v1.bin").read_bytes()
    name = doc["dataset"].encode()
    assert golden == (
        b"UNST" + struct.pack("<BBH", doc["version"], protocol.KIND_PEER, len(name)) + name
        + struct.pack("<II", doc["epoch"], len(doc["ids"])) + b"".join(struct.pack("<Q", i) for i in doc["ids"])
    )
    with pytest.raises(ValueError, match="malformed ticket: kind 4 is not valid here"):
        decode_ticket(golden)


def test_decode_matches_golden_fixture(fixtures_dir: Path) -> None:
    doc = json.loads((fixtures_dir / "ticket-fetch-v1.json").read_text())
    t = decode_ticket((fixtures_dir / "ticket-fetch-v1.bin").read_bytes())
    assert (t.version, t.dataset, t.epoch, list(t.ids)) == (doc["version"], doc["dataset"], doc["epoch"], doc["ids"])


def _malformed(fixtures_dir: Path) -> list[tuple[str, str]]:
    return [(m["file"], m["error_prefix"]) for m in json.loads((fixtures_dir / "malformed-tickets.json").read_text())]


def test_malformed_fixtures_raise_with_their_prefixes(fixtures_dir: Path) -> None:
    cases = _malformed(fixtures_dir)
    assert len(cases) >= 5
    for name, prefix in cases:
        with pytest.raises(ValueError) as err:
            decode_ticket((fixtures_dir / name).read_bytes())
        assert str(err.value).startswith(prefix), (name, str(err.value))


def test_plan_message_matches_its_golden_bytes(fixtures_dir: Path) -> None:
    expected = json.loads((fixtures_dir / "plan-v1.json").read_text())
    golden = (fixtures_dir / "plan-v1.bin").read_bytes()
    assert encode_plan(expected["dataset"], expected["ids"], expected["epoch"]) == golden
    plan = decode_plan(golden)
    assert (plan.dataset, plan.epoch, list(plan.ids)) == (expected["dataset"], expected["epoch"], expected["ids"])


def _ticket(name: bytes = b"ds", epoch: int = 0, ids: tuple[int, ...] = (1,), kind: int = 1, version: int = 1) -> bytes:
    return (
        b"UNST" + struct.pack("<BBH", version, kind, len(name)) + name + struct.pack("<II", epoch, len(ids))
        + b"".join(struct.pack("<Q", i) for i in ids)
    )


@pytest.mark.parametrize(
    ("data", "prefix"),
    [
        (b"", "malformed ticket: truncated"),
        (b"UNS", "malformed ticket: truncated"),
        (b"UNST\x01\x01", "malformed ticket: truncated"),
        (_ticket(kind=2), "malformed ticket: kind 2 is not valid here"),
        (_ticket(kind=7), "malformed ticket: unknown kind 7"),
        (_ticket(name=b""), "malformed ticket: dataset name length 0"),
        (_ticket(name=b"\xff\xfe"), "malformed ticket: dataset name is not UTF-8"),
        (_ticket(ids=()), "malformed ticket: id count 0"),
        (_ticket() + b"xyz", "malformed ticket: 3 trailing bytes"),
        (_ticket()[:-1], "malformed ticket: truncated"),
    ],
)
def test_more_malformed_tickets(data: bytes, prefix: str) -> None:
    with pytest.raises(ValueError, match="^" + prefix):
        decode_ticket(data)


def test_round_trip_unicode_name_repeats_and_max_values() -> None:
    ids = [0, 0, 2**64 - 1, 5]
    t = decode_ticket(encode_fetch_ticket("données/ü", ids, 2**32 - 1))
    assert t.dataset == "données/ü" and list(t.ids) == ids and t.epoch == 2**32 - 1
    assert len(encode_fetch_ticket("ab", [1, 2, 3])) == 16 + 2 + 8 * 3


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(dataset="", ids=[1]), "dataset name"),
        (dict(dataset="x" * 1025, ids=[1]), "dataset name"),
        (dict(dataset="d", ids=[]), "1..65536"),
        (dict(dataset="d", ids=range(65537)), "1..65536"),
        (dict(dataset="d", ids=[-1]), "sample id -1"),
        (dict(dataset="d", ids=[1], epoch=-1), "epoch -1"),
        (dict(dataset="d", ids=[1], epoch=2**32), "epoch"),
    ],
)
def test_encode_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        encode_fetch_ticket(**kwargs)


def test_encode_accepts_numpy_ids() -> None:
    import numpy as np

    assert encode_fetch_ticket("d", np.arange(3)) == encode_fetch_ticket("d", [0, 1, 2])
    with pytest.raises(ValueError, match="negative"):
        encode_fetch_ticket("d", np.array([3, -2]))


def test_batch_schema() -> None:
    s = protocol.BATCH_SCHEMA
    assert s.names == ["id", "label", "key", "payload"]
    assert [f.nullable for f in s] == [False, True, False, False]
    assert s.metadata == {b"unstall.schema": b"1"}


def test_check_batch_names_the_problem() -> None:
    good = pa.RecordBatch.from_pylist([{"id": 1, "label": None, "key": "a", "payload": b"x"}], schema=protocol.BATCH_SCHEMA)
    protocol.check_batch(good)
    bad = good.drop_columns(["key"])
    with pytest.raises(ValueError, match="no column 'key'"):
        protocol.check_batch(bad)
    v2 = good.replace_schema_metadata({"unstall.schema": "2"})
    with pytest.raises(ValueError, match="schema version 2"):
        protocol.check_batch(v2)


def test_parse_description_and_version_check() -> None:
    doc = ('{"v":1,"name":"imgs","format":"imagefolder","uri":"file:///data/imgs","num_samples":1000,'
           '"total_bytes":110000000,"classes":["cat","dog"]}')
    info = protocol.parse_description(doc)
    assert info == protocol.DatasetInfo("imgs", "imagefolder", "file:///data/imgs", 1000, 110000000, ("cat", "dog"))
    assert info.class_to_idx == {"cat": 0, "dog": 1}
    tf = protocol.parse_description(json.dumps({**json.loads(doc), "format": "tfrecord", "classes": None}))
    assert tf.classes is None
    with pytest.raises(ValueError, match="unsupported version 2 .*version 1"):
        protocol.parse_description(doc.replace('"v":1', '"v":2'))
    with pytest.raises(ValueError, match="missing field 'uri'"):
        protocol.parse_description('{"v":1,"name":"x","format":"tfrecord","num_samples":1,"total_bytes":1}')
    assert [d.name for d in protocol.parse_descriptions(f"[{doc}]")] == ["imgs"]


def test_parse_stats_example_from_spec() -> None:
    doc = """{"v":1,
 "cache":{"policy":"minio","capacity_bytes":1048576,"used_bytes":524288,"entries":5},
 "datasets":{"imgs":{"epochs":{"0":{"samples":10,"hits":0,"misses":10,"storage_bytes":1048576,"cache_bytes":0},
                               "1":{"samples":10,"hits":5,"misses":5,"storage_bytes":524288,"cache_bytes":524288}},
                     "total":{"samples":20,"hits":5,"misses":15,"storage_bytes":1572864,"cache_bytes":524288}}}}"""
    s = protocol.parse_stats(doc)
    assert s.cache == protocol.CacheStats("minio", 1048576, 524288, 5)
    imgs = s.dataset("imgs")
    assert imgs.epoch(1) == protocol.EpochStats(10, 5, 5, 524288, 524288)
    assert imgs.total.misses == 15 and imgs.epoch(7) == protocol.EpochStats()
    assert s.dataset("other").epochs == {}
    with pytest.raises(ValueError, match="stats: not valid JSON"):
        protocol.parse_stats("{")


def test_claim_counters_and_manifest_export() -> None:
    doc = ('{"v":1,"cache":{"policy":"minio","capacity_bytes":1,"used_bytes":0,"entries":0},'
           '"datasets":{"x":{"epochs":{"0":{"samples":24,"misses":24,"verified":3,"verify_mismatches":21}}}}}')
    e0 = protocol.parse_stats(doc).dataset("x").epoch(0)
    assert (e0.verified, e0.verify_mismatches) == (3, 21)
    assert protocol.EpochStats.from_json({"samples": 1}).verify_mismatches == 0  # an older sidecar: absent is 0
    export = protocol.parse_manifest_export('{"path":"/tmp/a.manifest","known":24,"num_samples":24}')
    assert export == protocol.ManifestExport("/tmp/a.manifest", 24, 24)
    with pytest.raises(ValueError, match="manifest export: missing field 'known'"):
        protocol.parse_manifest_export('{"path":"/tmp/a.manifest","num_samples":24}')


# -- the local socket (UNSL v1) ------------------------------------------------------------------


def test_local_fetch_request_matches_its_golden_bytes(fixtures_dir: Path) -> None:
    doc = json.loads((fixtures_dir / "local-fetch-v1.json").read_text())
    golden = (fixtures_dir / "local-fetch-v1.bin").read_bytes()
    assert doc["kind"] == protocol.LOCAL_FETCH
    assert protocol.encode_local_fetch(doc["session"], doc["ids"], doc["epoch"]) == golden
    req = protocol.decode_local_request(golden)
    assert (req.kind, req.session, req.epoch, req.ids.tolist()) == (3, doc["session"], doc["epoch"], doc["ids"])


def test_local_prep_request_matches_its_golden_bytes(fixtures_dir: Path) -> None:
    doc = json.loads((fixtures_dir / "local-prep-next-v1.json").read_text())
    golden = (fixtures_dir / "local-prep-next-v1.bin").read_bytes()
    assert doc["kind"] == protocol.LOCAL_PREP
    assert protocol.encode_local_prep(doc["action"], doc["body"].encode()) == golden
    req = protocol.decode_local_request(golden)
    assert (req.kind, req.action, req.body) == (6, "prep.next", doc["body"].encode())
    assert json.loads(req.body)["released"] == [[1, 3], [1, 4]]


def test_local_cached_request_and_document_match_their_golden_fixtures(fixtures_dir: Path) -> None:
    doc = json.loads((fixtures_dir / "local-cached-v1.json").read_text())
    golden = (fixtures_dir / "local-cached-v1.bin").read_bytes()
    assert doc["kind"] == protocol.LOCAL_CACHED
    assert protocol.encode_local_cached(doc["session"]) == golden
    req = protocol.decode_local_request(golden)
    assert (req.kind, req.session) == (7, doc["session"])
    # The document CachedSnapshotTest gets from a real data plane: samples 1, 3 and 8 of 10 cached.
    cached = (fixtures_dir / "cached-v1.json").read_bytes()
    assert protocol.parse_cached(cached, "imgs", 10).nonzero()[0].tolist() == [1, 3, 8]
    with pytest.raises(ValueError, match="the answer is for dataset 'imgs' of 10 samples, asked for 'imgs' of 11"):
        protocol.parse_cached(cached, "imgs", 11)
    with pytest.raises(ValueError, match="the bitmap sets 3 samples, the answer says 2"):
        protocol.parse_cached(cached.replace(b'"cached":3', b'"cached":2'), "imgs", 10)
    with pytest.raises(ValueError, match="a bitmap of 3 bytes for 10 samples, expected 2"):
        protocol.parse_cached(cached.replace(b"CgE=", b"CgEA"), "imgs", 10)


def test_prep_next_bodies_match_their_golden_fixture(fixtures_dir: Path) -> None:
    doc = json.loads((fixtures_dir / "prep-next-rates-v1.json").read_text())
    body = protocol.encode_prep_next("8f3a2c1d9e4b7a60", 3, 1, 5, [[1, 3], [1, 4]], protocol.PrepRates(0.00125, 0.0625))
    assert json.loads(body) == doc["with_rates"]
    assert json.loads(protocol.encode_prep_next("8f3a2c1d9e4b7a60", 3, 1, 6, [])) == doc["without_rates"]


def test_local_prep_request_carries_prep_actions_only() -> None:
    with pytest.raises(ValueError, match="prep.\\* actions"):
        protocol.encode_local_prep("stats", b"")
    bad = protocol.encode_local_prep("prep.next", b"{}").replace(b"prep.next", b"drop.next")
    with pytest.raises(ValueError, match="malformed request: PREP carries prep.\\* actions only, not 'drop.next'"):
        protocol.decode_local_request(bad)
    with pytest.raises(ValueError, match="malformed request: PREP action type length 0"):
        protocol.decode_local_request(b"\x06\x00\x00{}")


def test_local_batch_reply_matches_its_golden_bytes(fixtures_dir: Path) -> None:
    doc = json.loads((fixtures_dir / "local-batch-v1.json").read_text())
    golden = (fixtures_dir / "local-batch-v1.bin").read_bytes()
    assert doc["kind"] == protocol.REPLY_BATCH
    fields = [doc[k] for k in ("ids", "labels", "offsets", "lengths", "segs", "keys", "segments")]
    assert protocol.encode_local_batch(*fields) == golden
    b = protocol.decode_local_reply(golden)
    assert isinstance(b, protocol.LocalBatch)
    assert b.ids.tolist() == doc["ids"] and b.ids.dtype == np.int64
    assert [lab if ok else None for lab, ok in zip(b.labels.tolist(), b.label_valid.tolist())] == doc["labels"]
    assert (b.offsets.tolist(), b.lengths.tolist(), b.segs.tolist()) == (doc["offsets"], doc["lengths"], doc["segs"])
    assert (b.keys, b.segments) == (doc["keys"], doc["segments"])


def test_local_requests_round_trip() -> None:
    hello = protocol.decode_local_request(protocol.encode_local_hello("t" * 64))
    assert (hello.kind, hello.token) == (protocol.LOCAL_HELLO, b"t" * 64)
    assert protocol.encode_local_hello("ab") == b"\x01UNSL\x01\x02\x00ab"
    opened = protocol.decode_local_request(protocol.encode_local_open("données", "pid 12 DataLoader#1"))
    assert opened.doc == {"dataset": "données", "name": "pid 12 DataLoader#1"}
    plan = protocol.decode_local_request(protocol.encode_local_plan(2**64 - 1, np.arange(70000), 2**32 - 1))
    assert (plan.kind, plan.session, plan.epoch, plan.ids.size) == (protocol.LOCAL_PLAN, 2**64 - 1, 2**32 - 1, 70000)
    close = protocol.encode_local_close(9)
    assert close == b"\x05" + struct.pack("<Q", 9) and protocol.decode_local_request(close).session == 9
    assert protocol.encode_frame(b"abc") == b"\x03\x00\x00\x00abc"


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: protocol.encode_local_fetch(1, [], 0), "FETCH request carries 1..65536"),
        (lambda: protocol.encode_local_fetch(1, range(65537), 0), "1..65536"),
        (lambda: protocol.encode_local_fetch(-1, [1], 0), "session -1"),
        (lambda: protocol.encode_local_fetch(1, [-3], 0), "sample id -3"),
        (lambda: protocol.encode_local_plan(1, [1], 2**32), "epoch"),
        (lambda: protocol.encode_local_open("", "x"), "dataset name"),
    ],
)
def test_local_encoders_reject_bad_arguments(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(
    ("body", "prefix"),
    [
        (b"", "malformed request: empty"),
        (b"\x09", "malformed request: unknown kind 9"),
        (b"\x01UNSX\x01\x00\x00", "malformed request: bad magic"),
        (b"\x01UNSL\x02\x00\x00", "malformed request: unsupported version 2"),
        (b"\x01UNSL\x01\x05\x00ab", "malformed request: truncated HELLO"),
        (protocol.encode_local_fetch(1, [1, 2], 0)[:-1], "malformed request: truncated FETCH"),
        (protocol.encode_local_close(1) + b"x", "malformed request: 1 trailing bytes"),
    ],
)
def test_malformed_local_requests(body: bytes, prefix: str) -> None:
    with pytest.raises(ValueError, match="^" + prefix):
        protocol.decode_local_request(body)


def test_local_ok_and_error_replies() -> None:
    ok = protocol.decode_local_reply(protocol.encode_local_ok({"v": 1, "session": 3, "dataset": "imgs"}))
    assert ok == protocol.LocalOk({"v": 1, "session": 3, "dataset": "imgs"})
    err = protocol.decode_local_reply(b"\x01\x02unknown session 12")
    assert err == protocol.LocalError(2, "unknown session 12") and err.status == "NOT_FOUND"
    assert [protocol.LocalError(c, "").status for c in range(1, 8)] == [
        "INVALID_ARGUMENT", "NOT_FOUND", "INTERNAL", "RESOURCE_EXHAUSTED", "UNAUTHENTICATED", "UNAVAILABLE", "UNKNOWN(7)"]


def test_malformed_local_replies(fixtures_dir: Path) -> None:
    golden = (fixtures_dir / "local-batch-v1.bin").read_bytes()
    for body, prefix in [
        (b"", "malformed reply: empty"),
        (b"\x07", "malformed reply: unknown kind 7"),
        (b"\x01", "malformed reply: truncated ERROR"),
        (b"\x00{", "malformed reply: OK: not valid JSON"),
        (golden[:10], "malformed reply: truncated BATCH header"),
        (golden[:100], "malformed reply: truncated BATCH"),
        (golden[:-3], "malformed reply: truncated segment table"),
        (golden + b"\x00", "malformed reply: 1 trailing bytes"),
        (protocol.encode_local_batch([1], [None], [0], [1], [1], ["k"], ["cache-0"]), "malformed reply: segment index 1"),
    ]:
        with pytest.raises(ValueError, match="^" + prefix):
            protocol.decode_local_reply(body)


def test_sample_batch_from_and_to_arrow_views_the_buffer() -> None:
    rb = pa.RecordBatch.from_pylist(
        [{"id": i, "label": None if i == 2 else i, "key": f"k{i}", "payload": bytes([i]) * i} for i in range(5)],
        schema=protocol.BATCH_SCHEMA,
    )
    sliced = rb.slice(1, 3)
    b = protocol.SampleBatch.from_arrow(sliced)
    assert (b.ids.tolist(), b.label_list(), b.keys) == ([1, 2, 3], [1, None, 3], ["k1", "k2", "k3"])
    assert [bytes(p) for p in b.payloads] == [b"\x01", b"\x02\x02", b"\x03\x03\x03"] and b.nbytes == 6
    data = sliced.column("payload").buffers()[2]
    assert all(p.readonly for p in b.payloads)
    assert np.frombuffer(b.payloads[1], np.uint8).__array_interface__["data"][0] == data.address + 1  # no copy
    assert b.transport == "flight" and b.to_arrow() is sliced
    copied = protocol.SampleBatch(b.ids, b.labels, b.label_valid, b.keys, b.payloads, "shm").to_arrow()
    assert copied.equals(sliced) and copied.schema == protocol.BATCH_SCHEMA


def test_parse_stats_with_sessions() -> None:
    doc = {
        "v": 1,
        "cache": {"policy": "minio", "capacity_bytes": 1, "used_bytes": 0, "entries": 0},
        "datasets": {},
        "sessions": {"7": {"dataset": "imgs", "name": "pid 1 DataLoader#2", "transport": "shm",
                           "epochs": {"0": {"samples": 4, "hits": 1, "misses": 3, "prefetch_hits": 2}},
                           "total": {"samples": 4, "hits": 1, "misses": 3, "prefetch_hits": 2}}},
    }
    s = protocol.parse_stats(json.dumps(doc))
    sess = s.session(7)
    assert (sess.dataset, sess.name, sess.transport) == ("imgs", "pid 1 DataLoader#2", "shm")
    assert sess.epoch(0) == protocol.EpochStats(samples=4, hits=1, misses=3, prefetch_hits=2)
    assert sess.total.prefetch_hits == 2 and s.session(8) == protocol.SessionStats()
    assert protocol.parse_stats(json.dumps({**doc, "sessions": {}})).sessions == {}


def test_fetch_tickets_and_plans_are_not_taken_for_each_other(fixtures_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"^malformed ticket: kind 1 is not valid here \(expected 2"):
        decode_plan((fixtures_dir / "ticket-fetch-v1.bin").read_bytes())
    with pytest.raises(ValueError, match=r"^malformed ticket: kind 2 is not valid here \(expected 1"):
        decode_ticket((fixtures_dir / "plan-v1.bin").read_bytes())


def test_prep_next_payloads_answer_matches_its_golden_document(fixtures_dir: Path) -> None:
    doc = json.loads((fixtures_dir / "prep-next-payloads-v1.json").read_text())
    slot = protocol.parse_prep_slot(doc)
    assert (slot.path, slot.rows, slot.ids.tolist(), slot.labels.tolist()) == (doc["path"], 3, [17, 4, 9], [2, 0, -1])
    assert slot.offsets is not None and slot.offsets.tolist() == [0, 6912, 7301, 9045]
    assert slot.keys == doc["keys"] and slot.shape is None
    assert slot.prepared is not None and slot.prepared.tolist() == [True, False, False]
    assert slot.headers is not None and slot.headers.dtype == np.int64
    assert slot.headers.tolist() == [-1, 24576500, 465312477610304]  # null: -1
    vouched = [protocol.VouchedHeader(500, 375, 0, 0), protocol.VouchedHeader(320, 240, 0x33, 423)]
    assert [protocol.VouchedHeader.unpack(int(v)) for v in slot.headers] == [None, *vouched]
    assert [h.packed() for h in vouched] == slot.headers.tolist()[1:]
    assert protocol.parse_prep_slot({k: v for k, v in doc.items() if k != "headers"}).headers is None  # older sidecar
    for bad, says in ((dict(doc, offsets=[0, 6912, 7301]), "3 rows need 4 non-decreasing offsets"),
                      (dict(doc, offsets=[0, 7301, 6912, 9045]), "non-decreasing"),
                      (dict(doc, keys=["a"]), "3 rows with 1 keys"),
                      (dict(doc, v=2), "unsupported version 2"),
                      (dict(doc, headers=[None, 24576500]), "3 rows need as many headers, got 2 headers"),
                      (dict(doc, headers=7), "3 rows need as many headers, got 7"),
                      (dict(doc, headers=[None, -2, 0]), "a header is a packed non-negative int64 or null, got -2"),
                      (dict(doc, headers=[None, "500", 0]), "packed non-negative int64 or null, got '500'"),
                      (dict(doc, headers=[None, 1.5, 0]), "got 1.5"),
                      (dict(doc, headers=[None, True, 0]), "got True"),
                      (dict(doc, headers=[None, 1 << 63, 0]), f"got {1 << 63}")):
        with pytest.raises(ProtocolMismatchError, match=says):
            protocol.parse_prep_slot(bad)


def test_a_raw_batch_over_flight_gives_its_header_column_as_int64_with_minus_one_for_null() -> None:
    """``batch_payloads``: a raw or hybrid PREP batch's ``header`` column (the sidecar's vouched headers), -1 where
    null; none from a sidecar that sends no such column; a column of another type or a negative value is refused."""
    rows = [{"id": 1, "label": None, "key": "a.jpg", "payload": b"\xff\xd8\xff"},
            {"id": 2, "label": 0, "key": "b.png", "payload": b"\x89PNG"}]
    raw = pa.RecordBatch.from_pylist(rows, schema=protocol.BATCH_SCHEMA)
    assert protocol.batch_payloads(raw).headers is None
    header = pa.array([24576500, None], pa.int64())
    p = protocol.batch_payloads(raw.append_column("header", header))
    assert p.headers is not None and p.headers.dtype == np.int64 and p.headers.tolist() == [24576500, -1]
    assert p.row_bytes() == [b"\xff\xd8\xff", b"\x89PNG"] and p.ids.tolist() == [1, 2]
    with pytest.raises(ProtocolMismatchError, match="column 'header' has type int32, expected int64"):
        protocol.batch_payloads(raw.append_column("header", pa.array([1, None], pa.int32())))
    with pytest.raises(ProtocolMismatchError, match="column 'header' holds -5"):
        protocol.batch_payloads(raw.append_column("header", pa.array([-5, None], pa.int64())))


def test_decoded_batch_handover_matches_its_golden_messages(fixtures_dir: Path) -> None:
    """The members' hand-over (``unstall.prep.decode_share``): each golden message parses to what it says and encodes
    back to the same document; a message of another version or a broken one is refused, naming why."""
    doc = json.loads((fixtures_dir / "handover-v1.json").read_text())
    cpu = protocol.parse_handover(json.dumps(doc["cpu"]).encode())
    assert (cpu.ok, cpu.ids, cpu.dtype, cpu.size, cpu.stride, cpu.offset, cpu.storage_bytes, cpu.cuda) == (
        True, [17, 4, 9, 30], "torch.bfloat16", (4, 3, 224, 224), (150528, 1, 672, 3), 0, 1204224, None)
    cuda = protocol.parse_handover(json.dumps(doc["cuda"]).encode())
    assert cuda.storage_bytes is None and cuda.cuda is not None
    assert cuda.cuda.handle == bytes(range(64)) and cuda.cuda.event == bytes(range(64, 128))
    assert (cuda.cuda.storage_bytes, cuda.cuda.storage_offset_bytes, cuda.cuda.ref_counter,
            cuda.cuda.ref_counter_offset, cuda.cuda.event_sync) == (1204224, 2097152, b"/torch_4242_1776_0", 17, True)
    assert protocol.parse_handover(json.dumps(doc["not_ok"]).encode()) == protocol.Handover(False)
    for name in ("cpu", "cuda", "not_ok"):
        msg = protocol.parse_handover(json.dumps(doc[name]).encode())
        assert json.loads(protocol.encode_handover(msg)) == doc[name], name
    for bad, says in ((dict(doc["cpu"], v=2), "version 2, this member speaks 1"),
                      ({k: v for k, v in doc["cpu"].items() if k != "ids"}, "malformed message: KeyError\\('ids'"),
                      (dict(doc["cpu"], stride=[1]), "do not describe a tensor"),
                      (dict(doc["cpu"], dtype="bfloat16"), "do not describe a tensor")):
        with pytest.raises(ProtocolMismatchError, match=says):
            protocol.parse_handover(json.dumps(bad).encode())
    with pytest.raises(ProtocolMismatchError, match="not JSON"):
        protocol.parse_handover(b"\x00")


def test_prep_join_bodies_match_the_golden_fixture(fixtures_dir: Path) -> None:
    """protocol/fixtures/prep-join-v1.json, whose bodies the sidecar's PrepRequestsTest parses: the fullest body
    sets every field PrepJoin has, and the least one is what the defaults send."""
    f = json.loads((fixtures_dir / "prep-join-v1.json").read_text())
    for case in ("full", "least"):
        want = f[case]
        got = json.loads(encode_prep_join(PrepJoin(**{k: v for k, v in want.items() if k != "v"})))
        assert got == want and list(got) == list(want), case
    assert {fl.name for fl in dataclasses.fields(PrepJoin)} | {"v"} == set(f["full"])


def test_prep_join_reply_is_one_v1_document() -> None:
    assert parse_prep_join_reply([b'{"v": 1, "group": "g", "member": 2, "start_epoch": 0}'])["member"] == 2
    with pytest.raises(ProtocolMismatchError, match="returned 2 results, expected 1"):
        parse_prep_join_reply([b"{}", b"{}"])
    with pytest.raises(ProtocolMismatchError, match="unsupported version 2"):
        parse_prep_join_reply([b'{"v": 2}'])
