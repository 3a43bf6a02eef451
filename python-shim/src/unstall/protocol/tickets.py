"""Tickets (protocol/README.md): FETCH, PLAN and PREP, the binary bodies of DoGet tickets and plan actions."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import numpy as np



__all__ = [
    "PROTOCOL_VERSION",
    "TICKET_MAGIC",
    "KIND_FETCH",
    "KIND_PLAN",
    "KIND_PREP",
    "KIND_PEER",
    "MAX_NAME_BYTES",
    "MAX_IDS",
    "MAX_PLAN_IDS",
    "FetchTicket",
    "Plan",
    "encode_fetch_ticket",
    "encode_plan",
    "decode_ticket",
    "decode_plan",
    "PrepTicket",
    "PrepRates",
    "encode_prep_ticket",
    "decode_prep_ticket",
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
# a PREP ticket's optional rates, after the batch index: decode_s_per_sample, step_s
_PREP_RATES = struct.Struct("<dd")


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
class PrepRates:
    """A hybrid member's measured rates, sent with its ``prep.next`` or in its PREP tickets (optional: an older
    member sends none): its device's decode seconds per sample it decodes and its training step in seconds, both
    finite and positive (the sidecar refuses others, naming the field)."""

    decode_s_per_sample: float
    step_s: float


def _rates_problem(decode_s_per_sample: float, step_s: float) -> Optional[tuple[int, str]]:
    """The first rate that is not finite positive seconds: (its index, the sidecar's message for it), or None."""
    for i, (name, v) in enumerate((("decode_s_per_sample", decode_s_per_sample), ("step_s", step_s))):
        if not (math.isfinite(v) and v > 0):
            return i, f"rates.{name} (seconds, a positive number) is required, got {v!r}"
    return None


@dataclass(frozen=True)
class PrepTicket:
    """A PREP ticket: one batch of a coordinated prep group, for one member; a hybrid member's ``rates`` ride
    along (the optional tail)."""

    group: str
    member: int
    epoch: int
    batch: int
    rates: Optional[PrepRates] = None

    def encode(self) -> bytes:
        return encode_prep_ticket(self.group, self.member, self.epoch, self.batch, self.rates)


def encode_prep_ticket(group: str, member: int, epoch: int, batch: int, rates: Optional[PrepRates] = None) -> bytes:
    """A PREP ticket: ``UNST``, version 1, kind 3, u16 group length, group, u64 member, u32 epoch, u32 batch, and
    with ``rates`` f64 decode_s_per_sample, f64 step_s."""
    name = group.encode("utf-8")
    if not 1 <= len(name) <= MAX_NAME_BYTES:
        raise ValueError(f"group id must be 1..{MAX_NAME_BYTES} UTF-8 bytes, got {len(name)}")
    for what, v, hi in (("member", member, 2**64 - 1), ("epoch", epoch, 2**32 - 1), ("batch", batch, 2**32 - 1)):
        if not 0 <= int(v) <= hi:
            raise ValueError(f"{what} {v} is outside 0..{hi}")
    tail = b""
    if rates is not None:
        problem = _rates_problem(rates.decode_s_per_sample, rates.step_s)
        if problem is not None:
            raise ValueError(problem[1])
        tail = _PREP_RATES.pack(rates.decode_s_per_sample, rates.step_s)
    return (_HEADER.pack(TICKET_MAGIC, PROTOCOL_VERSION, KIND_PREP, len(name)) + name
            + _PREP_TAIL.pack(member, epoch, batch) + tail)


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
    tail = len(buf) - expected
    if 0 < tail < _PREP_RATES.size:
        raise ValueError(
            f"malformed ticket: truncated at byte {len(buf)}: the rates after the batch index are {_PREP_RATES.size} "
            f"bytes (two f64), {tail} present"
        )
    if tail > _PREP_RATES.size:
        extra = tail - _PREP_RATES.size
        raise ValueError(
            f"malformed ticket: {extra} trailing byte{'s' if extra != 1 else ''} after the rates, at byte "
            f"{expected + _PREP_RATES.size}"
        )
    try:
        group = buf[_HEADER.size : _HEADER.size + name_len].decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"malformed ticket: group id is not UTF-8 ({e.reason})") from None
    member, epoch, batch = _PREP_TAIL.unpack_from(buf, _HEADER.size + name_len)
    rates = None
    if tail:
        decode_s, step_s = _PREP_RATES.unpack_from(buf, expected)
        problem = _rates_problem(decode_s, step_s)
        if problem is not None:
            raise ValueError(f"malformed ticket: at byte {expected + 8 * problem[0]}: {problem[1]}")
        rates = PrepRates(decode_s, step_s)
    return PrepTicket(group=group, member=member, epoch=epoch, batch=batch, rates=rates)


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
