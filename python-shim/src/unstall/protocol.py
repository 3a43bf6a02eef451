"""Wire protocol v1, client side: tickets, the batch schema, and the JSON documents.

The byte layout and the error messages follow ``protocol/README.md``; the golden fixtures in
``protocol/fixtures/`` are checked by ``python-shim/tests/test_protocol.py`` and by the Java tests.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa

__all__ = [
    "PROTOCOL_VERSION",
    "TICKET_MAGIC",
    "KIND_FETCH",
    "MAX_NAME_BYTES",
    "MAX_IDS",
    "BATCH_SCHEMA",
    "SCHEMA_VERSION_KEY",
    "FetchTicket",
    "encode_fetch_ticket",
    "decode_ticket",
    "DatasetInfo",
    "EpochStats",
    "DatasetStats",
    "CacheStats",
    "Stats",
    "parse_description",
    "parse_descriptions",
    "parse_stats",
    "check_batch",
]

PROTOCOL_VERSION = 1
TICKET_MAGIC = b"UNST"
KIND_FETCH = 1
KIND_PLAN = 2
MAX_NAME_BYTES = 1024
MAX_IDS = 65536
MAX_PLAN_IDS = 1 << 28
_U32_MAX = 0xFFFFFFFF
_U64_MAX = 0xFFFFFFFFFFFFFFFF
# magic, version, kind, name length
_HEADER = struct.Struct("<4sBBH")
# epoch, number of ids
_MIDDLE = struct.Struct("<II")

SCHEMA_VERSION_KEY = b"unstall.schema"
BATCH_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("label", pa.int64(), nullable=True),
        pa.field("key", pa.utf8(), nullable=False),
        pa.field("payload", pa.binary(), nullable=False),
    ],
    metadata={SCHEMA_VERSION_KEY: str(PROTOCOL_VERSION).encode()},
)


@dataclass(frozen=True)
class FetchTicket:
    """A FETCH ticket: a batch of samples of one dataset, by id, for one epoch."""

    dataset: str
    epoch: int
    ids: tuple[int, ...]
    version: int = PROTOCOL_VERSION

    def encode(self) -> bytes:
        return encode_fetch_ticket(self.dataset, self.ids, self.epoch)


def encode_fetch_ticket(dataset: str, ids: Sequence[int] | np.ndarray, epoch: int = 0) -> bytes:
    """Encodes a FETCH ticket: ``UNST``, version, kind, u16 name length, name, u32 epoch, u32 n, u64 ids."""
    return _encode(KIND_FETCH, dataset, ids, epoch)


def encode_plan(dataset: str, ids: Sequence[int] | np.ndarray, epoch: int) -> bytes:
    """Encodes a PLAN message (the ``prefetch`` action's body): the epoch's whole sample order."""
    return _encode(KIND_PLAN, dataset, ids, epoch)


def _encode(kind: int, dataset: str, ids: Sequence[int] | np.ndarray, epoch: int) -> bytes:
    if not isinstance(dataset, str):
        raise TypeError(f"dataset name must be a str, not {type(dataset).__name__}")
    name = dataset.encode("utf-8")
    if not 1 <= len(name) <= MAX_NAME_BYTES:
        raise ValueError(f"dataset name must be 1..{MAX_NAME_BYTES} UTF-8 bytes, got {len(name)}")
    epoch = int(epoch)
    if not 0 <= epoch <= _U32_MAX:
        raise ValueError(f"epoch {epoch} is outside 0..{_U32_MAX}")
    arr = _ids_array(ids)
    max_ids = MAX_PLAN_IDS if kind == KIND_PLAN else MAX_IDS
    if not 1 <= arr.size <= max_ids:
        raise ValueError(f"a ticket carries 1..{max_ids} sample ids, got {arr.size}")
    return b"".join(
        (
            _HEADER.pack(TICKET_MAGIC, PROTOCOL_VERSION, kind, len(name)),
            name,
            _MIDDLE.pack(epoch, arr.size),
            arr.astype("<u8", copy=False).tobytes(),
        )
    )


def _ids_array(ids: Iterable[int] | np.ndarray) -> np.ndarray:
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1:
            raise ValueError(f"sample ids must be one-dimensional, got shape {ids.shape}")
        if ids.dtype.kind not in "iu":
            raise ValueError(f"sample ids must be integers, got dtype {ids.dtype}")
        if ids.dtype.kind == "i" and ids.size and int(ids.min()) < 0:
            raise ValueError(f"sample id {int(ids.min())} is negative")
        return ids.astype(np.uint64, copy=False)
    values = [int(i) for i in ids]
    for i in values:
        if not 0 <= i <= _U64_MAX:
            raise ValueError(f"sample id {i} is outside 0..{_U64_MAX}")
    return np.array(values, dtype=np.uint64)


def decode_ticket(data: bytes, expected_kind: int = KIND_FETCH) -> FetchTicket:
    """Decodes a ticket (or, with ``KIND_PLAN``, a plan); raises ValueError starting with ``malformed ticket:``."""
    buf = memoryview(bytes(data))
    size = len(buf)
    if size < 4:
        raise ValueError(f"malformed ticket: truncated: {size} bytes, the header is {_HEADER.size + _MIDDLE.size}")
    if bytes(buf[:4]) != TICKET_MAGIC:
        raise ValueError(f"malformed ticket: bad magic {bytes(buf[:4])!r}, expected {TICKET_MAGIC!r}")
    if size < _HEADER.size:
        raise ValueError(f"malformed ticket: truncated: {size} bytes, the header is {_HEADER.size + _MIDDLE.size}")
    _, version, kind, name_len = _HEADER.unpack_from(buf, 0)
    if version != PROTOCOL_VERSION:
        raise ValueError(
            f"malformed ticket: unsupported version {version} (this client speaks version {PROTOCOL_VERSION})"
        )
    if kind != expected_kind:
        what = f"kind {kind} is not valid here" if kind in (KIND_FETCH, KIND_PLAN) else f"unknown kind {kind}"
        raise ValueError(f"malformed ticket: {what} (expected {expected_kind}; 1 = FETCH, 2 = PLAN)")
    if not 1 <= name_len <= MAX_NAME_BYTES:
        raise ValueError(f"malformed ticket: dataset name length {name_len} is outside 1..{MAX_NAME_BYTES}")
    if size < 16 + name_len:
        raise ValueError(f"malformed ticket: truncated: {size} bytes, the header with the name is {16 + name_len}")
    try:
        dataset = bytes(buf[8 : 8 + name_len]).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"malformed ticket: dataset name is not UTF-8 ({e.reason})") from None
    epoch, n = _MIDDLE.unpack_from(buf, 8 + name_len)
    max_ids = MAX_PLAN_IDS if kind == KIND_PLAN else MAX_IDS
    if not 1 <= n <= max_ids:
        raise ValueError(f"malformed ticket: id count {n} is outside 1..{max_ids}")
    expected = 16 + name_len + 8 * n
    if size < expected:
        raise ValueError(f"malformed ticket: truncated: {size} bytes, {n} ids need {expected}")
    if size > expected:
        extra = size - expected
        raise ValueError(f"malformed ticket: {extra} trailing byte{'s' if extra != 1 else ''} after {expected}")
    ids = np.frombuffer(buf, dtype="<u8", count=n, offset=16 + name_len)
    return FetchTicket(dataset=dataset, epoch=epoch, ids=tuple(int(i) for i in ids), version=version)


# ---------------------------------------------------------------------------------------------
# JSON documents


def _check_version(doc: Mapping[str, Any], what: str) -> None:
    v = doc.get("v")
    if v != PROTOCOL_VERSION:
        raise ValueError(f"{what}: unsupported version {v!r} (this client speaks version {PROTOCOL_VERSION})")


def _loads(text: str | bytes, what: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what}: not valid JSON ({e})") from None


@dataclass(frozen=True)
class DatasetInfo:
    """A registered dataset, as the sidecar describes it."""

    name: str
    format: str
    uri: str
    num_samples: int
    total_bytes: int
    classes: tuple[str, ...] | None = None

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.classes or ())}


def parse_description(doc: str | bytes | Mapping[str, Any]) -> DatasetInfo:
    """Parses a dataset description (``GetFlightInfo`` app_metadata or ``describeDataset``)."""
    d = _loads(doc, "dataset description") if isinstance(doc, (str, bytes)) else doc
    if not isinstance(d, Mapping):
        raise ValueError(f"dataset description: expected a JSON object, got {type(d).__name__}")
    _check_version(d, "dataset description")
    try:
        classes = d.get("classes")
        return DatasetInfo(
            name=str(d["name"]),
            format=str(d["format"]),
            uri=str(d["uri"]),
            num_samples=int(d["num_samples"]),
            total_bytes=int(d["total_bytes"]),
            classes=tuple(str(c) for c in classes) if classes is not None else None,
        )
    except KeyError as e:
        raise ValueError(f"dataset description: missing field {e.args[0]!r}") from None


def parse_descriptions(doc: str | bytes) -> list[DatasetInfo]:
    items = _loads(doc, "dataset list")
    if not isinstance(items, list):
        raise ValueError(f"dataset list: expected a JSON array, got {type(items).__name__}")
    return [parse_description(i) for i in items]


@dataclass(frozen=True)
class EpochStats:
    samples: int = 0
    hits: int = 0
    misses: int = 0
    storage_bytes: int = 0
    cache_bytes: int = 0
    disk_hits: int = 0
    disk_bytes: int = 0
    prefetch_hits: int = 0

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EpochStats:
        return cls(**{f.name: int(d.get(f.name, 0)) for f in fields(cls)})


@dataclass(frozen=True)
class DatasetStats:
    epochs: dict[int, EpochStats] = field(default_factory=dict)
    total: EpochStats = field(default_factory=EpochStats)

    def epoch(self, epoch: int) -> EpochStats:
        """The counters of one epoch (zeros when the sidecar saw none of it)."""
        return self.epochs.get(epoch, EpochStats())


@dataclass(frozen=True)
class CacheStats:
    policy: str
    capacity_bytes: int
    used_bytes: int
    entries: int
    shared_bytes: int = 0


@dataclass(frozen=True)
class Stats:
    cache: CacheStats
    datasets: dict[str, DatasetStats]

    def dataset(self, name: str) -> DatasetStats:
        return self.datasets.get(name, DatasetStats())


def parse_stats(doc: str | bytes | Mapping[str, Any]) -> Stats:
    """Parses the stats JSON (the ``stats`` action and the Py4J ``stats()`` method)."""
    d = _loads(doc, "stats") if isinstance(doc, (str, bytes)) else doc
    if not isinstance(d, Mapping):
        raise ValueError(f"stats: expected a JSON object, got {type(d).__name__}")
    _check_version(d, "stats")
    try:
        c = d["cache"]
        cache = CacheStats(
            policy=str(c["policy"]),
            capacity_bytes=int(c["capacity_bytes"]),
            used_bytes=int(c["used_bytes"]),
            entries=int(c["entries"]),
            shared_bytes=int(c.get("shared_bytes", 0)),
        )
        datasets = {
            str(name): DatasetStats(
                epochs={int(e): EpochStats.from_json(v) for e, v in ds.get("epochs", {}).items()},
                total=EpochStats.from_json(ds.get("total", {})),
            )
            for name, ds in d.get("datasets", {}).items()
        }
    except KeyError as e:
        raise ValueError(f"stats: missing field {e.args[0]!r}") from None
    return Stats(cache=cache, datasets=datasets)


def check_batch(batch: pa.RecordBatch) -> None:
    """Checks that a batch has the v1 columns and types; raises ValueError naming what differs."""
    schema_version = (batch.schema.metadata or {}).get(SCHEMA_VERSION_KEY)
    if schema_version is not None and schema_version != str(PROTOCOL_VERSION).encode():
        raise ValueError(
            f"batch schema version {schema_version.decode(errors='replace')} is not supported "
            f"(this client speaks version {PROTOCOL_VERSION})"
        )
    for f in BATCH_SCHEMA:
        i = batch.schema.get_field_index(f.name)
        if i < 0:
            raise ValueError(f"batch has no column {f.name!r} (columns: {batch.schema.names})")
        t = batch.schema.field(i).type
        ok = t == f.type or (f.name == "payload" and t == pa.large_binary()) or (f.name == "key" and t == pa.large_utf8())
        if not ok:
            raise ValueError(f"batch column {f.name!r} has type {t}, expected {f.type}")
