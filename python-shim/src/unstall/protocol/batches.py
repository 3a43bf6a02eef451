"""Fetched batches: the v1 batch schema and its check, ``SampleBatch`` (a batch whatever the transport), and
prepared batches (protocol/README.md, "Prepared-batch schema"), and the prep actions' bodies."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ProtocolMismatchError
from .tickets import PROTOCOL_VERSION, PrepRates


__all__ = [
    "SCHEMA_VERSION_KEY",
    "BATCH_SCHEMA",
    "check_batch",
    "SampleBatch",
    "numpy_dtype",
    "batch_to_numpy",
    "skipped_of",
    "tensor_batch",
    "binary_offsets",
    "VouchedHeader",
    "PayloadBatch",
    "batch_payloads",
    "PrepSlot",
    "parse_prep_slot",
    "encode_prep_next",
    "PrepJoin",
    "encode_prep_join",
    "parse_prep_join_reply",
]

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
        offsets = binary_offsets(payload)
        data_buf = payload.buffers()[2]
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


def binary_offsets(column: pa.Array) -> np.ndarray:
    """The ``len(column) + 1`` offsets of a binary (or large binary) column into its data buffer, a view of its
    offsets buffer: row ``i`` is bytes ``offsets[i]`` to ``offsets[i + 1]`` of ``column.buffers()[2]``."""
    n = len(column)
    if not n:
        return np.zeros(1, np.int64)
    width = 8 if pa.types.is_large_binary(column.type) else 4
    return np.frombuffer(column.buffers()[1], dtype=f"<i{width}", count=n + 1, offset=column.offset * width)


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


# ---------------------------------------------------------------------------------------------
# Raw and hybrid batches of a prep group, over Flight or shared memory (protocol/README.md, "Zero copy")


class VouchedHeader(NamedTuple):
    """The header of a JPEG the sidecar vouches for (protocol/README.md, "Vouched headers"): its bytes pass the
    sidecar's header rules (``ImageHeader``; ``prep.jpeg_rules`` on this side) and libjpeg takes them. Its size, and
    for a Motion-JPEG frame the standard Huffman tables' slots it relies on and where its first scan's marker starts
    (``jpeg_rules.JpegCheck``'s ``standard_tables`` and ``first_scan``; 0 and 0 for other JPEGs). A raw or hybrid
    batch carries one per row packed in an int64, -1 where the sidecar vouches for none."""

    width: int
    height: int
    standard_tables: int
    first_scan: int

    def packed(self) -> int:
        """The int64 a batch carries: ``width | height << 16 | standard_tables << 32 | first_scan << 40``."""
        return self.width | self.height << 16 | self.standard_tables << 32 | self.first_scan << 40

    @staticmethod
    def unpack(value: int) -> Optional[VouchedHeader]:
        """The header a batch's ``value`` packs, None for -1 (none)."""
        if value < 0:
            return None
        return VouchedHeader(value & 0xFFFF, value >> 16 & 0xFFFF, value >> 32 & 0xFF, value >> 40)

    @staticmethod
    def unpack_all(values: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The fields of a batch's packed ``values`` (none: -1) as int64 arrays, in the fields' order (``unpack`` a
        row at a time)."""
        v = np.asarray(values, dtype=np.int64)
        return v & 0xFFFF, v >> 16 & 0xFFFF, v >> 32 & 0xFF, v >> 40


class PayloadBatch(NamedTuple):
    """A raw (or hybrid) prep batch's payloads without a copy: row ``i`` is ``data[offsets[i]:offsets[i + 1]]``,
    ``data`` a read-only view of the Flight batch's buffer or of the group's /dev/shm slot. ``prepared`` (a hybrid
    group's; None for a raw one): rows whose payload is the sidecar's uint8 HWC pixels, not the stored bytes.
    ``headers``: each row's :class:`VouchedHeader`, packed, -1 where the sidecar vouches for none; None from a
    sidecar that sends none."""

    data: np.ndarray  # uint8
    offsets: np.ndarray  # rows + 1 integers
    ids: np.ndarray  # int64
    labels: np.ndarray  # int64, -1 where a sample has none
    keys: list[str]
    prepared: Optional[np.ndarray]  # bool
    headers: Optional[np.ndarray] = None  # int64

    def row_bytes(self) -> list[bytes]:
        """Each row's payload as bytes of its own (a copy: for a caller that keeps them past the batch)."""
        return [self.data[a:b].tobytes() for a, b in zip(self.offsets[:-1], self.offsets[1:])]


def batch_payloads(batch: pa.RecordBatch) -> PayloadBatch:
    """A raw or hybrid prep batch received over Flight, as views of its buffers; raises ProtocolMismatchError when
    its ``header`` column is not packed headers."""
    payload = batch.column("payload")
    data_buf = payload.buffers()[2]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.empty(0, np.uint8)
    names = batch.schema.names
    prepared = batch.column("prepared").to_numpy(zero_copy_only=False) if "prepared" in names else None
    return PayloadBatch(data, binary_offsets(payload), batch.column("id").to_numpy(zero_copy_only=False),
                        pc.fill_null(batch.column("label"), -1).to_numpy(zero_copy_only=False),
                        batch.column("key").to_pylist(), prepared,
                        _header_column(batch.column("header")) if "header" in names else None)


def _header_column(column: pa.Array) -> np.ndarray:
    """A Flight batch's ``header`` column as int64, -1 for null."""
    if column.type != pa.int64():
        raise ProtocolMismatchError(f"raw batch column 'header' has type {column.type}, expected int64")
    lowest = pc.min(column).as_py()
    if lowest is not None and lowest < 0:
        raise ProtocolMismatchError(f"raw batch column 'header' holds {lowest}: a packed header is not negative")
    return pc.fill_null(column, -1).to_numpy(zero_copy_only=False)


def _headers(values: Any, rows: int) -> np.ndarray:
    """``prep.next``'s ``headers`` as int64, -1 for null; ProtocolMismatchError naming what is wrong."""
    if not isinstance(values, list) or len(values) != rows:
        got = f"{len(values)} headers" if isinstance(values, list) else repr(values)[:40]
        raise ProtocolMismatchError(f"prep.next: {rows} rows need as many headers, got {got}")
    for v in values:
        if v is not None and (type(v) is not int or not 0 <= v < 1 << 63):
            raise ProtocolMismatchError(f"prep.next: a header is a packed non-negative int64 or null, got {v!r}")
    return np.array([-1 if v is None else v for v in values], dtype=np.int64)


def encode_prep_next(group: str, member: int, epoch: int, batch: int,
                     released: Optional[Sequence[Sequence[int]]] = None, rates: Optional[PrepRates] = None) -> bytes:
    """A ``prep.next`` body (UTF-8 JSON): the batch asked for, the batches whose views are gone (``released``), and
    a hybrid member's ``rates`` (``fixtures/prep-next-rates-v1.json``)."""
    body: dict[str, Any] = {"group": group, "member": member, "epoch": epoch, "batch": batch}
    if released is not None:
        body["released"] = [list(r) for r in released]
    if rates is not None:
        body["rates"] = dataclasses.asdict(rates)
    return json.dumps(body).encode()


@dataclass(frozen=True)
class PrepSlot:
    """A ``prep.next`` answer: the batch's rows in the /dev/shm slot file ``path``, mapped read-only. A prepared
    batch is ``[rows, *shape]`` of ``dtype`` at the start of the file; a raw or hybrid batch is its payloads from the
    start of the file, row ``i`` at bytes ``offsets[i]`` to ``offsets[i + 1]``, with ``keys``, ``headers`` (as
    :class:`PayloadBatch`'s) and (hybrid) ``prepared``. ``skipped``: the samples the group left out of it (decode
    ``on_error="skip"``)."""

    path: str
    ids: np.ndarray  # int64
    labels: np.ndarray  # int64, -1 where a sample has none
    skipped: list[dict[str, Any]]
    shape: Optional[Tuple[int, ...]] = None  # a prepared batch's sample shape and element type
    dtype: Optional[np.dtype] = None
    offsets: Optional[np.ndarray] = None  # a raw or hybrid batch's: rows + 1 int64
    keys: Optional[list[str]] = None
    prepared: Optional[np.ndarray] = None  # bool
    headers: Optional[np.ndarray] = None  # int64, packed VouchedHeaders, -1 for none; None: not sent

    @property
    def rows(self) -> int:
        return len(self.ids)


def parse_prep_slot(doc: Mapping[str, Any]) -> PrepSlot:
    """Parses a ``prep.next`` answer; raises ProtocolMismatchError naming what does not hold."""
    if doc.get("v") != PROTOCOL_VERSION:
        raise ProtocolMismatchError(f"prep.next: unsupported version {doc.get('v')!r}")
    try:
        rows = int(doc["rows"])
        ids = np.asarray(doc["ids"], dtype=np.int64).reshape(-1)
        labels = np.asarray(doc["labels"], dtype=np.int64).reshape(-1)
        slot = PrepSlot(str(doc["path"]), ids, labels, list(doc.get("skipped", ())))
        if rows != len(ids) or rows != len(labels):
            raise ValueError(f"{rows} rows with {len(ids)} ids and {len(labels)} labels")
        if "shape" in doc:
            return dataclasses.replace(slot, shape=tuple(int(v) for v in doc["shape"]),
                                       dtype=numpy_dtype(str(doc["dtype"])))
        offsets = np.asarray(doc["offsets"], dtype=np.int64).reshape(-1)
        keys = [str(k) for k in doc["keys"]]
        prepared = np.asarray(doc["prepared"], dtype=bool).reshape(-1) if "prepared" in doc else None
    except (KeyError, TypeError, ValueError) as e:
        raise ProtocolMismatchError(f"prep.next: malformed answer: {e!r}") from None
    if len(offsets) != rows + 1 or offsets[0] != 0 or np.any(np.diff(offsets) < 0):
        raise ProtocolMismatchError(f"prep.next: {rows} rows need {rows + 1} non-decreasing offsets from 0, got "
                                    f"{offsets.tolist()[:8]}")
    if len(keys) != rows or (prepared is not None and len(prepared) != rows):
        raise ProtocolMismatchError(f"prep.next: {rows} rows with {len(keys)} keys"
                                    + ("" if prepared is None else f" and {len(prepared)} prepared flags"))
    headers = _headers(doc["headers"], rows) if "headers" in doc else None
    return dataclasses.replace(slot, offsets=offsets, keys=keys, prepared=prepared, headers=headers)


@dataclass(frozen=True)
class PrepJoin:
    """A ``prep.join`` body (``fixtures/prep-join-v1.json``): the group a member joins (``dataset``, ``pipeline``:
    its JSON, None for raw batches; ``batch_size``, ``seed``, ``shuffle``, ``drop_last``, ``order``, ``hybrid``), the
    settings its first joiner gives the group, and where this member starts. A field left None is not sent: the
    sidecar's default applies."""

    dataset: str
    pipeline: Optional[Mapping[str, Any]]
    batch_size: int
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    group_size: int = 1
    join_timeout_s: float = 60.0
    member_timeout_s: float = 30.0
    name: str = ""
    window: Optional[int] = None
    autotune: Optional[bool] = None  # False: keep the group's prep threads and window where they are
    staging_bytes: Optional[int] = None
    compression: Optional[str] = None
    share: Optional[Mapping[str, Any]] = None
    hybrid: Optional[Mapping[str, Any]] = None
    order: Optional[Mapping[str, Any]] = None
    cache_snapshot: Optional[str] = None
    epochs: Optional[int] = None
    start_epoch: Optional[int] = None
    start_batch: Optional[int] = None
    shm: Optional[bool] = None


def encode_prep_join(join: PrepJoin) -> bytes:
    """A ``prep.join`` body (UTF-8 JSON), its fields in the declared order, those left None omitted."""
    body: dict[str, Any] = {"v": PROTOCOL_VERSION}
    for f in dataclasses.fields(join):
        v = getattr(join, f.name)
        if v is not None or f.name == "pipeline":
            body[f.name] = dict(v) if isinstance(v, Mapping) else v
    return json.dumps(body).encode()


def parse_prep_join_reply(results: Sequence[bytes]) -> dict[str, Any]:
    """A ``prep.join`` answer: the group, this member's number and where its epochs start; raises
    ProtocolMismatchError when it is not one v1 document."""
    if len(results) != 1:
        raise ProtocolMismatchError(f"prep.join returned {len(results)} results, expected 1")
    info = json.loads(results[0])
    if not isinstance(info, dict) or info.get("v") != PROTOCOL_VERSION:
        raise ProtocolMismatchError(f"prep.join: unsupported version {info.get('v') if isinstance(info, dict) else info!r}")
    return info
