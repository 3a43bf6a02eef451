"""The prep loaders for PyTorch: ``PrepLoader`` (batches the sidecar prepared, as torch tensors, optionally
on a device) and ``SharedTransformLoader`` (Python-side transforms, each batch made once for the group)."""

from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow.compute as pc

from ..echo import Echo
from ..protocol import batch_to_numpy, tensor_batch
from ..shm_slots import SlotMaps
from ..state import STATE_VERSION, CountingIterator, Progress, check_state, mid_epoch, position, state_int
from .membership import Membership, join
from .pipeline import IMAGENET_MEAN, IMAGENET_STD, Pipeline

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


class _GroupLoader:
    """What the prep loaders share: the group membership, joined on first use (``membership``), the epoch
    each ``for`` reads, and ``state_dict``/``load_state_dict`` as torchdata's ``StatefulDataLoader``'s.

    The state (plain ints and strings, for ``torch.save``): ``version``, ``dataset``, ``epoch`` (the one in
    progress, or the next), ``batches_yielded`` (batches of it the loop was handed), ``num_batches``,
    ``seed`` (the group's: it fixes the order and the augmentations) and ``start_epoch`` (this job's first
    epoch, against which ``epochs`` counts). Call ``load_state_dict`` on a new loader built with the same
    arguments, before iterating: it joins the group at the saved batch (``prep.join``'s ``start_epoch``,
    ``start_batch``), so the sidecar never prepares the batches before it for this member, and the first
    ``for`` continues the saved epoch. As torchdata's, a state taken after an epoch's last batch is that epoch's
    end: restored, the member joins at the next epoch's start and the first ``for`` yields nothing; one taken
    once the ``for`` is over is the next epoch's start.

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
        self._ended: Optional[int] = None  # restored at this epoch's end: the next ``for`` reads it, empty
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
        return self._ended if self._ended is not None else self._next_epoch

    def set_epoch(self, epoch: int) -> None:
        m = self.membership
        if epoch < m.start_epoch:
            raise ValueError(f"this member starts at epoch {m.start_epoch}, not {epoch}")
        self._next_epoch = int(epoch)
        self._ended = None
        self._progress = None

    def __len__(self) -> int:
        m = self.membership
        return self.echo.length(m.num_batches, int(m.info.get("num_samples", m.num_batches * self._batch_size)),
                                self._batch_size)

    def __iter__(self) -> Iterator[Tuple[Any, ...]]:
        epoch = self.epoch
        if self._ended is not None:  # every batch of it was handed out before the state was taken
            self._ended = None
            self._progress = Progress(epoch, self.membership.num_batches)
            return CountingIterator(iter(()), self._progress)
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
        pending = m.num_batches if self._ended is not None else m.first_batch(self._next_epoch)
        epoch, yielded = position(self._progress, self.epoch, pending)
        self.echo.check_resumable(type(self).__name__, mid_epoch(yielded, m.num_batches))
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
        # At an epoch's end (all its batches handed out) the member joins at the next epoch's start; the
        # first ``for`` reads the finished epoch, empty.
        ended = batch > 0 and batch >= state.get("num_batches", batch + 1)
        epochs = self._join_kwargs.get("epochs")
        if epochs is not None and epoch + ended >= first + int(epochs):
            where = f"the end of epoch {epoch}" if ended else f"epoch {epoch}"
            raise ValueError(f"{what} state_dict is at {where}, past the {epochs} epochs from epoch {first} "
                             "this loader declares: nothing is left to read")
        self._join_kwargs["seed"] = state_int(state, "seed", what)
        if self._membership is not None:  # joined already (len(), epoch): join again at the saved batch
            self._membership.leave()
            self._membership = None
        self._resume = (first, epoch + 1, 0) if ended else (first, epoch, batch)
        self._ended = epoch if ended else None
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

            from ..device import DeviceStats, PinnedSlots

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
            from ..device import DevicePrefetcher

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


class SharedTransformLoader(_GroupLoader):
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

    def _worker_batches(self, epoch: int, first: int) -> Iterator[Tuple[Any, ...]]:
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
