"""The local socket (UNSL, version 1): frame bodies, both directions."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from .documents import _loads
from .tickets import _U64_MAX, MAX_IDS, _epoch_and_ids


__all__ = [
    "LOCAL_MAGIC",
    "LOCAL_VERSION",
    "LOCAL_MAX_FRAME",
    "LOCAL_FRAME",
    "LOCAL_HELLO",
    "LOCAL_OPEN",
    "LOCAL_FETCH",
    "LOCAL_PLAN",
    "LOCAL_CLOSE",
    "LOCAL_PREP",
    "LOCAL_CACHED",
    "LOCAL_MAX_ACTION_TYPE",
    "LOCAL_MAX_PLAN_IDS",
    "REPLY_OK",
    "REPLY_ERROR",
    "REPLY_BATCH",
    "LOCAL_ERROR_CODES",
    "LocalRequest",
    "LocalOk",
    "LocalError",
    "LocalBatch",
    "encode_frame",
    "encode_local_hello",
    "encode_local_open",
    "encode_local_fetch",
    "encode_local_plan",
    "encode_local_close",
    "encode_local_prep",
    "encode_local_cached",
    "decode_local_request",
    "encode_local_ok",
    "encode_local_error",
    "encode_local_batch",
    "decode_local_reply",
]


# ---------------------------------------------------------------------------------------------
# The local socket (UNSL, version 1): frame bodies, both directions

LOCAL_MAGIC = b"UNSL"
LOCAL_VERSION = 1
LOCAL_MAX_FRAME = 256 << 20
LOCAL_FRAME = struct.Struct("<I")  # every frame: u32 length of the body, then the body
LOCAL_HELLO, LOCAL_OPEN, LOCAL_FETCH, LOCAL_PLAN, LOCAL_CLOSE, LOCAL_PREP, LOCAL_CACHED = 1, 2, 3, 4, 5, 6, 7
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
_LOCAL_SESSION = struct.Struct("<BQ")  # kind, session (CLOSE, CACHED)
_LOCAL_HELLO = struct.Struct("<B4sBH")  # kind, magic, version, token length
_LOCAL_BATCH = struct.Struct("<B3xIII")  # kind, pad, n, nseg, keyBytes
_LOCAL_PREP = struct.Struct("<BH")  # kind, action type length (PREP)
_LOCAL_NAMES = {LOCAL_HELLO: "HELLO", LOCAL_OPEN: "OPEN", LOCAL_FETCH: "FETCH", LOCAL_PLAN: "PLAN", LOCAL_CLOSE: "CLOSE",
                LOCAL_PREP: "PREP", LOCAL_CACHED: "CACHED"}


@dataclass(frozen=True)
class LocalRequest:
    """A decoded request body (what the sidecar parses; the shim's tests and fakes use it)."""

    kind: int
    token: Optional[bytes] = None  # HELLO
    doc: Optional[dict[str, Any]] = None  # OPEN
    session: Optional[int] = None  # FETCH, PLAN, CLOSE, CACHED
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


def encode_local_cached(session: int) -> bytes:
    """CACHED: ``u8 7, u64 session``: which samples of the session's dataset are cached now; the reply is OK with
    the ``cached`` document (``unstall.protocol.parse_cached``), as the Flight action answers it."""
    return _LOCAL_SESSION.pack(LOCAL_CACHED, _u64(session, "session"))


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
    if kind in (LOCAL_CLOSE, LOCAL_CACHED):
        _expect_size(buf, _LOCAL_SESSION.size, _LOCAL_NAMES[kind])
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
