"""The decoded-batch hand-over between the members of a prep group on one host (``unstall.prep.decode_share``):
one JSON message per request, from the member that decoded the batch to the one that asked (protocol/README.md,
"Decoded-batch hand-over"). Python on both ends; pinned by protocol/fixtures/handover-v1.json."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any, Optional, Tuple

from ..errors import ProtocolMismatchError

__all__ = ["HANDOVER_VERSION", "Handover", "CudaHandle", "encode_handover", "parse_handover"]

HANDOVER_VERSION = 1


@dataclass(frozen=True)
class CudaHandle:
    """What ``torch.multiprocessing.reductions.reduce_tensor`` gives for a CUDA tensor's storage (the device index
    left out: the receiver maps it on its own index of the same device): the allocation's IPC handle and the
    storage's place in it, the reference counter's shared-memory file and offset, the event's IPC handle."""

    handle: bytes
    storage_bytes: int
    storage_offset_bytes: int
    ref_counter: bytes
    ref_counter_offset: int
    event: bytes
    event_sync: bool


@dataclass(frozen=True)
class Handover:
    """A hand-over answer. ``ok`` False: the member that decoded the batch cannot hand it (it failed, dropped it,
    or keeps no copies yet); the asker decodes it. Else ``ids`` (the batch's sample ids, which the asker checks
    against its own), the tensor's ``dtype`` (torch's name, e.g. ``"torch.bfloat16"``), ``size``, ``stride`` and
    ``offset`` (elements, in its storage), and either ``cuda`` (a CUDA IPC handle) or ``storage_bytes`` (a CPU
    tensor: its shared-memory file descriptor travels beside the message, SCM_RIGHTS)."""

    ok: bool
    ids: list[int] = field(default_factory=list)
    dtype: str = ""
    size: Tuple[int, ...] = ()
    stride: Tuple[int, ...] = ()
    offset: int = 0
    storage_bytes: Optional[int] = None
    cuda: Optional[CudaHandle] = None


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def encode_handover(h: Handover) -> bytes:
    """The message for ``h`` (UTF-8 JSON)."""
    if not h.ok:
        return json.dumps({"v": HANDOVER_VERSION, "ok": False}).encode()
    doc: dict[str, Any] = {"v": HANDOVER_VERSION, "ok": True, "ids": list(h.ids), "dtype": h.dtype,
                           "size": list(h.size), "stride": list(h.stride), "offset": h.offset}
    if h.cuda is not None:
        c = h.cuda
        doc["cuda"] = {"handle": _b64(c.handle), "storage_bytes": c.storage_bytes,
                       "storage_offset_bytes": c.storage_offset_bytes, "ref_counter": _b64(c.ref_counter),
                       "ref_counter_offset": c.ref_counter_offset, "event": _b64(c.event), "event_sync": c.event_sync}
    else:
        doc["storage_bytes"] = h.storage_bytes
    return json.dumps(doc).encode()


def parse_handover(data: bytes) -> Handover:
    """Parses a hand-over message; raises ProtocolMismatchError naming what does not hold (another version, a
    field missing or of the wrong type)."""
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise ProtocolMismatchError(f"decoded-batch hand-over: not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("v") != HANDOVER_VERSION:
        got = doc.get("v") if isinstance(doc, dict) else type(doc).__name__
        raise ProtocolMismatchError(f"decoded-batch hand-over: version {got!r}, this member speaks "
                                    f"{HANDOVER_VERSION}")
    if not doc.get("ok"):
        return Handover(False)
    try:
        cuda = None
        if "cuda" in doc:
            c = doc["cuda"]
            cuda = CudaHandle(base64.b64decode(c["handle"]), int(c["storage_bytes"]), int(c["storage_offset_bytes"]),
                              base64.b64decode(c["ref_counter"]), int(c["ref_counter_offset"]),
                              base64.b64decode(c["event"]), bool(c["event_sync"]))
        h = Handover(True, [int(i) for i in doc["ids"]], str(doc["dtype"]), tuple(int(v) for v in doc["size"]),
                     tuple(int(v) for v in doc["stride"]), int(doc["offset"]),
                     None if cuda is not None else int(doc["storage_bytes"]), cuda)
    except (KeyError, TypeError, ValueError) as e:
        raise ProtocolMismatchError(f"decoded-batch hand-over: malformed message: {e!r}") from None
    if len(h.size) != len(h.stride) or not h.dtype.startswith("torch."):
        raise ProtocolMismatchError(f"decoded-batch hand-over: size {list(h.size)}, stride {list(h.stride)}, "
                                    f"dtype {h.dtype!r} do not describe a tensor")
    return h
