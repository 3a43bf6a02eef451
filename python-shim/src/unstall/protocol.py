"""Wire protocol v1, client side: tickets, the batch schema, and the JSON documents.

The byte layout and the error messages follow ``protocol/README.md``; the golden fixtures in
``protocol/fixtures/`` are checked by ``python-shim/tests/test_protocol.py`` and by the Java tests.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import ProtocolMismatchError

__all__ = [
    "batch_to_numpy",
    "numpy_dtype",
    "skipped_of",
    "tensor_batch",
    "PROTOCOL_VERSION",
    "TICKET_MAGIC",
    "KIND_FETCH",
    "KIND_PLAN",
    "KIND_PREP",
    "KIND_PEER",
    "MAX_NAME_BYTES",
    "MAX_IDS",
    "MAX_PLAN_IDS",
    "BATCH_SCHEMA",
    "SCHEMA_VERSION_KEY",
    "FetchTicket",
    "encode_fetch_ticket",
    "decode_ticket",
    "Plan",
    "encode_plan",
    "decode_plan",
    "PrepTicket",
    "encode_prep_ticket",
    "decode_prep_ticket",
    "DatasetInfo",
    "EpochStats",
    "DatasetStats",
    "CacheStats",
    "Stats",
    "ClusterStats",
    "parse_description",
    "parse_descriptions",
    "parse_stats",
    "ManifestExport",
    "parse_manifest_export",
    "TenantToken",
    "IssuedToken",
    "parse_tenant_token",
    "parse_tenant_tokens",
    "parse_issued_token",
    "check_batch",
    "SessionStats",
    "SampleBatch",
    "LOCAL_MAGIC",
    "LOCAL_MAX_FRAME",
    "LocalOk",
    "LocalError",
    "LocalBatch",
    "LocalRequest",
    "encode_local_hello",
    "encode_local_open",
    "encode_local_fetch",
    "encode_local_plan",
    "encode_local_close",
    "encode_local_prep",
    "decode_local_request",
    "encode_local_ok",
    "encode_local_error",
    "encode_local_batch",
    "decode_local_reply",
]

PROTOCOL_VERSION = 1
TICKET_MAGIC = b"UNST"
KIND_FETCH = 1
KIND_PLAN = 2
KIND_PREP = 3  # coordinated prep's DoGet ticket (unstall.prep)
KIND_PEER = 4  # sidecar to sidecar only (the partitioned cache); never sent by the shim
MAX_NAME_BYTES = 1024
MAX_IDS = 65536
MAX_PLAN_IDS = 1 << 28
_U32_MAX = 0xFFFFFFFF
_U64_MAX = 0xFFFFFFFFFFFFFFFF
# magic, version, kind, name length
_HEADER = struct.Struct("<4sBBH")
# epoch, number of ids
_MIDDLE = struct.Struct("<II")
# a PREP ticket after the group id: member, epoch, batch
_PREP_TAIL = struct.Struct("<QII")

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


@dataclass(frozen=True)
class Plan:
    """A PLAN message: the whole order of one epoch of a dataset, for clairvoyant prefetch."""

    dataset: str
    epoch: int
    ids: tuple[int, ...]

    def encode(self) -> bytes:
        return encode_plan(self.dataset, self.ids, self.epoch)


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
    epoch, arr = _epoch_and_ids(epoch, ids, MAX_PLAN_IDS if kind == KIND_PLAN else MAX_IDS,
                                "a plan" if kind == KIND_PLAN else "a ticket")
    return b"".join(
        (
            _HEADER.pack(TICKET_MAGIC, PROTOCOL_VERSION, kind, len(name)),
            name,
            _MIDDLE.pack(epoch, arr.size),
            arr.astype("<u8", copy=False).tobytes(),
        )
    )


def _epoch_and_ids(epoch: int, ids: Iterable[int] | np.ndarray, max_ids: int, what: str) -> tuple[int, np.ndarray]:
    epoch = int(epoch)
    if not 0 <= epoch <= _U32_MAX:
        raise ValueError(f"epoch {epoch} is outside 0..{_U32_MAX}")
    arr = _ids_array(ids)
    if not 1 <= arr.size <= max_ids:
        raise ValueError(f"{what} carries 1..{max_ids} sample ids, got {arr.size}")
    return epoch, arr


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


def decode_ticket(data: bytes) -> FetchTicket:
    """Decodes a FETCH ticket; raises ValueError starting with ``malformed ticket:``."""
    dataset, epoch, ids = _decode_ids(data, KIND_FETCH, MAX_IDS)
    return FetchTicket(dataset=dataset, epoch=epoch, ids=ids)


def decode_plan(data: bytes) -> Plan:
    """Decodes a PLAN message (the ``prefetch`` action's body); raises ValueError like ``decode_ticket``."""
    dataset, epoch, ids = _decode_ids(data, KIND_PLAN, MAX_PLAN_IDS)
    return Plan(dataset=dataset, epoch=epoch, ids=ids)


@dataclass(frozen=True)
class PrepTicket:
    """A PREP ticket: one batch of a coordinated prep group, for one member."""

    group: str
    member: int
    epoch: int
    batch: int

    def encode(self) -> bytes:
        return encode_prep_ticket(self.group, self.member, self.epoch, self.batch)


def encode_prep_ticket(group: str, member: int, epoch: int, batch: int) -> bytes:
    """A PREP ticket: ``UNST``, version 1, kind 3, u16 group length, group, u64 member, u32 epoch, u32 batch."""
    name = group.encode("utf-8")
    if not 1 <= len(name) <= MAX_NAME_BYTES:
        raise ValueError(f"group id must be 1..{MAX_NAME_BYTES} UTF-8 bytes, got {len(name)}")
    for what, v, hi in (("member", member, 2**64 - 1), ("epoch", epoch, 2**32 - 1), ("batch", batch, 2**32 - 1)):
        if not 0 <= int(v) <= hi:
            raise ValueError(f"{what} {v} is outside 0..{hi}")
    return _HEADER.pack(TICKET_MAGIC, PROTOCOL_VERSION, KIND_PREP, len(name)) + name + _PREP_TAIL.pack(member, epoch, batch)


def decode_prep_ticket(data: bytes) -> PrepTicket:
    """Decodes a PREP ticket with the checks and messages of the sidecar's parser; raises ValueError starting
    with ``malformed ticket:``."""
    buf = bytes(data)
    if len(buf) < 6 or buf[:4] != TICKET_MAGIC or buf[4] != PROTOCOL_VERSION or buf[5] != KIND_PREP:
        raise ValueError('malformed ticket: not a PREP ticket (magic "UNST", version 1, kind 3)')
    if len(buf) < _HEADER.size:
        raise ValueError(f"malformed ticket: truncated at byte {len(buf)}: header needs {_HEADER.size} bytes")
    name_len = _HEADER.unpack_from(buf, 0)[3]
    if not 1 <= name_len <= MAX_NAME_BYTES:
        raise ValueError(f"malformed ticket: group id length {name_len} not in 1..{MAX_NAME_BYTES}")
    expected = _HEADER.size + name_len + _PREP_TAIL.size
    if len(buf) < expected:
        raise ValueError(
            f"malformed ticket: truncated at byte {len(buf)}: a PREP ticket with a {name_len}-byte group id is "
            f"{expected} bytes"
        )
    if len(buf) > expected:
        extra = len(buf) - expected
        raise ValueError(f"malformed ticket: {extra} trailing byte{'s' if extra != 1 else ''} after the batch index")
    try:
        group = buf[_HEADER.size : _HEADER.size + name_len].decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"malformed ticket: group id is not UTF-8 ({e.reason})") from None
    member, epoch, batch = _PREP_TAIL.unpack_from(buf, _HEADER.size + name_len)
    return PrepTicket(group=group, member=member, epoch=epoch, batch=batch)


def _decode_ids(data: bytes, kind: int, max_ids: int) -> tuple[str, int, tuple[int, ...]]:
    """The id-list layout FETCH tickets and PLAN messages share (protocol/README.md)."""
    buf = memoryview(bytes(data))
    size = len(buf)
    if size < 4:
        raise ValueError(f"malformed ticket: truncated: {size} bytes, the header is {_HEADER.size + _MIDDLE.size}")
    if bytes(buf[:4]) != TICKET_MAGIC:
        raise ValueError(f"malformed ticket: bad magic {bytes(buf[:4])!r}, expected {TICKET_MAGIC!r}")
    if size < _HEADER.size:
        raise ValueError(f"malformed ticket: truncated: {size} bytes, the header is {_HEADER.size + _MIDDLE.size}")
    _, version, got, name_len = _HEADER.unpack_from(buf, 0)
    if version != PROTOCOL_VERSION:
        raise ValueError(
            f"malformed ticket: unsupported version {version} (this client speaks version {PROTOCOL_VERSION})"
        )
    if got != kind:
        what = f"kind {got} is not valid here" if got in (KIND_FETCH, KIND_PLAN, KIND_PREP, KIND_PEER) else f"unknown kind {got}"
        raise ValueError(f"malformed ticket: {what} (expected {kind}; 1 = FETCH, 2 = PLAN, 3 = PREP, 4 = PEER)")
    if not 1 <= name_len <= MAX_NAME_BYTES:
        raise ValueError(f"malformed ticket: dataset name length {name_len} is outside 1..{MAX_NAME_BYTES}")
    if size < 16 + name_len:
        raise ValueError(f"malformed ticket: truncated: {size} bytes, the header with the name is {16 + name_len}")
    try:
        dataset = bytes(buf[8 : 8 + name_len]).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"malformed ticket: dataset name is not UTF-8 ({e.reason})") from None
    epoch, n = _MIDDLE.unpack_from(buf, 8 + name_len)
    if not 1 <= n <= max_ids:
        raise ValueError(f"malformed ticket: id count {n} is outside 1..{max_ids}")
    expected = 16 + name_len + 8 * n
    if size < expected:
        raise ValueError(f"malformed ticket: truncated: {size} bytes, {n} ids need {expected}")
    if size > expected:
        extra = size - expected
        raise ValueError(f"malformed ticket: {extra} trailing byte{'s' if extra != 1 else ''} after {expected}")
    ids = np.frombuffer(buf, dtype="<u8", count=n, offset=16 + name_len)
    return dataset, epoch, tuple(int(i) for i in ids)


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
    except RecursionError:  # "[[[[..." nested deeper than the interpreter's stack
        raise ValueError(f"{what}: not valid JSON (nested too deeply)") from None


@dataclass(frozen=True)
class DatasetInfo:
    """A registered dataset, as the sidecar describes it."""

    name: str
    format: str
    uri: str
    num_samples: int
    total_bytes: int
    classes: tuple[str, ...] | None = None
    # What a format's decoder needs (unstall.formats): dtype and row shape, columns and types, ...; None when
    # samples are plain files or records.
    layout: Mapping[str, Any] | None = field(default=None, hash=False)

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
            layout=_layout(d.get("layout")),
        )
    except KeyError as e:
        raise ValueError(f"dataset description: missing field {e.args[0]!r}") from None
    except (TypeError, AttributeError, ValueError, OverflowError) as e:  # a field of the wrong type, e.g. null
        raise ValueError(f"dataset description: a field has the wrong type ({e})") from None


def _layout(v: Any) -> Mapping[str, Any] | None:
    if v is not None and not isinstance(v, Mapping):
        raise TypeError(f"layout must be an object, got {type(v).__name__}")
    return v


def parse_descriptions(doc: str | bytes) -> list[DatasetInfo]:
    items = _loads(doc, "dataset list")
    if not isinstance(items, list):
        raise ValueError(f"dataset list: expected a JSON array, got {type(items).__name__}")
    return [parse_description(i) for i in items]


@dataclass(frozen=True)
class TenantToken:
    """A tenant token the owner issued (``listTokens``): its id, who it is for, the datasets it grants."""

    id: str
    name: str
    datasets: tuple[str, ...]
    created: str


@dataclass(frozen=True)
class IssuedToken(TenantToken):
    """A token just issued (``issueToken``): the only time the sidecar hands out the token itself."""

    token: str = field(default="", repr=False)  # never in a repr, a log line or a traceback


def parse_tenant_token(doc: str | bytes | Mapping[str, Any]) -> TenantToken:
    d = _loads(doc, "tenant token") if isinstance(doc, (str, bytes)) else doc
    if not isinstance(d, Mapping):
        raise ValueError(f"tenant token: expected a JSON object, got {type(d).__name__}")
    _check_version(d, "tenant token")
    try:
        return TenantToken(id=str(d["id"]), name=str(d.get("name", "")),
                           datasets=tuple(str(x) for x in d["datasets"]), created=str(d.get("created", "")))
    except KeyError as e:
        raise ValueError(f"tenant token: missing field {e.args[0]!r}") from None


def parse_tenant_tokens(doc: str | bytes) -> list[TenantToken]:
    items = _loads(doc, "tenant token list")
    if not isinstance(items, list):
        raise ValueError(f"tenant token list: expected a JSON array, got {type(items).__name__}")
    return [parse_tenant_token(i) for i in items]


def parse_issued_token(doc: str | bytes) -> IssuedToken:
    d = _loads(doc, "issued token")
    t = parse_tenant_token(d)
    token = d.get("token")
    if not isinstance(token, str) or len(token) < 16:
        raise ValueError("issued token: the reply carries no token")
    return IssuedToken(id=t.id, name=t.name, datasets=t.datasets, created=t.created, token=token)


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
    # Digests an imported manifest claimed, checked against the dataset's own bytes on first read:
    # confirmed, and refused (the claimed entry is never served; the sample's own bytes are).
    verified: int = 0
    verify_mismatches: int = 0
    peer_hits: int = 0  # served from the cache of the sidecar that owns the sample (a cluster)
    peer_bytes: int = 0
    peer_fallbacks: int = 0  # samples whose owner failed or left: read from storage (counted in misses too)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EpochStats:
        return cls(**{f.name: int(d.get(f.name, 0)) for f in fields(cls)})


@dataclass(frozen=True)
class DatasetStats:
    epochs: dict[int, EpochStats] = field(default_factory=dict)
    total: EpochStats = field(default_factory=EpochStats)
    # In a cluster: what this sidecar served to peers as the samples' owner (not its own clients' epochs).
    served_to_peers: Optional[DatasetStats] = None

    def epoch(self, epoch: int) -> EpochStats:
        """The counters of one epoch (zeros when the sidecar saw none of it)."""
        return self.epochs.get(epoch, EpochStats())


@dataclass(frozen=True)
class SessionStats(DatasetStats):
    """One session's counters (a DataLoader's view of a dataset over the local socket): its dataset,
    name and transport, and epochs like a dataset's."""

    dataset: str = ""
    name: str = ""
    transport: str = ""


def _dataset_stats(d: Mapping[str, Any], cls: type = DatasetStats, **extra: Any) -> Any:
    peers = d.get("served_to_peers")
    return cls(
        epochs={int(e): EpochStats.from_json(v) for e, v in d.get("epochs", {}).items()},
        total=EpochStats.from_json(d.get("total", {})),
        served_to_peers=None if peers is None else _dataset_stats(peers),
        **extra,
    )


@dataclass(frozen=True)
class ClusterStats:
    """The partitioned cache's view from this sidecar: members it sees, and whether ownership is settled."""

    members: int
    settled: bool


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
    sessions: dict[int, SessionStats] = field(default_factory=dict)
    cluster: Optional[ClusterStats] = None  # None: a sidecar on its own

    def dataset(self, name: str) -> DatasetStats:
        return self.datasets.get(name, DatasetStats())

    def session(self, session: int) -> SessionStats:
        """The counters of one local-socket session (zeros when the sidecar lists none such)."""
        return self.sessions.get(int(session), SessionStats())


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
        datasets = {str(name): _dataset_stats(ds) for name, ds in d.get("datasets", {}).items()}
        sessions = {
            int(sid): _dataset_stats(
                ss, SessionStats, dataset=str(ss.get("dataset", "")), name=str(ss.get("name", "")),
                transport=str(ss.get("transport", "")),
            )
            for sid, ss in d.get("sessions", {}).items()
        }
        k = d.get("cluster")
        cluster = None if k is None else ClusterStats(members=int(k["members"]), settled=bool(k["settled"]))
    except KeyError as e:
        raise ValueError(f"stats: missing field {e.args[0]!r}") from None
    except (TypeError, AttributeError, ValueError, OverflowError) as e:  # a field of the wrong type, e.g. a list
        raise ValueError(f"stats: a field has the wrong type ({e})") from None
    except RecursionError:  # served_to_peers nested past the stack
        raise ValueError("stats: nested too deeply") from None
    return Stats(cache=cache, datasets=datasets, sessions=sessions, cluster=cluster)


@dataclass(frozen=True)
class ManifestExport:
    """What ``exportManifest`` wrote: the file, how many sample digests it holds (each computed from the
    dataset's own bytes), and the dataset's sample count."""

    path: str
    known: int
    num_samples: int


def parse_manifest_export(doc: str | bytes) -> ManifestExport:
    """Parses the reply of the control plane's ``exportManifest``."""
    d = _loads(doc, "manifest export")
    if not isinstance(d, Mapping):
        raise ValueError(f"manifest export: expected a JSON object, got {type(d).__name__}")
    try:
        return ManifestExport(path=str(d["path"]), known=int(d["known"]), num_samples=int(d["num_samples"]))
    except KeyError as e:
        raise ValueError(f"manifest export: missing field {e.args[0]!r}") from None


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


# ---------------------------------------------------------------------------------------------
# A fetched batch, whatever the transport


@dataclass(eq=False)
class SampleBatch:
    """A batch of samples in request order, as either data plane delivers it.

    ``payloads`` are read-only ``memoryview``s of the bytes where they arrived: the sidecar's shared
    memory (``transport="shm"``: its cache arena or a staging file, mapped read-only) or the Arrow
    buffer of a Flight batch (``"flight"``). Nothing is copied; a view keeps its mapping (or buffer)
    alive for as long as it is referenced. ``labels[i]`` is meaningful only where ``label_valid[i]``.
    """

    ids: np.ndarray  # int64
    labels: np.ndarray  # int64
    label_valid: np.ndarray  # bool
    keys: list[str]
    payloads: list[memoryview]
    transport: str
    nbytes: int = -1  # the payload bytes; computed when not given
    arrow: Optional[pa.RecordBatch] = field(default=None, repr=False)  # the Flight batch it views, if any

    def __post_init__(self) -> None:
        if self.nbytes < 0:
            self.nbytes = sum(p.nbytes for p in self.payloads)

    def __len__(self) -> int:
        return len(self.payloads)

    def label_list(self) -> list[Optional[int]]:
        """The labels as Python ints, ``None`` where a row has none (tfrecord)."""
        return [v if ok else None for v, ok in zip(self.labels.tolist(), self.label_valid.tolist())]

    def to_arrow(self) -> pa.RecordBatch:
        """The batch in the Flight batch schema: the received one (Flight), or a copy of the payloads."""
        if self.arrow is not None:
            return self.arrow
        lengths = np.fromiter((p.nbytes for p in self.payloads), dtype=np.int64, count=len(self.payloads))
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if offsets[-1] > np.iinfo(np.int32).max:
            raise ValueError(f"a batch of {int(offsets[-1])} payload bytes does not fit an Arrow binary column")
        payload = pa.Array.from_buffers(
            pa.binary(), len(lengths), [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(self.payloads))]
        )
        return pa.RecordBatch.from_arrays(
            [
                pa.array(self.ids, pa.int64()),
                pa.array(self.labels, pa.int64(), mask=~self.label_valid),
                pa.array(self.keys, pa.utf8()),
                payload,
            ],
            schema=BATCH_SCHEMA,
        )

    @classmethod
    def from_arrow(cls, batch: pa.RecordBatch, transport: str = "flight") -> SampleBatch:
        """Views of a Flight batch (``check_batch`` it first): payloads are slices of the column's data buffer."""
        label = batch.column("label")
        payload = batch.column("payload")
        n = len(payload)
        wide = pa.types.is_large_binary(payload.type)
        _, offsets_buf, data_buf = payload.buffers()
        width = 8 if wide else 4
        offsets = (
            np.frombuffer(offsets_buf, dtype=f"<i{width}", count=n + 1, offset=payload.offset * width)
            if n
            else np.zeros(1, np.int64)
        )
        data = memoryview(data_buf if data_buf is not None else b"").toreadonly()
        starts, ends = offsets[:-1].tolist(), offsets[1:].tolist()
        return cls(
            ids=batch.column("id").to_numpy(zero_copy_only=False).astype(np.int64, copy=False),
            labels=label.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False),
            label_valid=label.is_valid().to_numpy(zero_copy_only=False),
            keys=batch.column("key").to_pylist(),
            payloads=[data[s:e] for s, e in zip(starts, ends)],
            transport=transport,
            nbytes=int(offsets[-1] - offsets[0]),
            arrow=batch,
        )


# ---------------------------------------------------------------------------------------------
# The local socket (UNSL, version 1): frame bodies, both directions

LOCAL_MAGIC = b"UNSL"
LOCAL_VERSION = 1
LOCAL_MAX_FRAME = 256 << 20
LOCAL_FRAME = struct.Struct("<I")  # every frame: u32 length of the body, then the body
LOCAL_HELLO, LOCAL_OPEN, LOCAL_FETCH, LOCAL_PLAN, LOCAL_CLOSE, LOCAL_PREP = 1, 2, 3, 4, 5, 6
LOCAL_MAX_ACTION_TYPE = 64  # PREP: the longest action type
LOCAL_MAX_PLAN_IDS = 1 << 25
REPLY_OK, REPLY_ERROR, REPLY_BATCH = 0, 1, 2
LOCAL_ERROR_CODES = {
    1: "INVALID_ARGUMENT",
    2: "NOT_FOUND",
    3: "INTERNAL",
    4: "RESOURCE_EXHAUSTED",
    5: "UNAUTHENTICATED",
    6: "UNAVAILABLE",
}
_LOCAL_IDS = struct.Struct("<BQII")  # kind, session, epoch, n (FETCH, PLAN)
_LOCAL_SESSION = struct.Struct("<BQ")  # kind, session (CLOSE)
_LOCAL_HELLO = struct.Struct("<B4sBH")  # kind, magic, version, token length
_LOCAL_BATCH = struct.Struct("<B3xIII")  # kind, pad, n, nseg, keyBytes
_LOCAL_PREP = struct.Struct("<BH")  # kind, action type length (PREP)
_LOCAL_NAMES = {LOCAL_HELLO: "HELLO", LOCAL_OPEN: "OPEN", LOCAL_FETCH: "FETCH", LOCAL_PLAN: "PLAN", LOCAL_CLOSE: "CLOSE",
                LOCAL_PREP: "PREP"}


@dataclass(frozen=True)
class LocalRequest:
    """A decoded request body (what the sidecar parses; the shim's tests and fakes use it)."""

    kind: int
    token: Optional[bytes] = None  # HELLO
    doc: Optional[dict[str, Any]] = None  # OPEN
    session: Optional[int] = None  # FETCH, PLAN, CLOSE
    epoch: Optional[int] = None  # FETCH, PLAN
    ids: Optional[np.ndarray] = None  # FETCH, PLAN (uint64)
    action: Optional[str] = None  # PREP: the prep.* action
    body: Optional[bytes] = None  # PREP: its body (UTF-8 JSON, as DoAction's)


@dataclass(frozen=True)
class LocalOk:
    doc: dict[str, Any]


@dataclass(frozen=True)
class LocalError:
    code: int
    message: str

    @property
    def status(self) -> str:
        """The status name (``NOT_FOUND``, ...), as Flight would call it."""
        return LOCAL_ERROR_CODES.get(self.code, f"UNKNOWN({self.code})")


@dataclass(frozen=True)
class LocalBatch:
    """A decoded BATCH reply: numeric columns as numpy views of the reply body."""

    ids: np.ndarray  # int64
    labels: np.ndarray  # int64
    label_valid: np.ndarray  # bool
    offsets: np.ndarray  # uint64: where each payload starts in its segment
    lengths: np.ndarray  # uint32
    segs: np.ndarray  # uint32: index into ``segments``
    keys: list[str]
    segments: list[str]  # file names in the sidecar's shared-memory directory


def encode_frame(body: bytes) -> bytes:
    if len(body) > LOCAL_MAX_FRAME:
        raise ValueError(f"a frame body is at most {LOCAL_MAX_FRAME} bytes, got {len(body)}")
    return LOCAL_FRAME.pack(len(body)) + body


def encode_local_hello(token: Union[str, bytes, None]) -> bytes:
    t = token.encode() if isinstance(token, str) else (token or b"")
    if len(t) > 0xFFFF:
        raise ValueError(f"a token is at most 65535 bytes, got {len(t)}")
    return _LOCAL_HELLO.pack(LOCAL_HELLO, LOCAL_MAGIC, LOCAL_VERSION, len(t)) + t


def encode_local_open(dataset: str, name: str) -> bytes:
    if not isinstance(dataset, str) or not dataset:
        raise ValueError(f"a dataset name (non-empty str) is required, got {dataset!r}")
    return bytes([LOCAL_OPEN]) + json.dumps({"dataset": dataset, "name": str(name)}).encode()


def encode_local_fetch(session: int, ids: Union[Sequence[int], np.ndarray], epoch: int) -> bytes:
    """FETCH: ``u8 3, u64 session, u32 epoch, u32 n, u64 ids[n]``, n in 1..65536."""
    return _encode_local_ids(LOCAL_FETCH, session, ids, epoch)


def encode_local_plan(session: int, ids: Union[Sequence[int], np.ndarray], epoch: int) -> bytes:
    """PLAN (clairvoyant prefetch): the epoch's whole order for ``session``, n in 1..2^25."""
    return _encode_local_ids(LOCAL_PLAN, session, ids, epoch)


def encode_local_close(session: int) -> bytes:
    return _LOCAL_SESSION.pack(LOCAL_CLOSE, _u64(session, "session"))


def encode_local_prep(action: str, body: bytes) -> bytes:
    """PREP: ``u8 6, u16 L, action[L], body``: a ``prep.*`` action (``prep.next``) on the local socket instead of
    a Flight DoAction; the reply is OK with the same JSON document."""
    t = action.encode()
    if not action.startswith("prep.") or not 1 <= len(t) <= LOCAL_MAX_ACTION_TYPE:
        raise ValueError(f"PREP carries prep.* actions of at most {LOCAL_MAX_ACTION_TYPE} bytes, not {action!r}")
    return _LOCAL_PREP.pack(LOCAL_PREP, len(t)) + t + bytes(body)


def _u64(v: int, what: str) -> int:
    v = int(v)
    if not 0 <= v <= _U64_MAX:
        raise ValueError(f"{what} {v} is outside 0..{_U64_MAX}")
    return v


def _encode_local_ids(kind: int, session: int, ids: Union[Sequence[int], np.ndarray], epoch: int) -> bytes:
    max_ids = LOCAL_MAX_PLAN_IDS if kind == LOCAL_PLAN else MAX_IDS
    epoch, arr = _epoch_and_ids(epoch, ids, max_ids, f"a {_LOCAL_NAMES[kind]} request")
    head = _LOCAL_IDS.pack(kind, _u64(session, "session"), epoch, arr.size)
    return head + arr.astype("<u8", copy=False).tobytes()


def decode_local_request(body: Union[bytes, bytearray, memoryview]) -> LocalRequest:
    """Decodes a request body; raises ValueError starting with ``malformed request:``."""
    buf = memoryview(body)
    if len(buf) < 1:
        raise ValueError("malformed request: empty body")
    kind = buf[0]
    if kind == LOCAL_HELLO:
        if len(buf) < _LOCAL_HELLO.size:
            raise ValueError(f"malformed request: truncated HELLO: {len(buf)} bytes")
        _, magic, version, n = _LOCAL_HELLO.unpack_from(buf)
        if magic != LOCAL_MAGIC:
            raise ValueError(f"malformed request: bad magic {magic!r}, expected {LOCAL_MAGIC!r}")
        if version != LOCAL_VERSION:
            raise ValueError(f"malformed request: unsupported version {version} (this side speaks version {LOCAL_VERSION})")
        _expect_size(buf, _LOCAL_HELLO.size + n, "HELLO")
        return LocalRequest(kind, token=bytes(buf[_LOCAL_HELLO.size :]))
    if kind == LOCAL_OPEN:
        doc = _loads(bytes(buf[1:]), "malformed request: OPEN")
        if not isinstance(doc, dict):
            raise ValueError("malformed request: OPEN: expected a JSON object")
        return LocalRequest(kind, doc=doc)
    if kind in (LOCAL_FETCH, LOCAL_PLAN):
        if len(buf) < _LOCAL_IDS.size:
            raise ValueError(f"malformed request: truncated {_LOCAL_NAMES[kind]}: {len(buf)} bytes")
        _, session, epoch, n = _LOCAL_IDS.unpack_from(buf)
        max_ids = LOCAL_MAX_PLAN_IDS if kind == LOCAL_PLAN else MAX_IDS
        if not 1 <= n <= max_ids:
            raise ValueError(f"malformed request: id count {n} is outside 1..{max_ids}")
        _expect_size(buf, _LOCAL_IDS.size + 8 * n, _LOCAL_NAMES[kind])
        ids = np.frombuffer(buf, dtype="<u8", count=n, offset=_LOCAL_IDS.size)
        return LocalRequest(kind, session=session, epoch=epoch, ids=ids)
    if kind == LOCAL_PREP:
        if len(buf) < _LOCAL_PREP.size:
            raise ValueError(f"malformed request: truncated PREP: {len(buf)} bytes")
        n = _LOCAL_PREP.unpack_from(buf)[1]
        if not 1 <= n <= LOCAL_MAX_ACTION_TYPE:
            raise ValueError(f"malformed request: PREP action type length {n} is outside 1..{LOCAL_MAX_ACTION_TYPE}")
        if len(buf) < _LOCAL_PREP.size + n:
            raise ValueError(f"malformed request: truncated PREP: {len(buf)} bytes")
        try:
            action = bytes(buf[_LOCAL_PREP.size : _LOCAL_PREP.size + n]).decode()
        except UnicodeDecodeError:
            raise ValueError("malformed request: PREP action type is not UTF-8") from None
        if not action.startswith("prep."):
            raise ValueError(f"malformed request: PREP carries prep.* actions only, not {action!r}")
        return LocalRequest(kind, action=action, body=bytes(buf[_LOCAL_PREP.size + n :]))
    if kind == LOCAL_CLOSE:
        _expect_size(buf, _LOCAL_SESSION.size, "CLOSE")
        return LocalRequest(kind, session=_LOCAL_SESSION.unpack_from(buf)[1])
    raise ValueError(f"malformed request: unknown kind {kind}")


def _expect_size(buf: memoryview, expected: int, what: str) -> None:
    if len(buf) < expected:
        raise ValueError(f"malformed request: truncated {what}: {len(buf)} bytes, expected {expected}")
    if len(buf) > expected:
        raise ValueError(f"malformed request: {len(buf) - expected} trailing bytes after the {what}'s {expected}")


def encode_local_ok(doc: Mapping[str, Any]) -> bytes:
    return bytes([REPLY_OK]) + json.dumps(dict(doc)).encode()


def encode_local_error(code: int, message: str) -> bytes:
    return bytes([REPLY_ERROR, code]) + message.encode()


def encode_local_batch(
    ids: Sequence[int],
    labels: Sequence[Optional[int]],
    offsets: Sequence[int],
    lengths: Sequence[int],
    segs: Sequence[int],
    keys: Sequence[str],
    segments: Sequence[str],
) -> bytes:
    """A BATCH reply body (what the sidecar sends; the shim's tests and fakes use it)."""
    n = len(ids)
    key_bytes = [k.encode() for k in keys]
    valid = np.array([lab is not None for lab in labels], dtype=np.uint8)
    names = [s.encode() for s in segments]
    return b"".join(
        [
            _LOCAL_BATCH.pack(REPLY_BATCH, n, len(names), sum(len(k) for k in key_bytes)),
            np.asarray(ids, dtype="<i8").tobytes(),
            np.array([0 if lab is None else lab for lab in labels], dtype="<i8").tobytes(),
            np.asarray(offsets, dtype="<u8").tobytes(),
            np.asarray(lengths, dtype="<u4").tobytes(),
            np.asarray(segs, dtype="<u4").tobytes(),
            np.cumsum([len(k) for k in key_bytes], dtype=np.int64).astype("<u4").tobytes(),
            valid.tobytes(),
            *key_bytes,
            *(struct.pack("<H", len(s)) + s for s in names),
        ]
    )


def decode_local_reply(body: Union[bytes, bytearray, memoryview]) -> Union[LocalOk, LocalError, LocalBatch]:
    """Decodes a reply body; raises ValueError starting with ``malformed reply:``. A BATCH's numeric
    columns are numpy views of ``body`` (no per-row work but the keys)."""
    buf = memoryview(body)
    if len(buf) < 1:
        raise ValueError("malformed reply: empty body")
    kind = buf[0]
    if kind == REPLY_OK:
        doc = _loads(bytes(buf[1:]), "malformed reply: OK")
        if not isinstance(doc, dict):
            raise ValueError("malformed reply: OK: expected a JSON object")
        return LocalOk(doc)
    if kind == REPLY_ERROR:
        if len(buf) < 2:
            raise ValueError("malformed reply: truncated ERROR")
        return LocalError(buf[1], bytes(buf[2:]).decode("utf-8", errors="replace"))
    if kind != REPLY_BATCH:
        raise ValueError(f"malformed reply: unknown kind {kind}")
    if len(buf) < _LOCAL_BATCH.size:
        raise ValueError(f"malformed reply: truncated BATCH header: {len(buf)} bytes")
    _, n, nseg, key_len = _LOCAL_BATCH.unpack_from(buf)
    pos = _LOCAL_BATCH.size
    fixed = pos + 37 * n + key_len  # 8 ids, 8 labels, 8 offsets, 4 lengths, 4 segs, 4 keyEnds, 1 labelValid
    if len(buf) < fixed:
        raise ValueError(f"malformed reply: truncated BATCH: {len(buf)} bytes, {n} rows need at least {fixed}")
    cols = {}
    for name, dtype in (("ids", "<i8"), ("labels", "<i8"), ("offsets", "<u8"), ("lengths", "<u4"), ("segs", "<u4"),
                        ("ends", "<u4"), ("valid", "u1")):
        cols[name] = np.frombuffer(buf, dtype=dtype, count=n, offset=pos)
        pos += cols[name].nbytes
    key_blob = bytes(buf[pos : pos + key_len])
    pos += key_len
    segments: list[str] = []
    for _ in range(nseg):
        if len(buf) < pos + 2:
            raise ValueError(f"malformed reply: truncated segment table ({len(segments)} of {nseg} names)")
        (ln,) = struct.unpack_from("<H", buf, pos)
        if len(buf) < pos + 2 + ln:
            raise ValueError(f"malformed reply: truncated segment table ({len(segments)} of {nseg} names)")
        segments.append(_utf8(bytes(buf[pos + 2 : pos + 2 + ln]), "segment name"))
        pos += 2 + ln
    if pos != len(buf):
        raise ValueError(f"malformed reply: {len(buf) - pos} trailing bytes after the BATCH")
    ends = cols["ends"]
    if n and (ends[-1] != key_len or np.any(np.diff(ends.astype(np.int64)) < 0)):
        raise ValueError(f"malformed reply: key ends are not non-decreasing up to {key_len}")
    if n and int(cols["segs"].max()) >= nseg:
        raise ValueError(f"malformed reply: segment index {int(cols['segs'].max())} outside the table of {nseg}")
    return LocalBatch(
        ids=cols["ids"],
        labels=cols["labels"],
        label_valid=cols["valid"] != 0,
        offsets=cols["offsets"],
        lengths=cols["lengths"],
        segs=cols["segs"],
        keys=_split_keys(key_blob, ends),
        segments=segments,
    )


def _split_keys(blob: bytes, ends: np.ndarray) -> list[str]:
    bounds = [0, *ends.tolist()]
    if blob.isascii():  # one decode, then slices (byte offsets are character offsets)
        text = blob.decode("ascii")
        return [text[a:b] for a, b in zip(bounds, bounds[1:])]
    return [_utf8(blob[a:b], "key") for a, b in zip(bounds, bounds[1:])]


def _utf8(b: bytes, what: str) -> str:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"malformed reply: a {what} is not UTF-8 ({e.reason})") from None


# ---------------------------------------------------------------------------------------------
# Prepared batches (protocol/README.md, "Prepared-batch schema")


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a prepared tensor's elements (little-endian); bfloat16, which numpy lacks, as its raw
    uint16 bits (``to_torch`` views them as ``torch.bfloat16``)."""
    return np.dtype("uint16" if name == "bfloat16" else name).newbyteorder("<")


def batch_to_numpy(batch: pa.RecordBatch) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(tensors, labels, ids)`` of a prepared batch. ``tensors`` is a read-only view of the Arrow buffer
    (no copy), shaped ``[n, *shape]`` from the schema metadata; labels are -1 where the format has none."""
    meta = batch.schema.metadata or {}
    try:
        shape = tuple(json.loads(meta[b"unstall.prep.shape"]))
        dtype = numpy_dtype(meta[b"unstall.prep.dtype"].decode())
    except KeyError as e:
        raise ProtocolMismatchError(f"prepared batch without {e.args[0]!r} metadata") from None
    col = batch.column("tensor")
    n = len(col)
    width = col.type.byte_width
    if width != int(np.prod(shape)) * dtype.itemsize:
        raise ProtocolMismatchError(f"tensor width {width} bytes does not match shape {shape} {dtype}")
    buf = col.buffers()[1]
    if n == 0:  # every sample of the batch was skipped (decode on_error="skip")
        tensors = np.empty((0,), dtype=dtype)
    else:
        tensors = np.frombuffer(buf, dtype=dtype, count=n * width // dtype.itemsize, offset=col.offset * width)
    labels = pc.fill_null(batch.column("label"), -1).to_numpy(zero_copy_only=False)
    ids = batch.column("id").to_numpy(zero_copy_only=False)
    return tensors.reshape((n,) + shape), labels, ids


def skipped_of(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """The samples a prepared batch left out (decode ``on_error="skip"``): ``{"id", "key", "reason"}`` each."""
    raw = (batch.schema.metadata or {}).get(b"unstall.prep.skipped")
    return list(json.loads(raw)) if raw else []


def tensor_batch(images: np.ndarray, labels: np.ndarray, ids: np.ndarray) -> pa.RecordBatch:
    """A prepared batch (the sidecar's own schema) from ``[n, *shape]`` images: what members upload."""
    x = np.ascontiguousarray(images)
    n = x.shape[0]
    width = x.nbytes // max(1, n)
    tensor = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), n, [None, pa.py_buffer(x)])
    schema = pa.schema(
        [pa.field("id", pa.int64(), nullable=False), pa.field("label", pa.int64()),
         pa.field("tensor", pa.binary(width), nullable=False)],
        metadata={"unstall.schema": "1", "unstall.prep.shape": json.dumps(list(x.shape[1:])),
                  "unstall.prep.dtype": x.dtype.name, "unstall.prep.layout": "user"})
    return pa.RecordBatch.from_arrays(
        [pa.array(np.asarray(ids, dtype=np.int64)), pa.array(np.asarray(labels, dtype=np.int64)), tensor],
        schema=schema)
