"""Coordinated prep: the sidecar decodes and augments each batch once for a whole group of jobs.

Jobs of a hyper-parameter search that declare the same dataset, pipeline, seed, batch size, shuffle
and drop_last join one group (``prep.join``); the sidecar prepares every batch once, with a pool of
native prep threads, keeps it until every member has read it, and frees it. See docs/PREP.md.

>>> from unstall import prep
>>> pipe = prep.imagenet_train(224)
>>> with prep.PrepLoader("imgs", pipe, batch_size=64, seed=0, group_size=4) as loader:
...     for epoch in range(3):
...         for images, labels in loader:  # torch tensors, [64, 3, 224, 224] float32
...             ...

``PrepLoader`` needs torch; ``Membership`` and the pipeline builders need only pyarrow and numpy.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Tuple, TypeVar, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl

from .client import FlightClient
from .echo import Echo
from .local import LocalClient
from .recovery import call_with_recovery
from .shm_slots import SlotMaps
from .errors import PrepGroupNotFoundError, ProtocolMismatchError, SidecarError, SidecarUnavailableError
from .protocol import KIND_PREP, PROTOCOL_VERSION, encode_prep_ticket
from .state import STATE_VERSION, CountingIterator, Progress, check_state, position, state_int

__all__ = [
    "KIND_PREP",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "Pipeline",
    "decode",
    "random_resized_crop",
    "resize",
    "center_crop",
    "hflip",
    "normalize",
    "imagenet_train",
    "imagenet_eval",
    "encode_prep_ticket",
    "batch_to_numpy",
    "skipped_of",
    "with_on_error",
    "Membership",
    "join",
    "PrepLoader",
    "SharedTransformLoader",
    "device_pipeline",
]

log = logging.getLogger("unstall")
T = TypeVar("T")

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# ---------------------------------------------------------------------------------------------
# Pipelines: plain JSON documents (protocol/README.md, "Prep pipelines")


ON_ERROR = ("raise", "skip")


def decode(
    *,
    formats: Optional[Sequence[str]] = None,
    max_pixels: Optional[int] = None,
    max_aspect_ratio: Optional[float] = None,
    on_error: Optional[str] = None,
) -> dict[str, Any]:
    """Image bytes to an RGB image (must be the first op).

    The sidecar reads each header before decoding and refuses what breaks these rules (docs/ARCHITECTURE.md,
    "Hardened decoding"): ``formats`` the pipeline accepts, by magic bytes (default ``("jpeg", "png")``;
    ``"webp"`` too), ``max_pixels`` (default: the sidecar's ``--max-decode-pixels``, 89,478,485 like PIL's
    ``Image.MAX_IMAGE_PIXELS``), ``max_aspect_ratio`` (longer side / shorter side; default the sidecar's
    ``--max-decode-aspect-ratio``, 100). ``on_error``: ``"raise"`` (default; the batch fails with an error
    naming the sample) or ``"skip"`` (the sample is left out of its batch and counted).
    """
    op: dict[str, Any] = {"op": "decode"}
    if formats is not None:
        op["formats"] = [str(f) for f in formats]
    if max_pixels is not None:
        op["max_pixels"] = int(max_pixels)
    if max_aspect_ratio is not None:
        op["max_aspect_ratio"] = float(max_aspect_ratio)
    if on_error is not None:
        op["on_error"] = _check_on_error(on_error)
    return op


def _check_on_error(on_error: str) -> str:
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    return on_error


def random_resized_crop(
    size: Union[int, Sequence[int]],
    scale: Tuple[float, float] = (0.08, 1.0),
    ratio: Tuple[float, float] = (3 / 4, 4 / 3),
) -> dict[str, Any]:
    """torchvision's ``RandomResizedCrop`` (same parameter sampling)."""
    return {"op": "random_resized_crop", "size": _size(size), "scale": list(scale), "ratio": list(ratio)}


def resize(size: Union[int, Sequence[int]]) -> dict[str, Any]:
    """One int: the shorter side becomes ``size`` (aspect kept); ``[h, w]``: exactly that."""
    return {"op": "resize", "size": size if isinstance(size, int) else list(size)}


def center_crop(size: Union[int, Sequence[int]]) -> dict[str, Any]:
    return {"op": "center_crop", "size": _size(size)}


def hflip(p: float = 0.5) -> dict[str, Any]:
    return {"op": "hflip", "p": float(p)}


def normalize(mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> dict[str, Any]:
    """``(x / 255 - mean) / std`` per RGB channel (float outputs: float32, float16, bfloat16)."""
    return {"op": "normalize", "mean": [float(m) for m in mean], "std": [float(s) for s in std]}


def _size(size: Union[int, Sequence[int]]) -> list[int]:
    if isinstance(size, int):
        return [size, size]
    s = [int(v) for v in size]
    if len(s) != 2:
        raise ValueError(f"size must be an int or (height, width), got {size!r}")
    return s


DTYPES = ("float32", "uint8", "float16", "bfloat16")


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a prepared tensor's elements (little-endian); bfloat16, which numpy lacks, as its raw
    uint16 bits (``to_torch`` views them as ``torch.bfloat16``)."""
    return np.dtype("uint16" if name == "bfloat16" else name).newbyteorder("<")


def to_torch(arr: np.ndarray, dtype: Optional[str]) -> Any:
    """``torch.from_numpy(arr)``, viewed as ``torch.bfloat16`` for bfloat16 tensors."""
    import torch

    t = torch.from_numpy(arr)
    return t.view(torch.bfloat16) if dtype == "bfloat16" else t


@dataclass(frozen=True)
class Pipeline:
    """A declarative prep pipeline; the sidecar validates it and names the op and field at fault."""

    ops: Tuple[Mapping[str, Any], ...]
    layout: str = "NCHW"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", tuple(dict(o) for o in self.ops))
        if self.layout not in ("NCHW", "NHWC"):
            raise ValueError(f"layout must be 'NCHW' or 'NHWC', got {self.layout!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")

    def to_json(self) -> dict[str, Any]:
        return {"ops": [dict(o) for o in self.ops], "layout": self.layout, "dtype": self.dtype}


def imagenet_train(size: int = 224, *, layout: str = "NCHW", dtype: str = "float32",
                   on_error: Optional[str] = None) -> Pipeline:
    """The common training recipe: decode, random-resized-crop, flip, normalize."""
    ops = [decode(on_error=on_error), random_resized_crop(size), hflip()]
    if dtype != "uint8":
        ops.append(normalize())
    return Pipeline(tuple(ops), layout=layout, dtype=dtype)


def imagenet_eval(size: int = 224, resize_to: int = 256, *, layout: str = "NCHW",
                  on_error: Optional[str] = None) -> Pipeline:
    """The evaluation recipe: decode, resize the shorter side, center-crop, normalize."""
    return Pipeline((decode(on_error=on_error), resize(resize_to), center_crop(size), normalize()), layout=layout)


def with_on_error(pipeline: Union[Pipeline, Mapping[str, Any], None], on_error: str) -> dict[str, Any]:
    """The pipeline's JSON with its decode op's ``on_error`` set (``join(..., on_error=)`` uses it)."""
    _check_on_error(on_error)
    doc = pipeline.to_json() if isinstance(pipeline, Pipeline) else dict(pipeline) if pipeline is not None else None
    ops = doc.get("ops") if doc is not None else None
    if not isinstance(ops, (list, tuple)) or not ops or not isinstance(ops[0], Mapping) or ops[0].get("op") != "decode":
        raise ValueError("on_error applies to a sidecar pipeline's decode op (its first); this pipeline has none: "
                         f"{pipeline!r}")
    first = dict(ops[0])
    if first.get("on_error", on_error) != on_error:
        raise ValueError(f"on_error={on_error!r} contradicts the pipeline's decode op, which says "
                         f"{first['on_error']!r}")
    first["on_error"] = on_error
    return dict(doc, ops=[first, *[dict(o) for o in ops[1:]]])


# ---------------------------------------------------------------------------------------------
# Wire


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


# ---------------------------------------------------------------------------------------------
# Membership of a group


@dataclass
class Membership:
    """This job's place in a prep group: read batch ``b`` of epoch ``e`` with :meth:`batch`.

    A daemon thread heartbeats so that long training steps do not get the member dropped; a member
    that stops (crash, kill) is dropped by the sidecar after ``member_timeout`` seconds, and the
    others go on. Leave with :meth:`leave` (or a ``with`` block); reading all declared ``epochs``
    leaves by itself.
    """

    client: FlightClient
    dataset: str
    info: dict[str, Any]
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: Optional[threading.Thread] = field(default=None, repr=False)
    dropped: Optional[str] = None
    # prep.join's body, to join again at the batch in hand after the sidecar restarted (its groups died with it)
    _join_body: Optional[dict[str, Any]] = field(default=None, repr=False)
    rejoins: int = 0  # times this member joined a restarted sidecar's new group
    # Samples the group left out of the batches this member read (decode on_error="skip"), in reading order:
    # {"epoch", "batch", "id", "key", "reason"} each.
    skipped: list[dict[str, Any]] = field(default_factory=list)
    _warned: set[int] = field(default_factory=set, repr=False)
    _slots: SlotMaps = field(default_factory=SlotMaps, repr=False)  # shared memory: the group's slot files
    # shared memory: prep.next goes over the sidecar's local socket (the join reply's "local"), not gRPC
    _local: Optional[LocalClient] = field(default=None, repr=False)
    _local_refused: Optional[str] = field(default=None, repr=False)  # a socket that did not take a connection

    @property
    def group(self) -> str:
        return str(self.info["group"])

    @property
    def member(self) -> int:
        return int(self.info["member"])

    @property
    def start_epoch(self) -> int:
        """The first epoch this member reads (later than 0 for a late joiner: docs/PREP.md)."""
        return int(self.info["start_epoch"])

    @property
    def start_batch(self) -> int:
        """The first batch of ``start_epoch`` this member reads (later than 0 for a resumed member)."""
        return int(self.info.get("start_batch", 0))

    @property
    def num_batches(self) -> int:
        return int(self.info["num_batches"])

    def first_batch(self, epoch: int) -> int:
        """The first batch of ``epoch`` this member reads: ``start_batch`` in its first epoch, else 0."""
        return self.start_batch if epoch == self.start_epoch else 0

    @property
    def shape(self) -> Optional[Tuple[int, ...]]:
        s = self.info.get("shape")
        return tuple(int(v) for v in s) if s is not None else None

    @property
    def dtype(self) -> Optional[str]:
        return self.info.get("dtype")

    @property
    def shm(self) -> bool:
        """True when batches come as /dev/shm files mapped here (members on the sidecar's host)."""
        return bool(self.info.get("shm"))

    def _start_heartbeat(self) -> None:
        period = max(0.1, float(self.info.get("member_timeout_s", 30)) / 3)

        def beat() -> None:
            while not self._stop.wait(period):
                body = json.dumps({"group": self.group, "member": self.member}).encode()
                try:
                    self.client.do_action("prep.heartbeat", body, recover=False)
                except SidecarUnavailableError:
                    continue  # a sidecar fault: the next batch joins the restarted sidecar again
                except PrepGroupNotFoundError:
                    if self._join_body is not None and self.client.rediscovery is not None:
                        continue  # the group died with its sidecar; the next batch joins again
                    self.dropped = "the group is gone"
                    return
                except SidecarError as e:
                    self.dropped = str(e)
                    return

        self._thread = threading.Thread(target=beat, name=f"unstall-prep-heartbeat-{self.member}", daemon=True)
        self._thread.start()

    def _at(self, epoch: int, index: int, attempt: Callable[[], T]) -> T:
        """``attempt()`` for batch ``index`` of ``epoch``. After a sidecar fault, once the client found the
        sidecar again (restarted: its groups died with it), this member joins a group there again at this very
        batch and asks again: the batch is prepared again from the same seed, so no sample is lost or repeated."""
        if self._join_body is None:
            return attempt()
        return call_with_recovery(self.client, attempt, lambda: self._rejoin(epoch, index))

    def _rejoin(self, epoch: int, index: int) -> None:
        assert self._join_body is not None
        body = dict(self._join_body, start_epoch=epoch, start_batch=index)
        if "epochs" in body:  # counted from the first join's start: what is left of them from here
            body["epochs"] = int(self._join_body["epochs"]) - (epoch - int(self._join_body["start_epoch"]))
        # with recovery: the dataset may not be registered on the restarted sidecar yet (its owner does that)
        info = _join_reply(self.client.do_action("prep.join", json.dumps(body).encode()), body.get("epochs"))
        log.info("unstall: prep member %s joined the restarted sidecar's group %s at epoch %d batch %d",
                 self.member, info["group"], epoch, index)
        self.info = info
        self.rejoins += 1

    def batch(self, epoch: int, index: int) -> pa.RecordBatch:
        """One DoGet: waits until the group has prepared the batch, then receives it. Samples the group skipped
        (decode ``on_error="skip"``) are not rows of it: they are added to :attr:`skipped`."""
        rb = self._at(epoch, index, lambda: self._batch(epoch, index))
        self._note_skipped(epoch, index, skipped_of(rb))
        return rb

    def _note_skipped(self, epoch: int, index: int, skipped: Sequence[Mapping[str, Any]]) -> None:
        for s in skipped:
            entry = {"epoch": epoch, "batch": index, **s}
            self.skipped.append(entry)
            if int(s["id"]) not in self._warned:  # every epoch skips it again: warn once
                self._warned.add(int(s["id"]))
                log.warning("unstall: prep skipped sample %s (%r) of dataset %r (on_error='skip'): %s",
                            s["id"], s.get("key"), self.dataset, s.get("reason"))

    def _batch(self, epoch: int, index: int) -> pa.RecordBatch:
        ticket = fl.Ticket(encode_prep_ticket(self.group, self.member, epoch, index))
        table = self.client._rpc(lambda conn, options: conn.do_get(ticket, options).read_all(), recover=False)
        batches = table.combine_chunks().to_batches()
        if len(batches) != 1:
            raise ProtocolMismatchError(f"expected one record batch, got {len(batches)}")
        return batches[0]

    def epoch(self, epoch: int) -> Iterator[pa.RecordBatch]:
        """The epoch's batches over Flight (raw groups, or any group), from :meth:`first_batch`."""
        for b in range(self.first_batch(epoch), self.num_batches):
            yield self.batch(epoch, b)

    def arrays(self, epoch: int, index: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(tensors, labels, ids)`` of a prepared batch without copying the tensors: a view of the Flight
        buffer, or of the group's /dev/shm slot file mapped read-only: the sidecar writes that slot again only
        after this member reported the view gone (the view, and every array or tensor over it, dropped;
        :mod:`unstall.shm_slots`), so a batch never changes under a tensor the trainer holds."""
        if not self.shm:
            return batch_to_numpy(self.batch(epoch, index))

        def next_batch() -> dict[str, Any]:
            # "released": the batches whose views are gone, so the sidecar may write their slots again
            body = json.dumps(dict(group=self.group, member=self.member, epoch=epoch, batch=index,
                                   released=self._slots.take_released())).encode()
            local = self._local_client()
            if local is not None:
                return local.prep_action("prep.next", body)
            return dict(json.loads(self.client.do_action("prep.next", body, recover=False)[0]))

        r = self._at(epoch, index, next_batch)
        self._note_skipped(epoch, index, r.get("skipped", ()))
        shape = (int(r["rows"]),) + tuple(int(v) for v in r["shape"])
        dtype = numpy_dtype(r["dtype"])
        if shape[0] == 0:  # every sample of the batch was skipped
            tensors: np.ndarray = np.empty(shape, dtype=dtype)
        else:
            tensors = self._slots.view(r["path"], dtype, shape, epoch, index)
        return tensors, np.asarray(r["labels"], dtype=np.int64), np.asarray(r["ids"], dtype=np.int64)

    def _local_client(self) -> Optional[LocalClient]:
        """The sidecar's local socket for ``prep.next`` (a round trip without gRPC: docs/PREP.md), or None: the
        sidecar named none, or it did not take a connection (then Flight, which recovers if the sidecar is gone).
        A member that joined a restarted sidecar's group connects to that sidecar's socket."""
        path = self.info.get("local")
        if not path or path == self._local_refused:
            return None
        if self._local is None or self._local.socket_path != path:
            if self._local is not None:
                self._local.close()
            local = LocalClient(path, self.client.endpoint().token, timeout=self.client.timeout)
            try:
                local.connect()
            except SidecarError as e:
                log.debug("unstall: prep.next over Flight: the local socket %s refused: %s", path, e)
                self._local_refused = path
                self._local = None
                return None
            self._local = local
        return self._local

    def epoch_arrays(self, epoch: int) -> Iterator[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
        for b in range(self.first_batch(epoch), self.num_batches):
            yield self.arrays(epoch, b)
        last = self.info.get("epochs")
        if self.shm and last is not None and epoch >= self.start_epoch + int(last) - 1:
            self.leave()  # a shared-memory member holds its last batch until it leaves

    def claim(self, epoch: int, index: int) -> dict[str, Any]:
        """External groups: waits until the batch is ready (``{"state": "ready"}``) or it is this member's turn
        to prepare it (``{"state": "produce", "ids": [...]}``)."""
        return self._at(epoch, index, lambda: json.loads(
            self.client.do_action("prep.claim", self._at_body(epoch, index), recover=False)[0]))

    def claim_next(self, epoch: int) -> dict[str, Any]:
        """DataLoader worker processes: the next batch of ``epoch`` nobody made or claimed yet (``{"state":
        "produce", "batch", "ids"}``), ``{"state": "wait"}`` (ask again) or ``{"state": "done"}``. Unlike
        :meth:`claim` it does not move this member's read position, so its workers hold several claims at once."""
        body = json.dumps({"group": self.group, "member": self.member, "epoch": epoch, "next": True}).encode()
        return dict(json.loads(self.client.do_action("prep.claim", body, recover=False)[0]))

    def release(self, epoch: int, index: int, reason: str = "") -> bool:
        """Gives back this member's claim on a batch (its worker died or its transform raised): another worker or
        member makes it. False when the claim was not held (it expired)."""
        body = json.dumps({"group": self.group, "member": self.member, "epoch": epoch, "batch": index,
                           "reason": reason}).encode()
        return bool(json.loads(self.client.do_action("prep.release", body, recover=False)[0]).get("released"))

    def _at_body(self, epoch: int, index: int) -> bytes:
        return json.dumps({"group": self.group, "member": self.member, "epoch": epoch, "batch": index}).encode()

    def upload(self, epoch: int, index: int, batch: pa.RecordBatch) -> None:
        """DoPut of a batch this member prepared for the group (its ``id`` column: the claimed ids)."""
        def put(conn: fl.FlightClient, options: fl.FlightCallOptions) -> None:
            cmd = json.dumps({"prep.put": {"group": self.group, "member": self.member, "epoch": epoch, "batch": index}})
            writer, _ = conn.do_put(fl.FlightDescriptor.for_command(cmd.encode()), batch.schema, options)
            writer.write_batch(batch)
            writer.close()

        self._at(epoch, index, lambda: self.client._rpc(put, recover=False))

    def leave(self) -> None:
        """Leaves the group (idempotent; a member already gone is fine)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._slots.clear()
        if self._local is not None:
            self._local.close()
        try:
            self.client.do_action("prep.leave", json.dumps({"group": self.group, "member": self.member}).encode(),
                                  recover=False)
        except SidecarError:
            pass  # gone already (with its group, or with its sidecar)

    def __enter__(self) -> Membership:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.leave()


def join(
    dataset: str,
    pipeline: Union[Pipeline, Mapping[str, Any], None] = None,
    *,
    batch_size: int,
    seed: int = 0,
    shuffle: bool = True,
    drop_last: bool = False,
    group_size: int = 1,
    join_timeout: float = 60.0,
    member_timeout: float = 30.0,
    window: Optional[int] = None,
    staging_bytes: Optional[int] = None,
    autotune: bool = True,
    epochs: Optional[int] = None,
    start_epoch: Optional[int] = None,
    start_batch: int = 0,
    name: Optional[str] = None,
    transport: str = "auto",
    on_error: Optional[str] = None,
    compression: Optional[str] = None,
    client: Optional[FlightClient] = None,
    sidecar: Any = None,
    slots: Optional[SlotMaps] = None,
) -> Membership:
    """Joins (or creates) the group for this dataset, pipeline, seed, batch size, shuffle and drop_last.

    ``group_size``: batches start once that many members joined (or ``join_timeout`` passed), so the
    jobs of a search started together all begin at epoch 0. ``pipeline=None`` shares raw batches
    (``id``, ``label``, ``key``, ``payload``) without sidecar-side prep. The first joiner's
    ``window``, ``staging_bytes``, ``member_timeout``, ``group_size`` apply to the group.
    ``transport``: ``"auto"`` (shared memory when the sidecar is on this host's loopback and /dev/shm
    exists, else Flight), ``"shm"`` or ``"flight"``; the first joiner decides whether the group stages
    in shared memory, Flight always works.

    ``window`` (batches prepared ahead of the slowest member) is tuned online from the measured rates unless
    given; ``autotune=False`` also keeps the prep threads at ``--prep-threads`` (docs/PREP.md, "Autotuning").

    ``start_epoch``/``start_batch``: a resumed member (a job restored from a checkpoint) starts at that
    batch of that epoch, and the group never prepares the batches before it for this member; a group
    that has already freed that batch refuses, saying so. ``epochs`` then counts from ``start_epoch``.
    Without, a member of a running group starts at its next whole epoch (``membership.start_epoch``).

    ``on_error``: what a sample that is not a decodable image within the pipeline's rules (formats, pixel and
    aspect caps) does: ``"raise"`` (the batch fails, naming the sample) or ``"skip"`` (the sample is left out of
    its batch, which is then smaller; ``membership.skipped`` and the group's stats say which). It sets the
    pipeline's decode op (:func:`decode`), so it is part of the group's key.

    ``compression``: ``"lz4"`` or ``"zstd"`` has the sidecar send this member's Flight batches with Arrow IPC body
    compression (compressed once per batch for all such members; pyarrow decompresses on receipt; the sidecar
    sends batches uncompressed while the codec does not shrink them). For remote members on a slow link with
    uint8 output; on loopback or shared memory it only costs CPU (docs/PREP.md).

    ``slots``: the ``SlotMaps`` that maps this member's shared-memory batches (``PrepLoader(device="cuda")``
    passes one that registers each slot as pinned memory).
    """
    if not isinstance(dataset, str) or not dataset:
        raise ValueError(f"a dataset name is required, got {dataset!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if compression not in (None, "lz4", "zstd"):
        raise ValueError(f"compression must be 'lz4', 'zstd' or None, got {compression!r}")
    if transport not in ("auto", "shm", "flight"):
        raise ValueError(f"transport must be 'auto', 'shm' or 'flight', got {transport!r}")
    if on_error is not None:
        pipeline = with_on_error(pipeline, on_error)
    if client is None:
        if sidecar is None:
            from .sidecar import default_sidecar

            sidecar = default_sidecar()
        client = sidecar.flight_client()
    body: dict[str, Any] = {
        "v": 1,
        "dataset": dataset,
        "pipeline": pipeline.to_json() if isinstance(pipeline, Pipeline) else pipeline,
        "batch_size": batch_size,
        "seed": int(seed),
        "shuffle": bool(shuffle),
        "drop_last": bool(drop_last),
        "group_size": int(group_size),
        "join_timeout_s": float(join_timeout),
        "member_timeout_s": float(member_timeout),
        "name": name or f"pid {os.getpid()}",
    }
    if window is not None:
        body["window"] = int(window)
    if not autotune:
        body["autotune"] = False
    if staging_bytes is not None:
        body["staging_bytes"] = int(staging_bytes)
    if compression is not None:
        body["compression"] = compression
    if epochs is not None:
        body["epochs"] = int(epochs)
    if start_epoch is not None:
        body["start_epoch"] = int(start_epoch)
        body["start_batch"] = int(start_batch)
    elif start_batch:
        raise ValueError(f"start_batch {start_batch} needs start_epoch")
    if transport == "shm" or (transport == "auto" and _local(client.location) and os.path.isdir("/dev/shm")):
        body["shm"] = True
    info = _join_reply(client.do_action("prep.join", json.dumps(body).encode()), epochs)
    body.setdefault("start_epoch", int(info["start_epoch"]))  # where this member's epochs count from
    m = Membership(client=client, dataset=dataset, info=info, _join_body=body, _slots=slots or SlotMaps())
    m._start_heartbeat()
    return m


def _join_reply(results: list[bytes], epochs: Optional[int]) -> dict[str, Any]:
    if len(results) != 1:
        raise ProtocolMismatchError(f"prep.join returned {len(results)} results, expected 1")
    info = json.loads(results[0])
    if epochs is not None:
        info["epochs"] = int(epochs)
    if info.get("v") != PROTOCOL_VERSION:
        raise ProtocolMismatchError(f"prep.join: unsupported version {info.get('v')!r}")
    return dict(info)


def _local(location: str) -> bool:
    from urllib.parse import urlparse

    return urlparse(location).hostname in ("127.0.0.1", "localhost", "::1")


# ---------------------------------------------------------------------------------------------
# PyTorch

_FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def device_pipeline(pipeline: Union[Pipeline, Mapping[str, Any], None],
                    memory_format: Any = None) -> Tuple[Union[Pipeline, Mapping[str, Any], None], Any]:
    """What a member whose batches go to a device asks the sidecar for, and the conversion the device does:
    ``(pipeline for the sidecar, unstall.device.ImageConversion or None)``.

    A float pipeline whose last op is ``normalize`` is asked as uint8 without it (a quarter of the bytes through
    Flight or shared memory, the CPU never converts); the device casts and normalizes. With ``memory_format``
    (``torch.channels_last`` or ``torch.contiguous_format``) the device batch is NCHW in that format, and the
    sidecar is asked for NHWC (channels_last: read through a permuted view, no transpose) or NCHW; without, the
    pipeline's layout is kept. A uint8 pipeline stays uint8. Members asking for the same thing, on a device or
    not, name the same pipeline, so they join one group. Raw and external pipelines are moved as they are."""
    import torch

    from .device import ImageConversion

    spec = pipeline.to_json() if isinstance(pipeline, Pipeline) else pipeline
    if not isinstance(spec, Mapping) or "ops" not in spec:
        if memory_format is not None:
            raise ValueError("memory_format applies to image pipelines (ops), not to raw or external batches")
        return pipeline, None
    ops = [dict(o) for o in spec["ops"]]
    layout, dtype = str(spec.get("layout", "NCHW")), str(spec.get("dtype", "float32"))
    host_layout = {None: layout, torch.channels_last: "NHWC", torch.contiguous_format: "NCHW"}.get(memory_format)
    if host_layout is None:
        raise ValueError(f"memory_format must be torch.contiguous_format, torch.channels_last or None, "
                         f"got {memory_format!r}")
    mean = std = None
    if dtype in _FLOAT_DTYPES and ops and ops[-1].get("op") == "normalize":
        last = ops.pop()
        mean, std = last.get("mean", IMAGENET_MEAN), last.get("std", IMAGENET_STD)
        host_dtype = "uint8"
    else:
        host_dtype = dtype
    if host_dtype == dtype and host_layout == layout and memory_format is None:
        return pipeline, None
    to = getattr(torch, dtype) if host_dtype != dtype else None
    conversion = ImageConversion(host_layout, to, mean, std, memory_format)
    if isinstance(pipeline, Pipeline):
        return Pipeline(tuple(ops), layout=host_layout, dtype=host_dtype), conversion
    return dict(spec, ops=ops, layout=host_layout, dtype=host_dtype), conversion


_ALL_SKIPPED = object()  # a batch whose every sample the group skipped: counted when it would be handed out


class _GroupLoader:
    """What the prep loaders share: the group membership, joined on first use (``membership``), the epoch
    each ``for`` reads, and ``state_dict``/``load_state_dict`` as torchdata's ``StatefulDataLoader``'s.

    The state (plain ints and strings, for ``torch.save``): ``version``, ``dataset``, ``epoch`` (the one in
    progress, or the next), ``batches_yielded`` (batches of it the loop was handed), ``num_batches``,
    ``seed`` (the group's: it fixes the order and the augmentations) and ``start_epoch`` (this job's first
    epoch, against which ``epochs`` counts). Call ``load_state_dict`` on a new loader built with the same
    arguments, before iterating: it joins the group at the saved batch (``prep.join``'s ``start_epoch``,
    ``start_batch``), so the sidecar never prepares the batches before it for this member, and the first
    ``for`` continues the saved epoch.

    ``echo``/``echo_level`` (not part of the group's key: every member echoes the group's batches on its own, in
    this process, after they arrived; ``unstall.echo``): each batch handed out ``echo`` times per epoch,
    reshuffled by the group's seed and the epoch; ``len()`` counts the echoed batches, ``echo_counts`` the fresh
    ones. With ``echo > 1`` the state is taken between epochs only.
    """

    def __init__(self, dataset: str, pipeline: Any, batch_size: int, join_kwargs: Mapping[str, Any]) -> None:
        import torch  # noqa: F401  (fail early, naming the missing extra)

        join_kwargs = dict(join_kwargs)
        self.echo = Echo.of(join_kwargs.pop("echo", 1), join_kwargs.pop("echo_level", "batch"))
        self.echo_counts = self.echo.counts()
        self._dataset = dataset
        self._pipeline = pipeline
        self._batch_size = batch_size
        self._join_kwargs = dict(join_kwargs)
        self._membership: Optional[Membership] = None
        self._first_epoch = 0  # this job's first epoch (kept across restores)
        self._resume: Optional[Tuple[int, int, int]] = None  # (first epoch, epoch, batch) to join at
        self._next_epoch = 0
        self._progress: Optional[Progress] = None

    @property
    def membership(self) -> Membership:
        """This loader's place in the group; joins it on first use."""
        if self._membership is None:
            kwargs = dict(self._join_kwargs)
            if self._resume is not None:
                first, epoch, batch = self._resume
                kwargs.update(start_epoch=epoch, start_batch=batch)
                if kwargs.get("epochs") is not None:
                    kwargs["epochs"] = int(kwargs["epochs"]) - (epoch - first)
            m = join(self._dataset, self._pipeline, batch_size=self._batch_size, **kwargs)
            self._first_epoch = self._resume[0] if self._resume is not None else m.start_epoch
            self._next_epoch = m.start_epoch
            self._membership = m
        return self._membership

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        self.membership  # noqa: B018  (a joiner learns its first epoch)
        return self._next_epoch

    def set_epoch(self, epoch: int) -> None:
        m = self.membership
        if epoch < m.start_epoch:
            raise ValueError(f"this member starts at epoch {m.start_epoch}, not {epoch}")
        self._next_epoch = int(epoch)
        self._progress = None

    def __len__(self) -> int:
        m = self.membership
        return self.echo.length(m.num_batches, int(m.info.get("num_samples", m.num_batches * self._batch_size)),
                                self._batch_size)

    def __iter__(self) -> Iterator[Tuple[Any, ...]]:
        epoch = self.epoch
        self._next_epoch = epoch + 1
        first = self.membership.first_batch(epoch)
        progress = self._progress = Progress(epoch, first)
        batches = self.echo.apply(self._batches(epoch, first), seed=int(self._join_kwargs.get("seed", 0)), epoch=epoch,
                                  batch_size=self._batch_size, counts=self.echo_counts)
        return CountingIterator(batches, progress)

    def _batches(self, epoch: int, first: int) -> Iterator[Tuple[Any, ...]]:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Union[int, str]]:
        m = self.membership
        epoch, yielded = position(self._progress, self._next_epoch, m.first_batch(self._next_epoch), m.num_batches)
        self.echo.check_resumable(type(self).__name__, self._progress is not None and not self._progress.done
                                  and self._progress.handed > 0)
        return {"version": STATE_VERSION, "dataset": self._dataset, "epoch": epoch, "batches_yielded": yielded,
                "num_batches": m.num_batches, "seed": int(self._join_kwargs.get("seed", 0)),
                "start_epoch": self._first_epoch}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        what = type(self).__name__
        check_state(state, what)
        if state.get("dataset", self._dataset) != self._dataset:
            raise ValueError(f"{what} state_dict was taken from a loader over dataset {state['dataset']!r}; this "
                             f"one reads {self._dataset!r}")
        epoch, batch = state_int(state, "epoch", what), state_int(state, "batches_yielded", what)
        first = state_int(state, "start_epoch", what)
        epochs = self._join_kwargs.get("epochs")
        if epochs is not None and epoch >= first + int(epochs):
            raise ValueError(f"{what} state_dict is at epoch {epoch}, past the {epochs} epochs from epoch {first} "
                             "this loader declares: nothing is left to read")
        self._join_kwargs["seed"] = state_int(state, "seed", what)
        if self._membership is not None:  # joined already (len(), epoch): join again at the saved batch
            self._membership.leave()
            self._membership = None
        self._resume = (first, epoch, batch)
        self._progress = None
        m = self.membership
        if m.num_batches != state.get("num_batches", m.num_batches):
            self.close()
            raise ValueError(f"{what} state_dict was taken from a loader with {state['num_batches']} batches per "
                             f"epoch over dataset {self._dataset!r}; this one has {m.num_batches} (build it with "
                             "the same batch_size and drop_last)")

    def close(self) -> None:
        if self._membership is not None:
            self._membership.leave()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class PrepLoader(_GroupLoader):
    """An iterable of ``(images, labels)`` torch tensors prepared by the sidecar for a whole group.

    Each ``for`` over it is the next epoch (starting at the group's ``start_epoch``), like a
    DataLoader; ``set_epoch`` picks one. ``images`` is a zero-copy view of the received Arrow buffer
    (read-only in spirit: use ``copy=True`` to own writable memory); ``labels`` is int64. With
    ``pipeline=None`` the batches are raw: ``(list of payload bytes, labels)``.
    ``with_ids=True`` adds the sample ids as a third element. The group is joined on first use
    (``membership``, ``len``, ``epoch``, a ``for``); ``state_dict``/``load_state_dict``: see ``_GroupLoader``.
    With ``on_error="skip"`` a bad image is left out of its batch (which is then smaller; a batch of bad images
    only is not yielded) and listed in :attr:`skipped`.

    ``device`` (``"cuda"``, ``"cuda:1"``, ``"cpu"``, a ``torch.device``): the batches come out on that device
    (images, labels and ids), ``device_prefetch`` batches copied ahead on a side stream while the loop runs
    (``unstall.device.DevicePrefetcher``); a float pipeline ending in ``normalize`` is prepared as uint8 and
    cast and normalized on the device, in ``memory_format`` (``torch.channels_last``,
    ``torch.contiguous_format``; default: the pipeline's layout): see :func:`device_pipeline`. On CUDA each
    shared-memory slot is registered as pinned memory once. ``state_dict`` counts the batches handed out, not
    those in flight. ``device_stats``: batches and bytes copied, the training thread's CPU time per batch.
    """

    def __init__(
        self,
        dataset: str,
        pipeline: Union[Pipeline, Mapping[str, Any], None] = None,
        *,
        batch_size: int,
        copy: bool = False,
        with_ids: bool = False,
        device: Any = None,
        device_prefetch: int = 2,
        memory_format: Any = None,
        **join_kwargs: Any,
    ) -> None:
        self.device: Any = None
        self._conversion: Any = None
        if device is not None or memory_format is not None:
            import torch

            from .device import DeviceStats, PinnedSlots

            if device is None:
                raise ValueError("memory_format needs device= (the conversion runs on the device)")
            if not isinstance(device_prefetch, int) or device_prefetch < 1:
                raise ValueError(f"device_prefetch (batches in flight) must be an int >= 1, got {device_prefetch!r}")
            self.device = torch.device(device)
            self.device_stats = DeviceStats()
            pipeline, self._conversion = device_pipeline(pipeline, memory_format)
            if self.device.type == "cuda":
                pinned = PinnedSlots(self.device_stats)
                join_kwargs["slots"] = SlotMaps(on_map=pinned.on_map, on_unmap=pinned.on_unmap)
        super().__init__(dataset, pipeline, batch_size, join_kwargs)
        self.copy = copy
        self.with_ids = with_ids
        self.device_prefetch = device_prefetch
        self.memory_format = memory_format

    @property
    def skipped(self) -> list[dict[str, Any]]:
        """The samples the group left out of the batches this loader read (decode ``on_error="skip"``):
        ``{"epoch", "batch", "id", "key", "reason"}`` each."""
        return self.membership.skipped

    def _batches(self, epoch: int, first: int) -> Iterator[Tuple[Any, ...]]:
        progress = self._progress
        batches: Iterator[Any] = self._host_batches(epoch)
        prefetcher = None
        if self.device is not None:
            from .device import DevicePrefetcher

            batches = prefetcher = DevicePrefetcher(batches, self.device, self.device_prefetch,
                                                    convert=self._convert_images, stats=self.device_stats)
        try:
            for batch in batches:
                if batch is _ALL_SKIPPED:
                    if progress is not None:
                        progress.handed += 1  # every sample skipped: counted as read (state_dict), not yielded
                    continue
                yield batch
        finally:
            if prefetcher is not None:
                prefetcher.close()  # the copies in flight done, their slots released

    def _convert_images(self, batch: Any) -> Any:
        if self._conversion is None or not isinstance(batch, tuple) or not hasattr(batch[0], "dtype"):
            return batch
        return (self._conversion(batch[0]),) + batch[1:]

    def _host_batches(self, epoch: int) -> Iterator[Any]:
        import torch

        if self.membership.shape is not None:
            for arr, labels, ids in self.membership.epoch_arrays(epoch):
                if len(ids) == 0:
                    yield _ALL_SKIPPED
                    continue
                if self.copy and self.device is None:
                    images = to_torch(arr.copy(), self.membership.dtype)
                else:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", UserWarning)  # "not writable": a view, not a copy
                        images = to_torch(arr, self.membership.dtype)
                out: Tuple[Any, ...] = (images, torch.from_numpy(np.array(labels, dtype=np.int64)))
                yield out + ((torch.from_numpy(np.array(ids, dtype=np.int64)),) if self.with_ids else ())
            return
        for rb in self.membership.epoch(epoch):  # raw batches: the stored bytes
            ids = rb.column("id").to_numpy(zero_copy_only=False)
            labels = pc.fill_null(rb.column("label"), -1).to_numpy(zero_copy_only=False)
            raw = (rb.column("payload").to_pylist(), torch.from_numpy(np.array(labels, dtype=np.int64)))
            yield raw + ((torch.from_numpy(np.array(ids, dtype=np.int64)),) if self.with_ids else ())


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


class SharedTransformLoader(_GroupLoader):
    """Python-side transforms, coordinated: members with the same ``fingerprint`` share the batches one of them
    made.

    With ``num_workers=w > 0`` (torch's DataLoader names: ``worker_init_fn``, ``multiprocessing_context``,
    ``persistent_workers``, ``prefetch_factor``) the member runs w worker processes
    (:mod:`unstall.prep_workers`) that claim the group's next free batches as this member, fetch, run
    ``transform(loader(bytes))`` and upload; the main process only reads the group's batches (``prefetch_factor *
    w`` ahead), and re-raises a worker's error ("Caught X in DataLoader worker process N", naming the batch and
    sample). With ``num_workers=0`` (the default) the main process makes its turns itself: for each batch it asks
    the sidecar (``prep.claim``); if nobody made it yet and it is this member's turn, it fetches the raw samples,
    runs the transforms on ``workers`` threads (deprecated: GIL-bound; use ``num_workers``), stacks them and
    uploads the batch; every member (the maker too) then reads the group's copy. ``fingerprint``
    names the transforms: jobs that pass the same one promise the same transforms. A member that dies while
    making a batch is dropped after ``member_timeout`` and another one makes it. Yields ``(images, labels)``
    torch tensors (plus ``ids`` with ``with_ids=True``). Joined on first use; ``state_dict``/
    ``load_state_dict`` as ``PrepLoader``'s.
    """

    def __init__(
        self,
        dataset: str,
        transform: Any,
        *,
        fingerprint: str,
        batch_size: int,
        loader: Any = None,
        workers: Optional[int] = None,
        num_workers: int = 0,
        worker_init_fn: Optional[Callable[[int], None]] = None,
        multiprocessing_context: Any = None,
        persistent_workers: bool = False,
        prefetch_factor: int = 2,
        with_ids: bool = False,
        **join_kwargs: Any,
    ) -> None:
        import concurrent.futures

        if not fingerprint:
            raise ValueError("fingerprint (a name for the transforms, shared by the jobs that use them) is required")
        if num_workers < 0 or prefetch_factor < 1:
            raise ValueError(f"num_workers must be >= 0 and prefetch_factor >= 1, got {num_workers}, {prefetch_factor}")
        if workers is not None:
            if num_workers:
                raise ValueError("workers= (threads of the main process) and num_workers= (worker processes) "
                                 "exclude each other; use num_workers")
            warnings.warn("SharedTransformLoader(workers=) runs the transforms on threads of the main process and is "
                          "deprecated: use num_workers= (DataLoader-style worker processes)", DeprecationWarning,
                          stacklevel=2)
        join_kwargs.setdefault("transport", "flight")
        if num_workers:  # every worker busy: the window holds a claim per worker and what the reader prefetches
            join_kwargs.setdefault("window", max(4, num_workers * prefetch_factor))
        super().__init__(dataset, {"python": fingerprint}, batch_size, join_kwargs)
        self.transform = transform
        self.loader = loader if loader is not None else _pil_rgb
        self.with_ids = with_ids
        self._pool = concurrent.futures.ThreadPoolExecutor(max(1, workers or 2), thread_name_prefix="unstall-transform")
        self.made = 0  # batches this member's main process prepared for the group (num_workers=0)
        self.num_workers = num_workers
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.persistent_workers = persistent_workers
        self.prefetch_factor = prefetch_factor
        self._workers: Any = None  # prep_workers.WorkerPool while running

    def _make(self, epoch: int, index: int, ids: Sequence[int]) -> None:
        import torch

        raw = self.membership.client.fetch(self.membership.dataset, list(ids), epoch)
        payloads = raw.column("payload").to_pylist()
        labels = pc.fill_null(raw.column("label"), -1).to_numpy(zero_copy_only=False)
        samples = list(self._pool.map(lambda b: self.transform(self.loader(b)), payloads))
        images = torch.stack([torch.as_tensor(x) for x in samples]).numpy()
        self.membership.upload(epoch, index, tensor_batch(images, labels, np.asarray(ids)))
        self.made += 1

    def _tensors(self, arr: np.ndarray, labels: np.ndarray, ids: np.ndarray) -> Tuple[Any, ...]:
        import torch

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # a view of the received buffer
            out: Tuple[Any, ...] = (to_torch(arr, self.membership.dtype),
                                    torch.from_numpy(np.array(labels, dtype=np.int64)))
        return out + ((torch.from_numpy(np.array(ids, dtype=np.int64)),) if self.with_ids else ())

    def _worker_batches(self, epoch: int, first: int) -> Iterator[Tuple[Any, ...]]:
        """``num_workers > 0``: the workers make the batches; a reader thread reads the group's copies in order."""
        import queue as queue_mod

        from . import prep_workers

        m = self.membership
        if self._workers is None:
            spec = prep_workers.WorkerSpec(m.client, m.dataset, dict(m.info), self.transform, self.loader,
                                           self.worker_init_fn)
            ctx = self.multiprocessing_context or prep_workers.default_context()
            self._workers = prep_workers.WorkerPool(m, spec, self.num_workers, ctx)
        items: queue_mod.Queue[Any] = queue_mod.Queue(maxsize=self.prefetch_factor * self.num_workers + 1)
        stop = threading.Event()

        def read() -> None:
            try:
                for b in range(first, m.num_batches):
                    if stop.is_set():
                        return
                    items.put(("batch", m.arrays(epoch, b)))
            except Exception as e:  # the group's error (dropped, closed): raised in the loop
                items.put(("failed", e))

        self._workers.start_epoch(epoch, items)
        threading.Thread(target=read, name="unstall-prep-reader", daemon=True).start()
        try:
            for _ in range(first, m.num_batches):
                kind, payload = items.get()
                if kind == "error":
                    payload.reraise()
                if kind == "failed":
                    raise payload
                yield self._tensors(*payload)
        finally:
            stop.set()
            if not self.persistent_workers:
                self._workers.close()
                self._workers = None

    def _batches(self, epoch: int, first: int) -> Iterator[Tuple[Any, ...]]:
        if self.num_workers:
            yield from self._worker_batches(epoch, first)
            self._close_after(epoch)
            return
        m = self.membership
        for b in range(first, m.num_batches):
            r = m.claim(epoch, b)
            if r["state"] == "produce":
                self._make(epoch, b, r["ids"])
            yield self._tensors(*batch_to_numpy(m.batch(epoch, b)))
        self._close_after(epoch)

    def _close_after(self, epoch: int) -> None:
        m = self.membership
        last = m.info.get("epochs")
        if last is not None and epoch >= m.start_epoch + int(last) - 1:
            self.close()

    def close(self) -> None:
        if self._workers is not None:
            self._workers.close()
            self._workers = None
        super().close()
        self._pool.shutdown(wait=False)


def _pil_rgb(data: bytes) -> Any:
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB")
