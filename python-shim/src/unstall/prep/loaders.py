"""The prep loaders for PyTorch: ``PrepLoader`` (batches the sidecar prepared, as torch tensors, optionally
on a device) and ``SharedTransformLoader`` (Python-side transforms, each batch made once for the group)."""

from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow.compute as pc

from ..protocol import PayloadBatch, batch_to_numpy, tensor_batch
from ..shm_slots import SlotMaps
from .group_loader import GroupLoader
from .ahead import EPOCH_END, Crossing, EpochPrefetch
from .decode_share import DecodeShare, ShareStats, device_uuid, share_scope
from .mixed import MIXED, MixedDecode, decode_device, payload_tensors
from .pipeline import IMAGENET_MEAN, IMAGENET_STD, Pipeline
from .rates import MemberRates

__all__ = ["PrepLoader", "SharedTransformLoader", "device_pipeline", "to_torch"]


def to_torch(arr: np.ndarray, dtype: Optional[str]) -> Any:
    """``torch.from_numpy(arr)``, viewed as ``torch.bfloat16`` for bfloat16 tensors."""
    import torch

    t = torch.from_numpy(arr)
    return t.view(torch.bfloat16) if dtype == "bfloat16" else t


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

    from ..device import ImageConversion

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


class _RawBatch(NamedTuple):
    """A raw batch on its way to ``decode(device="mixed")``: the prefetcher copies its tensors, the device decodes
    its payloads (views of the Flight buffer or the shared-memory slot, kept alive until the decode is done)."""

    payloads: PayloadBatch
    epoch: int
    labels: Any
    ids: Any
    position: int  # the batch's index in the group's epoch


class PrepLoader(GroupLoader):
    """An iterable of ``(images, labels)`` torch tensors prepared by the sidecar for a whole group.

    Each ``for`` over it is the next epoch (starting at the group's ``start_epoch``), like a
    DataLoader; ``set_epoch`` picks one. ``images`` is a zero-copy view of the received Arrow buffer
    (read-only in spirit: use ``copy=True`` to own writable memory); ``labels`` is int64. With
    ``pipeline=None`` the batches are raw: ``(list of payload bytes, labels)``.
    ``with_ids=True`` adds the sample ids as a third element. The group is joined on first use
    (``membership``, ``len``, ``epoch``, a ``for``); ``rank``/``world_size`` (data-parallel ranks, each reading
    its share) and ``state_dict``/``load_state_dict``: see ``GroupLoader``.
    ``order="cache_first"``/``order_window``: the group's cache-first order (see ``GroupLoader``, docs/PREP.md).
    With ``on_error="skip"`` a bad image is left out of its batch (which is then smaller; a batch of bad images
    only is not yielded) and listed in :attr:`skipped`.

    ``device`` (``"cuda"``, ``"cuda:1"``, ``"cpu"``, a ``torch.device``): the batches come out on that device
    (images, labels and ids), ``device_prefetch`` batches copied ahead on a side stream while the loop runs
    (``unstall.device.DevicePrefetcher``, whose thread also reads the next epoch's first batches while the loop
    finishes an epoch, when the next ``for`` reads that epoch); a float pipeline ending in ``normalize`` is prepared as uint8 and
    cast and normalized on the device, in ``memory_format`` (``torch.channels_last``,
    ``torch.contiguous_format``; default: the pipeline's layout): see :func:`device_pipeline`. On CUDA each
    shared-memory slot is registered as pinned memory once. ``state_dict`` counts the batches handed out, not
    those in flight. ``device_stats``: batches and bytes copied, the training thread's CPU and wall time in
    ``next()`` per batch.

    ``device_share`` (``decode(device="mixed")`` only; default True): the members of the group on this host and
    device decode each batch once between them and hand it to each other (CUDA IPC handles on a GPU, shared memory
    on the CPU; :mod:`unstall.prep.decode_share`), each member using a copy whose sample ids it checked;
    ``share_stats`` counts what this member decoded, served and received. Once another member is there (from the
    first batch with ``group_size > 1``; else from the first batch one asked the other for) it keeps its last few
    decoded batches on offer (device memory: about ``2 * (device_prefetch + window)`` batches); alone, none.

    ``decode_workers`` (``decode(device="mixed")`` only; default 0): 1 decodes in a process of its own on the device,
    off the training thread's interpreter lock (:mod:`unstall.prep.decode_worker`).
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
        device_share: bool = True,
        decode_workers: int = 0,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        **join_kwargs: Any,
    ) -> None:
        self.device: Any = None
        self._conversion: Any = None
        self._mixed: Optional[MixedDecode] = None
        self._rates: Optional[MemberRates] = None
        self._decode_share: Optional[DecodeShare] = None
        self._share_scope: Tuple[Optional[str], bytes] = (None, b"")  # (group, its scope digest): _share_for
        self._device_share = bool(device_share)
        if decode_workers not in (0, 1) or isinstance(decode_workers, bool):
            raise ValueError("decode_workers must be 0 (decode(device='mixed') on the prefetcher's thread) or 1 (in a "
                             f"process of its own), got {decode_workers!r}")
        self._decode_worker: Any = None  # decode_worker.LoaderWorker (decode_workers=1)
        if decode_workers:
            from .decode_worker import LoaderWorker

            self._decode_worker = LoaderWorker()
        if pipeline is not None and decode_device(pipeline) == MIXED:
            if device is None:
                raise ValueError("decode(device='mixed') decodes on the loader's device: pass device= ('cuda'; "
                                 "'cpu' runs the same ops with torchvision's CPU decoder)")
            spec = pipeline.to_json() if isinstance(pipeline, Pipeline) else dict(pipeline)
            self._mixed = MixedDecode(spec["ops"], str(spec.get("dtype", "float32")), str(spec.get("layout", "NCHW")),
                                      device, memory_format)
            # the group serves the stored bytes (and, hybrid, the samples its CPUs prepared); the device does the rest
            pipeline = self._mixed.sidecar_pipeline()
            if pipeline is not None:  # hybrid: the sidecar splits each batch from this member's measured rates
                join_kwargs["hybrid"] = {"cpu_load": self._mixed.cpu_load}
                self._rates = MemberRates()
                join_kwargs["rates"] = self._rates.report
        if decode_workers and self._mixed is None:
            raise ValueError("decode_workers applies to decode(device='mixed') only: the sidecar prepares the other "
                             "pipelines")
        if device is not None or memory_format is not None:
            import torch

            from ..device import DeviceStats, PinnedSlots

            if device is None:
                raise ValueError("memory_format needs device= (the conversion runs on the device)")
            if not isinstance(device_prefetch, int) or device_prefetch < 1:
                raise ValueError(f"device_prefetch (batches in flight) must be an int >= 1, got {device_prefetch!r}")
            self.device = torch.device(device)
            self.device_stats = DeviceStats()
            if self._mixed is None:
                pipeline, self._conversion = device_pipeline(pipeline, memory_format)
            if self.device.type == "cuda" and self._mixed is None:
                pinned = PinnedSlots(self.device_stats)
                join_kwargs["slots"] = SlotMaps(on_map=pinned.on_map, on_unmap=pinned.on_unmap)
        super().__init__(dataset, pipeline, batch_size, join_kwargs, rank, world_size)
        self.copy = copy
        self.with_ids = with_ids
        self.device_prefetch = device_prefetch
        self.memory_format = memory_format
        self._epochs = EpochPrefetch(self._prefetcher, self._first_indices)  # device batches, across epochs

    @property
    def skipped(self) -> list[dict[str, Any]]:
        """The samples the group left out of the batches this loader read (decode ``on_error="skip"``):
        ``{"epoch", "batch", "id", "key", "reason"}`` each."""
        return self.membership.skipped

    def _batches(self, epoch: int, indices: Sequence[int]) -> Iterator[Tuple[Any, ...]]:
        progress = self._progress
        batches = self._host_batches(epoch, indices) if self.device is None else self._epochs.batches(epoch, indices)
        for batch in batches:
            if batch is _ALL_SKIPPED:
                if progress is not None:
                    progress.handed += 1  # every sample skipped: counted as read (state_dict), not yielded
                continue
            yield batch

    def _prefetcher(self, epoch: int, indices: Sequence[int], crossing: Crossing) -> Any:
        from ..device import DevicePrefetcher

        return DevicePrefetcher(self._host_epochs(epoch, indices, crossing), self.device, self.device_prefetch,
                                convert=self._convert_images, stats=self.device_stats,
                                on_step=self._rates.stepped if self._rates is not None else None)

    def _host_epochs(self, epoch: int, indices: Sequence[int], crossing: Crossing) -> Iterator[Any]:
        """The host batches of ``epoch`` (``indices``), then, while the next ``for`` is to read the next epoch, the
        member declared it and the loop is still in this one (``crossing``), an ``EPOCH_END`` and that epoch's
        batches from its first: the device prefetcher reads the next epoch's first batches while the loop finishes
        this one, so a new epoch starts without a wait for its first round trip and copy (``EpochPrefetch``)."""
        while True:
            yield from self._host_batches(epoch, indices)
            if not self._reads_next(epoch + 1) or not crossing.cross(epoch):
                return
            epoch += 1
            indices = self._first_indices(epoch)
            yield EPOCH_END

    def _reads_next(self, epoch: int) -> bool:
        m = self.membership
        last = m.info.get("epochs")
        return self._next_epoch == epoch and (last is None or epoch < m.start_epoch + int(last))

    def _first_indices(self, epoch: int) -> list[int]:
        return list(self._share(epoch)[0].positions(0))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._epochs.close()
        super().load_state_dict(state)

    def close(self) -> None:
        self._epochs.close()
        if self._decode_share is not None:
            self._decode_share.close()
        if self._decode_worker is not None:
            self._decode_worker.close()
        super().close()

    @property
    def share_stats(self) -> Optional[ShareStats]:
        """What this member decoded for the group's members on its device, served them and received from them
        (``device_share``); None until it decoded a batch on the device, or without ``device_share``."""
        return self._decode_share.stats if self._decode_share is not None else None

    def _convert_images(self, batch: Any) -> Any:
        if self._mixed is not None and isinstance(batch, _RawBatch):
            return self._decode_on_device(batch)
        if self._conversion is None or not isinstance(batch, tuple) or not hasattr(batch[0], "dtype"):
            return batch
        return (self._conversion(batch[0]),) + batch[1:]

    def _decode_on_device(self, batch: "_RawBatch") -> Tuple[Any, ...]:
        """``decode(device="mixed")``: a raw (or hybrid) batch's images decoded and prepared on the device, in the
        prefetcher's thread and on its stream."""
        p = batch.payloads
        mixed = self._mixed
        assert mixed is not None
        mixed.set_limits(self.membership.info.get("decode_limits"))  # the sidecar's now (it may have restarted)
        ids, seed = p.ids.tolist(), int(self._join_kwargs.get("seed", 0))

        prepared = None if p.prepared is None else p.prepared.tolist()
        rates = self._rates
        # hybrid: the device's time on the samples it decodes, for the sidecar's split
        timing = None if rates is None else (lambda n, work: rates.timed(mixed.device, n, work))

        def decode() -> Any:
            if self._decode_worker is not None:  # None back: no worker now, decoded here
                images = self._decode_worker(mixed, p, ids, batch.epoch, seed, prepared,
                                             self.membership.info.get("decode_limits"), rates)
                if images is not None:
                    return images
            return mixed(payload_tensors(p.data, p.offsets), ids, batch.epoch, seed, p.keys, prepared, timing,
                         p.headers)

        if not self._device_share:
            images = decode()
        else:
            share, scope = self._share_for(mixed, seed)
            images = share.batch(scope, batch.epoch, batch.position, ids, decode)
        return (images, batch.labels, batch.ids) if self.with_ids else (images, batch.labels)

    def _share_for(self, mixed: MixedDecode, seed: int) -> Tuple[DecodeShare, bytes]:
        """This loader's ``DecodeShare`` (made at its first batch) and the scope of the group it is in now, worked
        out again only when it joined another (a restarted sidecar's)."""
        m = self.membership
        if self._decode_share is None:
            window = int(m.info.get("window", 4))
            self._decode_share = DecodeShare(self.device, ring=2 * (self.device_prefetch + window),
                                             peers=int(self._join_kwargs.get("group_size", 1)) > 1)
        if self._share_scope[0] != m.group:
            sidecar = m.client.endpoint()
            self._share_scope = (m.group, share_scope(sidecar.flight, sidecar.token, m.group, seed, mixed.ops,
                                                      mixed.dtype, mixed.layout, str(mixed.memory_format),
                                                      device_uuid(self.device)))
        return self._decode_share, self._share_scope[1]

    def _host_batches(self, epoch: int, indices: Sequence[int]) -> Iterator[Any]:
        import torch

        if self._mixed is not None:  # the stored bytes (shared memory or Flight); the device decodes them
            for index, p in zip(indices, self.membership.epoch_payloads(epoch, indices)):
                yield _RawBatch(p, epoch, torch.from_numpy(np.array(p.labels, dtype=np.int64)),
                                torch.from_numpy(np.array(p.ids, dtype=np.int64)), index)
            return
        if self.membership.shape is not None:
            for arr, labels, ids in self.membership.epoch_arrays(epoch, indices):
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
        for p in self.membership.epoch_payloads(epoch, indices):  # raw batches: the stored bytes, copied out
            raw = (p.row_bytes(), torch.from_numpy(np.array(p.labels, dtype=np.int64)))
            yield raw + ((torch.from_numpy(np.array(p.ids, dtype=np.int64)),) if self.with_ids else ())


class SharedTransformLoader(GroupLoader):
    """Python-side transforms, coordinated: members with the same ``fingerprint`` share the batches one of them
    made.

    With ``num_workers=w > 0`` (torch's DataLoader names: ``worker_init_fn``, ``multiprocessing_context``,
    ``persistent_workers``, ``prefetch_factor``) the member runs w worker processes
    (:mod:`unstall.prep.workers`) that claim the group's next free batches as this member, fetch, run
    ``transform(loader(bytes))`` and upload; the main process only reads the group's batches (``prefetch_factor *
    w`` ahead), and re-raises a worker's error ("Caught X in DataLoader worker process N", naming the batch and
    sample). With ``num_workers=0`` (the default) the main process makes its turns itself: for each batch it asks
    the sidecar (``prep.claim``); if nobody made it yet and it is this member's turn, it fetches the raw samples,
    runs the transforms on ``workers`` threads (deprecated: GIL-bound; use ``num_workers``), stacks them and
    uploads the batch; every member (the maker too) then reads the group's copy. ``fingerprint``
    names the transforms: jobs that pass the same one promise the same transforms. A member that dies while
    making a batch is dropped after ``member_timeout`` and another one makes it. Yields ``(images, labels)``
    torch tensors (plus ``ids`` with ``with_ids=True``). Joined on first use; ``rank``/``world_size`` (each rank makes
    and reads its share's batches; its workers make any of the group's) and ``state_dict``/``load_state_dict`` as
    ``PrepLoader``'s.
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
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
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
        super().__init__(dataset, {"python": fingerprint}, batch_size, join_kwargs, rank, world_size)
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
        self._workers: Any = None  # workers.WorkerPool while running

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

    def _worker_batches(self, epoch: int, indices: Sequence[int]) -> Iterator[Tuple[Any, ...]]:
        """``num_workers > 0``: the workers make the batches; a reader thread reads the group's copies in order."""
        import queue as queue_mod

        from . import workers

        m = self.membership
        if self._workers is None:
            spec = workers.WorkerSpec(m.client, m.dataset, dict(m.info), self.transform, self.loader,
                                           self.worker_init_fn)
            ctx = self.multiprocessing_context or workers.default_context()
            self._workers = workers.WorkerPool(m, spec, self.num_workers, ctx)
        items: queue_mod.Queue[Any] = queue_mod.Queue(maxsize=self.prefetch_factor * self.num_workers + 1)
        stop = threading.Event()

        def read() -> None:
            try:
                for b in indices:
                    if stop.is_set():
                        return
                    items.put(("batch", m.arrays(epoch, b)))
            except Exception as e:  # the group's error (dropped, closed): raised in the loop
                items.put(("failed", e))

        self._workers.start_epoch(epoch, items)
        threading.Thread(target=read, name="unstall-prep-reader", daemon=True).start()
        try:
            for _ in indices:
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

    def _batches(self, epoch: int, indices: Sequence[int]) -> Iterator[Tuple[Any, ...]]:
        if self.num_workers:
            yield from self._worker_batches(epoch, indices)
            self._close_after(epoch)
            return
        m = self.membership
        for b in indices:
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
