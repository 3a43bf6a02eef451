"""A job's membership of a prep group: ``join`` (or create) the group, then read, claim, release and upload
its batches; a heartbeat keeps the member in the group. Needs only pyarrow and numpy (no torch)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Tuple, TypeVar, Union

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl

from ..client import FlightClient
from ..errors import PrepGroupNotFoundError, ProtocolMismatchError, SidecarError, SidecarUnavailableError
from ..local import LocalClient
from ..protocol import (PayloadBatch, PrepJoin, PrepRates, PrepSlot, batch_payloads, batch_to_numpy, encode_prep_join,
                        encode_prep_next, encode_prep_ticket, parse_prep_join_reply, parse_prep_slot, skipped_of)
from ..recovery import call_with_recovery
from ..shm_slots import SlotMaps
from .pipeline import Pipeline, with_on_error

__all__ = ["Membership", "join"]

log = logging.getLogger("unstall")
T = TypeVar("T")


@dataclass
class Membership:
    """This job's place in a prep group: read batch ``b`` of epoch ``e`` with :meth:`batch`.

    A daemon thread heartbeats so that long training steps do not get the member dropped; a member that stops (crash,
    kill) is dropped by the sidecar after ``member_timeout`` seconds, and the others go on. Leave with :meth:`leave`
    (or a ``with`` block); reading all declared ``epochs`` leaves by itself."""

    client: FlightClient
    dataset: str
    info: dict[str, Any]
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: Optional[threading.Thread] = field(default=None, repr=False)
    dropped: Optional[str] = None
    # what this member joined with, to join again at the batch in hand after the sidecar restarted (its groups died
    # with it)
    _join: Optional[PrepJoin] = field(default=None, repr=False)
    rejoins: int = 0  # times this member joined a restarted sidecar's new group
    # Samples the group left out of the batches this member read (decode on_error="skip"), in reading order:
    # {"epoch", "batch", "id", "key", "reason"} each.
    skipped: list[dict[str, Any]] = field(default_factory=list)
    _warned: set[int] = field(default_factory=set, repr=False)
    _slots: SlotMaps = field(default_factory=SlotMaps, repr=False)  # shared memory: the group's slot files
    # shared memory: prep.next goes over the sidecar's local socket (the join reply's "local"), not gRPC
    _local: Optional[LocalClient] = field(default=None, repr=False)
    _local_refused: Optional[str] = field(default=None, repr=False)  # a socket that did not take a connection
    _snapshots: dict[int, str] = field(default_factory=dict, repr=False)  # cache_first: the epoch read's snapshot
    _rates: Optional[Callable[[], Optional[PrepRates]]] = field(default=None, repr=False)  # a hybrid's, sent with each read

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
                    if self._join is not None and self.client.rediscovery is not None:
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
        if self._join is None:
            return attempt()
        return call_with_recovery(self.client, attempt, lambda: self._rejoin(epoch, index))

    def _rejoin(self, epoch: int, index: int) -> None:
        assert self._join is not None and self._join.start_epoch is not None
        first = self._join.start_epoch
        share = self._join.share
        if share is not None and epoch != first:  # what the job read was of that epoch
            share = {"world_size": share["world_size"], "rank": share["rank"]}
        request = dataclasses.replace(
            self._join, start_epoch=epoch, start_batch=index, share=share,
            # the restarted sidecar continues this epoch's order, not a new snapshot's
            cache_snapshot=self._snapshots.get(epoch),
            # counted from the first join's start: what is left of them from here
            epochs=None if self._join.epochs is None else self._join.epochs - (epoch - first))
        old = (self.group, self.member)
        # with recovery: the dataset may not be registered on the restarted sidecar yet (its owner does that)
        info = _joined(self.client, request)
        # The fault may have been a wait that timed out on a sidecar that is still running: the old member is then
        # still in its group, holding back what the group frees until it would time out. It leaves now, after the
        # new one joined (before, the group could free the batch the new one starts at); on a restarted sidecar
        # its group died with it, and this fails: fine.
        self._leave_group(*old)
        log.info("unstall: prep member %s joined the restarted sidecar's group %s at epoch %d batch %d",
                 self.member, info["group"], epoch, index)
        self.info = info
        self.rejoins += 1

    def batch(self, epoch: int, index: int) -> pa.RecordBatch:
        """One DoGet: waits until the group has prepared the batch, then receives it. Samples the group skipped
        (decode ``on_error="skip"``) are not rows of it: they are added to :attr:`skipped`."""
        self._ordered(epoch, index)
        rb = self._at(epoch, index, lambda: self._batch(epoch, index))
        self._note_skipped(epoch, index, skipped_of(rb))
        return rb

    def cache_snapshot(self, epoch: int) -> Optional[str]:
        """A ``cache_first`` group's snapshot of ``epoch`` (``encode_snapshot``'s form) once this member read from
        that epoch or joined it carrying one; else None."""
        return self._snapshots.get(epoch)

    def _ordered(self, epoch: int, index: int) -> None:
        """Before a cache_first member's first read of an epoch: the snapshot its order is computed from
        (``prep.order``, which fixes it), so a rejoin after a sidecar restart carries it."""
        if not self.info.get("order_window") or epoch in self._snapshots:
            return

        def ask() -> str:
            body = json.dumps({"group": self.group, "member": self.member, "epoch": epoch}).encode()
            return str(json.loads(self.client.do_action("prep.order", body, recover=False)[0])["cache_snapshot"])

        self._snapshots = {epoch: self._at(epoch, index, ask)}

    def _note_skipped(self, epoch: int, index: int, skipped: Sequence[Mapping[str, Any]]) -> None:
        for s in skipped:
            entry = {"epoch": epoch, "batch": index, **s}
            self.skipped.append(entry)
            if int(s["id"]) not in self._warned:  # every epoch skips it again: warn once
                self._warned.add(int(s["id"]))
                log.warning("unstall: prep skipped sample %s (%r) of dataset %r (on_error='skip'): %s",
                            s["id"], s.get("key"), self.dataset, s.get("reason"))

    def _batch(self, epoch: int, index: int) -> pa.RecordBatch:
        rates = self._rates() if self._rates is not None else None  # a hybrid's, for the split, as prep.next's
        ticket = fl.Ticket(encode_prep_ticket(self.group, self.member, epoch, index, rates))
        table = self.client._rpc(lambda conn, options: conn.do_get(ticket, options).read_all(), recover=False)
        batches = table.combine_chunks().to_batches()
        if len(batches) != 1:
            raise ProtocolMismatchError(f"expected one record batch, got {len(batches)}")
        return batches[0]

    def epoch(self, epoch: int, batches: Optional[Sequence[int]] = None) -> Iterator[pa.RecordBatch]:
        """The epoch's batches over Flight (raw groups, or any group): ``batches`` (this member's, in order), by
        default those from :meth:`first_batch` on."""
        for b in self._indices(epoch, batches):
            yield self.batch(epoch, b)

    def _indices(self, epoch: int, batches: Optional[Sequence[int]]) -> Sequence[int]:
        return range(self.first_batch(epoch), self.num_batches) if batches is None else batches

    def arrays(self, epoch: int, index: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(tensors, labels, ids)`` of a prepared batch without copying the tensors: a view of the Flight
        buffer, or of the group's /dev/shm slot file mapped read-only: the sidecar writes that slot again only
        after this member reported the view gone (the view, and every array or tensor over it, dropped;
        :mod:`unstall.shm_slots`), so a batch never changes under a tensor the trainer holds."""
        if not self.shm:
            return batch_to_numpy(self.batch(epoch, index))
        r = self._next(epoch, index)
        assert r.shape is not None and r.dtype is not None, "a prepared batch's answer has its shape"
        shape = (r.rows,) + r.shape  # no rows: every sample of the batch was skipped, nothing to map
        tensors = self._slots.view(r.path, r.dtype, shape, epoch, index) if r.rows else np.empty(shape, r.dtype)
        return tensors, r.labels, r.ids

    def payloads(self, epoch: int, index: int) -> PayloadBatch:
        """A raw (or hybrid) batch's stored bytes without a copy, as :meth:`arrays` gives a prepared one's tensors:
        views of the Flight buffer, or of the group's /dev/shm slot (its payloads, copied there once by the
        sidecar), released like :meth:`arrays`' once every view and tensor over ``data`` is gone."""
        if not self.shm:
            return batch_payloads(self.batch(epoch, index))
        r = self._next(epoch, index)
        assert r.offsets is not None and r.keys is not None, "a raw batch's answer has its offsets"
        data = self._slots.view(r.path, np.dtype(np.uint8), (int(r.offsets[-1]),), epoch, index) if r.rows else None
        return PayloadBatch(np.empty(0, np.uint8) if data is None else data, r.offsets, r.ids, r.labels, r.keys,
                            r.prepared, r.headers)

    def _next(self, epoch: int, index: int) -> PrepSlot:
        """``prep.next`` for batch ``index`` of ``epoch`` (a shared-memory member): where it lies in its slot."""
        self._ordered(epoch, index)

        def next_batch() -> dict[str, Any]:
            # "released": the batches whose views are gone, so the sidecar may write their slots again
            body = encode_prep_next(self.group, self.member, epoch, index, self._slots.take_released(),
                                    self._rates() if self._rates is not None else None)
            local = self._local_client()
            if local is not None:
                return local.prep_action("prep.next", body)
            return dict(json.loads(self.client.do_action("prep.next", body, recover=False)[0]))

        r = parse_prep_slot(self._at(epoch, index, next_batch))
        self._note_skipped(epoch, index, r.skipped)
        return r

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

    def epoch_arrays(self, epoch: int, batches: Optional[Sequence[int]] = None
                     ) -> Iterator[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """:meth:`arrays` of the epoch's ``batches`` (as :meth:`epoch`'s)."""
        return self._epoch_reads(epoch, batches, self.arrays)

    def epoch_payloads(self, epoch: int, batches: Optional[Sequence[int]] = None) -> Iterator[PayloadBatch]:
        """:meth:`payloads` of the epoch's ``batches`` (as :meth:`epoch`'s)."""
        return self._epoch_reads(epoch, batches, self.payloads)

    def _epoch_reads(self, epoch: int, batches: Optional[Sequence[int]], read: Callable[[int, int], T]) -> Iterator[T]:
        for b in self._indices(epoch, batches):
            yield read(epoch, b)
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

    def group_stats(self) -> dict[str, Any]:
        """This group's entry of the sidecar's ``prep.stats``: its counts, decoder, autotuner and, for sidecar prep,
        ``cache_forms`` (the cost model's latest plans, each with its predicted and measured epoch seconds; see
        docs/PREP.md, "Cache forms"). Empty when the sidecar no longer has the group."""
        doc = json.loads(self.client.do_action("prep.stats")[0])
        return dict(doc.get("groups", {}).get(self.group, {}))

    def leave(self) -> None:
        """Leaves the group (idempotent; a member already gone is fine)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._slots.clear()
        if self._local is not None:
            self._local.close()
        self._leave_group(self.group, self.member)

    def _leave_group(self, group: str, member: int) -> None:
        """``prep.leave`` for ``member`` of ``group`` (one already gone is fine: with its group, or its sidecar)."""
        try:
            self.client.do_action("prep.leave", json.dumps({"group": group, "member": member}).encode(),
                                  recover=False)
        except SidecarError:
            pass

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
    share: Optional[Mapping[str, Any]] = None,
    hybrid: Optional[Mapping[str, Any]] = None,
    order: Optional[Mapping[str, Any]] = None,
    cache_snapshot: Optional[str] = None,
    rates: Optional[Callable[[], Optional[PrepRates]]] = None,
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

    ``slots``: the ``SlotMaps`` that maps this member's shared-memory batches (``PrepLoader(device="cuda")``: pinned).

    ``share``: this member is one data-parallel rank of a job and reads only its share of each epoch
    (``{"world_size", "rank"}``; a restored rank adds ``"consumed"``, the batch ranges of ``start_epoch`` its job read,
    and ``"skip"``, the batches of its share there it read itself): the group frees a batch once every rank that
    reads it did, and the member is done after its own last batch. The prep loaders pass it (``rank=``,
    ``world_size=``).

    ``hybrid``: ``{"cpu_load": 0..1 or "auto"}``: the sidecar prepares that share of each batch with ``pipeline``
    (uint8 NHWC) and leaves the rest encoded, for the member's device; ``rates``: the member's measured rates
    (``MemberRates.report``), sent with each read for the split of ``"auto"`` (``PrepLoader`` passes both).

    ``order``: ``{"cache_first": window}``, part of the group's key: each epoch's seeded order reordered cached samples
    first within aligned windows of ``window`` positions, from one snapshot of the sidecar's cache per epoch
    (docs/PREP.md); ``cache_snapshot``, with ``start_epoch``: the snapshot that epoch was read in (a restored state's).
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
            from ..sidecar import default_sidecar

            sidecar = default_sidecar()
        client = sidecar.flight_client()
    if start_epoch is None and start_batch:
        raise ValueError(f"start_batch {start_batch} needs start_epoch")
    shm = transport == "shm" or (transport == "auto" and _local(client.location) and os.path.isdir("/dev/shm"))
    request = PrepJoin(
        dataset, pipeline.to_json() if isinstance(pipeline, Pipeline) else pipeline, batch_size, seed=int(seed),
        shuffle=bool(shuffle), drop_last=bool(drop_last), group_size=int(group_size),
        join_timeout_s=float(join_timeout), member_timeout_s=float(member_timeout), name=name or f"pid {os.getpid()}",
        window=None if window is None else int(window), autotune=None if autotune else False,
        staging_bytes=None if staging_bytes is None else int(staging_bytes), compression=compression,
        share=share, hybrid=hybrid, order=order, cache_snapshot=cache_snapshot,
        epochs=None if epochs is None else int(epochs),
        start_epoch=None if start_epoch is None else int(start_epoch),
        start_batch=None if start_epoch is None else int(start_batch), shm=True if shm else None)
    info = _joined(client, request)
    start = int(info["start_epoch"]) if request.start_epoch is None else request.start_epoch
    request = dataclasses.replace(request, start_epoch=start)  # where this member's epochs count from
    m = Membership(client=client, dataset=dataset, info=info, _join=request, _slots=slots or SlotMaps(), _rates=rates,
                   _snapshots={start: cache_snapshot} if cache_snapshot is not None else {})
    m._start_heartbeat()
    return m


def _joined(client: FlightClient, request: PrepJoin) -> dict[str, Any]:
    """``prep.join``'s answer to ``request``, with the member's own count of ``epochs`` when it gave one."""
    info = parse_prep_join_reply(client.do_action("prep.join", encode_prep_join(request)))
    if request.epochs is not None:
        info["epochs"] = request.epochs
    return info


def _local(location: str) -> bool:
    from urllib.parse import urlparse

    return urlparse(location).hostname in ("127.0.0.1", "localhost", "::1")
