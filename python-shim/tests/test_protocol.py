"""Golden fixtures (protocol/fixtures) both ways, and the JSON documents."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pyarrow as pa
import pytest

from unstall import protocol
from unstall.protocol import KIND_PLAN, decode_ticket, encode_fetch_ticket, encode_plan


def test_encode_matches_golden_fixture(fixtures_dir: Path) -> None:
    doc = json.loads((fixtures_dir / "ticket-fetch-v1.json").read_text())
    assert doc["kind"] == "fetch" and doc["version"] == protocol.PROTOCOL_VERSION
    expected = (fixtures_dir / "ticket-fetch-v1.bin").read_bytes()
    assert encode_fetch_ticket(doc["dataset"], doc["ids"], doc["epoch"]) == expected
    ticket = protocol.FetchTicket(doc["dataset"], doc["epoch"], tuple(doc["ids"]))
    assert ticket.encode() == expected


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
    plan = decode_ticket(golden, KIND_PLAN)
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
