"""``unstall.torch.DataLoader``: torch's DataLoader over an ``unstall.torch.Dataset`` that tells the sidecar
which epoch (and session) each batch belongs to, its iterator wrapped by the loader's observers."""


from __future__ import annotations

import itertools
import multiprocessing
import os
import warnings
import weakref
from typing import Any, Callable, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.utils.data as tud

from . import tracing as _tracing
from .analyze import context as _analysis
from .observers import Observer, held, observed
from .client import grpc_used_in_this_process
from .errors import InvalidRequestError, SidecarError
from .local import LocalClient
from .sidecar import Sidecar
from .device import DevicePrefetcher, DeviceStats
from .echo import Echo, EchoCounts, EchoedIterator
from .sharding import DistributedSampler, distributed_initialized, fit_batches, rank_prefix, shuffles
from .state import STATE_VERSION, CountingIterator, Progress, check_loader_state, check_state, epoch_seed, mid_epoch, position, state_int
from .tracing import StallObserver
from .dataset import Dataset
from .mixture import Mixture
from .sampling import EpochSampler
from .cache_order import CacheFirst, CacheOrderStats, order_window as checked_window


__all__ = ["DataLoader"]

# ---------------------------------------------------------------------------------------------
# DataLoader

_loader_numbers = itertools.count(1)


def _close_session(local: LocalClient, session: int, conn: Optional[Tuple[int, int]]) -> None:
    if local.connection_id == conn:
        try:
            local.close_session(session)
        except SidecarError:
            pass


def _hold_index_queues(iterator: Any) -> None:
    """Keeps the index queues of torch's multiprocessing iterator referenced from outside it until it is gone.

    Its ``__del__`` stops the workers by sending each a None on its index queue. When the iterator dies in a
    reference cycle (an exception's traceback holding the loop's frame), the garbage collector first runs the
    finalizers of the queues found in the cycle with it, which stop their feeder threads: the None is never sent,
    and torch waits 5 s (``MP_STATUS_CHECK_INTERVAL``) for each worker before terminating it. Referenced from here,
    the queues are not part of that garbage; the finalizer below lets go of them once the iterator is."""
    queues = getattr(iterator, "_index_queues", None)
    if queues:
        weakref.finalize(iterator, list.clear, list(queues)).atexit = False


class DataLoader(tud.DataLoader):
    """``torch.utils.data.DataLoader`` over an unstall ``Dataset`` (or a registered dataset's name).

    Same arguments as torch's. Its sampler is wrapped in an ``EpochSampler`` so that every ticket
    carries the epoch (0 for the first iteration, then 1, 2, ...; ``set_epoch`` overrides), also with
    ``persistent_workers=True``. The order of epoch e is a function of ``(seed, e)`` only (``EpochSampler``):
    ``seed``, or ``generator``'s initial seed, or one drawn once from torch's global RNG; the workers' base
    seed is derived from it per epoch too, and each batch's ``loader``/``transform``/``target_transform`` run with
    torch's, python's and numpy's RNGs seeded from ``(seed, epoch, batch)`` (``unstall.sampling.batch_rng``), in
    a worker or in this process (whose own RNGs they leave as they were). ``state_dict()``/``load_state_dict()``
    behave as torchdata's ``StatefulDataLoader``'s: a loader restored in a new process continues with the very next
    batch, with the same random augmentations, on any ``num_workers``.
    In an initialised ``torch.distributed`` job, without ``sampler``/``batch_sampler``, the sampler is an
    ``unstall.torch.DistributedSampler`` (``shuffle``, ``seed`` or 0, this ``batch_size``): one job-wide order
    per epoch, and a state that ``unstall.torch.merge_states`` turns into one a job on any number of ranks loads.
    ``echo=e`` (int >= 1) with ``echo_level="batch"`` or ``"example"``: data echoing (``unstall.echo``), each
    fetched batch (or sample) handed out ``e`` times per epoch, reshuffled by ``(seed, epoch)``; ``len(loader)``
    counts the echoed batches, ``loader.stats()`` the fresh ones too. Batch-level repeats are the same tensors:
    never modify a batch in place. ``state_dict()`` with ``echo > 1`` is taken between epochs only.
    With ``clairvoyant=True`` each epoch's order is drawn when the epoch starts and sent to the sidecar,
    which then reads upcoming misses ahead of consumption (NoPFS-style prefetch, within its window).

    ``order="cache_first"`` (opt-in; Seneca's opportunistic data sampling, Quiver's substitutable hits, within a bounded
    window): when an epoch starts the loader asks the sidecar once which samples it holds (memory cache or disk tier),
    and reorders the seeded order within aligned windows of ``order_window`` positions (default 4 batches) so that
    each window serves its cached samples first and its misses last; the reordered order is sent as the clairvoyant
    plan, so the sidecar reads those misses ahead. Every sample is still delivered exactly once per epoch, none moves
    ``order_window`` positions or more, and the order is a function of (seed, epoch, snapshot): ``state_dict`` carries
    the epoch's snapshot, so a restored loader continues the same order. ``order_stats``: the rank correlation with
    the seeded order and the largest move (``unstall.cache_order``). Not with ``batch_sampler``, a ``Mixture`` or
    ``unstall.torch.DistributedSampler``.

    Over the local socket (``dataset.transport == "shm"``) the loader opens its own **session** in this
    process when it first iterates (``loader.session``): its clairvoyant plans and counters are its own,
    so several loaders on one dataset do not disturb each other, and its workers use it by id. This
    process never uses gRPC then, so workers are forked as torch does by default (lambdas in
    ``transform``, ``collate_fn`` or ``worker_init_fn`` work). Over Flight, once this process has used
    gRPC, workers start from a clean forkserver instead, unless ``multiprocessing_context`` is given.

    When ``dataset`` is a name, ``root``/``format``/``options``/``loader``/``transform``/``target_transform``
    /``sidecar``/``transport`` build the ``Dataset``.

    ``device`` (``"cuda"``, ``"cpu"``, a ``torch.device``): the collated batches (any nesting of tuples, lists
    and dicts of tensors) come out on that device, ``device_prefetch`` of them copied ahead on a side CUDA
    stream while the loop runs (``unstall.device.DevicePrefetcher``); with a CUDA device ``pin_memory``
    defaults to True, so torch's pin thread pins and the copy is asynchronous. ``state_dict`` counts the batches
    handed out, not those in flight; ``device_stats`` reports batches and bytes copied and the training thread's
    CPU and wall time in ``next()`` per batch.

    ``observers`` (``unstall.observers``): what wraps each epoch's iterator, the first innermost; by default
    one ``StallObserver``, whose measurements ``loader.stats()`` reads (``observers=()``: nothing is measured;
    ``iter(loader)`` is torch's iterator inside the ``unstall.state.CountingIterator`` that marks the epoch's end
    for ``state_dict``). In a run of ``unstall analyze`` the analysis wraps them all.
    """

    dataset: Union[Dataset, Mixture]  # always unstall's (a name is looked up); narrows torch's ``Dataset[Any]``

    def __init__(
        self,
        dataset: Union[Dataset, Mixture, str],
        batch_size: Optional[int] = 1,
        shuffle: Optional[bool] = None,
        sampler: Union[tud.Sampler, Iterable[int], None] = None,
        batch_sampler: Union[tud.Sampler, Iterable[Sequence[int]], None] = None,
        num_workers: int = 0,
        collate_fn: Optional[Callable[[List[Any]], Any]] = None,
        pin_memory: Optional[bool] = None,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Optional[Callable[[int], None]] = None,
        multiprocessing_context: Any = None,
        generator: Optional[torch.Generator] = None,
        *,
        prefetch_factor: Optional[int] = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        seed: Optional[int] = None,
        start_epoch: int = 0,
        clairvoyant: bool = False,
        order: str = "sampler",
        order_window: Optional[int] = None,
        sidecar: Optional[Sidecar] = None,
        root: Optional[str] = None,
        format: str = "imagefolder",
        loader: Optional[Callable[[memoryview], Any]] = None,
        transform: Optional[Callable[[Any], Any]] = None,
        target_transform: Optional[Callable[[Any], Any]] = None,
        transport: Optional[str] = None,
        options: Optional[dict[str, Any]] = None,
        echo: int = 1,
        echo_level: str = "batch",
        device: Union[str, torch.device, None] = None,
        device_prefetch: int = 2,
        observers: Optional[Sequence[Observer]] = None,
    ) -> None:
        self.observers: Tuple[Observer, ...] = held(self, (StallObserver(),) if observers is None else observers)
        if not isinstance(device_prefetch, int) or device_prefetch < 1:
            raise ValueError(f"device_prefetch (batches in flight) must be an int >= 1, got {device_prefetch!r}")
        self.device = torch.device(device) if device is not None else None
        self.device_prefetch = device_prefetch
        self.device_stats = DeviceStats()  # the last hop's batches, bytes and hand-out CPU time, over all epochs
        if pin_memory is None:  # torch's pin thread pins, so the side stream's copy is asynchronous
            pin_memory = self.device is not None and self.device.type == "cuda"
        self.echo = Echo.of(echo, echo_level)  # data echoing (unstall.echo): the epoch's batches handed out echo times
        self.echo_counts: EchoCounts = self.echo.counts()
        if isinstance(dataset, str):
            dataset = Dataset(
                dataset,
                root=root,
                format=format,
                options=options,
                transform=transform,
                target_transform=target_transform,
                loader=loader,
                sidecar=sidecar,
                transport=transport,
            )
        elif isinstance(dataset, (Dataset, Mixture)):
            given = [k for k, v in (("root", root), ("loader", loader), ("transform", transform),
                                    ("target_transform", target_transform), ("sidecar", sidecar),
                                    ("transport", transport), ("options", options)) if v is not None]
            if given:
                raise ValueError(f"{', '.join(given)} only apply when dataset is a name; set them on the Dataset")
        else:
            raise TypeError(
                f"unstall.torch.DataLoader needs an unstall.torch.Dataset, a Mixture or a dataset name, got "
                f"{type(dataset).__name__}"
            )
        if seed is not None and generator is not None:
            raise ValueError("pass either seed or generator, not both")
        # The base seed: the order of epoch e is a function of (seed, e) (EpochSampler); without seed or
        # generator it is drawn from torch's global RNG when first needed.
        base_seed = int(seed) if seed is not None else int(generator.initial_seed()) if generator is not None else None
        # Reseeded per epoch from (seed, epoch) in _get_iterator: the workers' base seed.
        generator = torch.Generator()

        window = checked_window(order, order_window, batch_size or 1)
        self.cache_order: Optional[CacheFirst] = None
        if window is not None:
            if not isinstance(dataset, Dataset):
                raise ValueError(f"order='cache_first' needs an unstall.torch.Dataset (one cache snapshot), not "
                                 f"{type(dataset).__name__}")
            if batch_sampler is not None:
                raise ValueError("order='cache_first' reorders a sampler's indices: pass sampler=, not batch_sampler=")
            self.cache_order = CacheFirst(window, self._cache_snapshot)
        # Clairvoyant prefetch (NoPFS): the sampler's order is known once the epoch starts, so send it. A cache-first
        # order is always sent: the sidecar reads its misses ahead while the window's hits are served.
        on_epoch = self._plan_epoch if clairvoyant or self.cache_order is not None else None
        self._clairvoyant = clairvoyant
        self._plan_refused = False  # a cache-first read-ahead plan the sidecar refused: warned once, not sent again
        reorder = self.cache_order.reorder if self.cache_order is not None else None
        self._number = next(_loader_numbers)
        self._session: Optional[int] = None
        self._session_conn: Optional[Tuple[int, int]] = None  # the connection the session belongs to
        self._session_closer: Optional[weakref.finalize] = None
        common = dict(
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            generator=generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )
        batcher = batch_sampler if isinstance(batch_sampler, tud.BatchSampler) else None  # its sampler is known
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last")
            if batcher is not None and isinstance(batcher.sampler, DistributedSampler):
                fit_batches(batcher.sampler, batcher.batch_size, base_seed, "its BatchSampler")
            self.epoch_sampler = EpochSampler(batch_sampler, batched=True, start_epoch=start_epoch, on_epoch=on_epoch,
                                              seed=base_seed)
            super().__init__(dataset, batch_sampler=self.epoch_sampler, **common)
        else:
            if sampler is not None and shuffle:
                raise ValueError("sampler option is mutually exclusive with shuffle")
            if sampler is None and distributed_initialized():
                # One job-wide order dealt to the ranks; its seed is 0 unless given, as torch's (all ranks must agree).
                sampler = DistributedSampler(dataset, shuffle=bool(shuffle), seed=base_seed or 0, batch_size=batch_size)
            elif sampler is None:
                # RandomSampler without a generator: the EpochSampler gives it one, reseeded per epoch.
                sampler = tud.RandomSampler(dataset) if shuffle else tud.SequentialSampler(dataset)
            if isinstance(sampler, DistributedSampler):
                if reorder is not None:
                    raise ValueError("order='cache_first' does not apply over unstall.torch.DistributedSampler: its "
                                     "job-wide order is consumed step by step across ranks, which a rank's reorder "
                                     "would break")
                fit_batches(sampler, batch_size, base_seed)
            self.epoch_sampler = EpochSampler(sampler, batch_size=1 if batch_size is None else int(batch_size),
                                              start_epoch=start_epoch, on_epoch=on_epoch, seed=base_seed,
                                              reorder=reorder)
            super().__init__(
                dataset, batch_size=batch_size, sampler=self.epoch_sampler, drop_last=drop_last, **common
            )
        self._user_context = multiprocessing_context is not None
        # Sampler items per batch handed out: a resumed epoch skips batches_yielded * this in the sampler.
        self._items_per_batch = 1 if batch_sampler is not None else self.epoch_sampler.batch_size
        self._progress: Optional[Progress] = None  # the latest iterator's epoch and batches handed out
        # The job-wide order the loader deals from (its sampler's, or its BatchSampler's): its state is then elastic
        # (unstall.elastic), and a rank's incomplete last batch dropped by the batching counts as consumed.
        dealer = batcher.sampler if batcher is not None else sampler
        self._global = dealer if isinstance(dealer, DistributedSampler) else None
        self._drops_last = bool(batcher.drop_last) if batcher is not None else drop_last
        if isinstance(dataset, Mixture) and shuffles(batch_sampler if batch_sampler is not None else sampler):
            warnings.warn(f"DataLoader shuffles {dataset!r}: a shuffled order loses the proportions of each batch "
                          "(the mixture shuffles each source itself); pass shuffle=False", UserWarning, stacklevel=2)

    def _get_iterator(self) -> Any:
        # Workers forked from a process that has used gRPC (Flight) can hang: start them from a
        # clean forkserver instead, unless the caller chose a context.
        if (
            self.num_workers > 0
            and not self._user_context
            and grpc_used_in_this_process()
            and multiprocessing.get_start_method(allow_none=False) == "fork"
        ):
            ctx = multiprocessing.get_context("forkserver")
            # Preload torch in the fork server so each worker does not import it again (seconds).
            ctx.set_forkserver_preload(["__main__", "torch", "unstall.torch"])
            self.multiprocessing_context = ctx
        # The workers' base seed (their torch/random/numpy seeds) is a function of (seed, epoch) too.
        self.generator.manual_seed(epoch_seed(self.epoch_sampler.seed, self.epoch_sampler.epoch, stream=1))
        iterator = super()._get_iterator()
        _hold_index_queues(iterator)
        return iterator

    def __iter__(self) -> Any:
        self._ensure_session()
        epoch = self.epoch_sampler.epoch
        skipped = self.epoch_sampler.skip // self._items_per_batch
        self._progress = None

        def make_iterator() -> Any:
            stall = self.stall_observer
            if stall is not None:  # fetch and prep are counted where they run: the Dataset takes the path to the workers
                self.dataset.work_counters = stall.work_counters(self.num_workers)
            it = super(DataLoader, self).__iter__()
            # torch's iterator counts the batches it handed out (not what the workers prefetched): the state's
            # position. Held, as torchdata's StatefulDataLoader holds its iterator, until the next iteration.
            # With a device, the prefetcher reads ahead of the loop: its count of batches handed out is the
            # position. Echoed, the count is of the echoed batches handed out (exact between epochs only).
            source: Any = it
            handed: Callable[[], int] = lambda: it._num_yielded  # noqa: E731
            if self.device is not None:
                source = DevicePrefetcher(it, self.device, self.device_prefetch, stats=self.device_stats)
                handed = lambda: source.handed  # noqa: E731
            # The CountingIterator marks the epoch's end (StopIteration): before it, the state is this epoch's.
            if self.echo.factor == 1:
                self._progress = Progress(epoch, skipped, handed)
                return CountingIterator(source, self._progress)
            counts = self.echo_counts
            self._progress = Progress(epoch, skipped, lambda: counts.batches)
            echoed = self.echo.apply(source, seed=self.epoch_sampler.seed, epoch=epoch, batch_size=self.batch_size,
                                     counts=counts)
            return CountingIterator(EchoedIterator(source, echoed, self._echoed_length), self._progress)

        # Torch's iterator inside the loader's observers (the stall observer: loader.stats(), stall spans), the
        # analysis of `unstall analyze` around them all when this process runs under it.
        return observed(self, make_iterator, epoch, (*self.observers, *_analysis.observers()))

    @property
    def session(self) -> Optional[int]:
        """This loader's session on the sidecar's local socket (None over Flight or before iterating)."""
        return self._session

    def _ensure_session(self) -> None:
        """Opens the loader's session over this process's local connection (never over gRPC), once per
        connection: a session ends with the connection that opened it. After a sidecar restart the
        connection moves to the new sidecar first; until then workers fetch with their own sessions."""
        local = getattr(self.dataset, "_local", None)
        if local is None:
            return
        local.follow()
        if self._session is not None and local.connection_id == self._session_conn:
            return
        if self._session_closer is not None:
            self._session_closer.detach()
        self._session = self.dataset.open_session(f"{rank_prefix()}pid {os.getpid()} DataLoader#{self._number}")
        self._session_conn = local.connection_id
        self.epoch_sampler.session = self._session
        self._session_closer = weakref.finalize(self, _close_session, local, self._session, self._session_conn)
        self._session_closer.atexit = False  # at exit the connection closes, and its sessions with it

    def _plan_epoch(self, epoch: int, ids: List[int]) -> None:
        if self._plan_refused:
            return
        try:
            self.dataset.plan(ids, epoch, session=self._session or 0)
        except InvalidRequestError as e:
            if self._clairvoyant:  # asked for: the refusal is the caller's to see
                raise
            # Cache-first read-ahead is an optimisation of an order that is fixed either way: without it (a sidecar
            # started with prefetch off) misses are read when their batch is fetched.
            self._plan_refused = True
            warnings.warn(f"DataLoader over {self.dataset.name!r}, order='cache_first': the sidecar refused the "
                          f"read-ahead plan of its misses ({e}); they are read when their batch is fetched",
                          RuntimeWarning, stacklevel=2)

    def _cache_snapshot(self) -> "np.ndarray":
        assert isinstance(self.dataset, Dataset)
        return self.dataset.cached(session=self._session or 0)

    @property
    def order_stats(self) -> Optional[CacheOrderStats]:
        """With ``order="cache_first"``, the latest epoch's reorder: its rank correlation with the seeded order, the
        most positions a sample moved (below ``order_window``), the cached samples and the snapshot's digest; None
        before the first epoch, or with the sampler's order."""
        return self.cache_order.stats if self.cache_order is not None else None

    @property
    def stall_observer(self) -> Optional[StallObserver]:
        """The first ``StallObserver`` among the loader's observers (None without one)."""
        return next((o for o in self.observers if isinstance(o, StallObserver)), None)

    def stats(self) -> "_tracing.LoaderStats":
        """Stall, fetch/prep time, cache hits and bytes of the current epoch (``.total``: all epochs)."""
        stall = self.stall_observer
        if stall is None:
            raise ValueError(f"DataLoader over {self.dataset.name!r} has no StallObserver among its observers")
        return stall.stats()

    @property
    def epoch(self) -> int:
        """The epoch the next iteration will carry."""
        return self.epoch_sampler.epoch

    def set_epoch(self, epoch: int) -> None:
        """Makes the next iteration epoch ``epoch`` (forwarded to a wrapped ``DistributedSampler``)."""
        self.epoch_sampler.set_epoch(epoch)
        self._progress = None  # an unfinished iterator is abandoned: the state is the next epoch's start

    def __len__(self) -> int:
        """Batches per epoch: torch's count, times ``echo`` (example level: the echoed rows cut into batches)."""
        return self._echoed_length(super().__len__())

    def _echoed_length(self, upstream: int) -> int:
        if self.echo.factor == 1:
            return upstream
        samples = upstream * self.batch_size if self.drop_last and self.batch_size else len(self.sampler)  # type: ignore[arg-type]
        return self.echo.length(upstream, samples, self.batch_size)

    def _num_batches(self) -> Optional[int]:
        try:
            return len(self)
        except TypeError:  # a sampler without __len__
            return None

    def state_dict(self) -> dict[str, Any]:
        """The loader's position, as torchdata's ``StatefulDataLoader.state_dict``: take it between batches;
        ``load_state_dict`` into a new DataLoader built with the same arguments (any ``num_workers``)
        continues with the very next batch. A plain dict of ints and strings (``torch.save`` it):
        ``version``, ``dataset``, ``epoch`` (the one in progress, or the next), ``batches_yielded`` (batches
        of that epoch the loop was handed, not those the workers prefetched), ``num_batches`` (per epoch),
        ``seed`` (the base seed: epoch e's order is a function of (seed, e)) and ``order`` (how that holds:
        ``"seed"``, ``"set_epoch"``, ``"fixed"``, or ``"sampler"``: the wrapped sampler replays from its own
        state, which this does not restore). As torchdata's, taken after an epoch's last batch it is that epoch's
        end: restored, the next ``for`` yields nothing, then the next epoch begins; taken once the ``for`` is over
        (or after ``set_epoch``), it is the next epoch's start.

        Over an ``unstall.torch.DistributedSampler`` (``order`` ``"global"``) it is this rank's state of the job-wide
        order instead of ``num_batches``: ``epoch_size``, ``consumed`` (the positions of the epoch's order its share
        was dealt around), ``world_size``, ``rank``, ``chunk`` (the batch size), ``drop_last`` (the sampler's); taken
        after the rank's last batch of an epoch it is that epoch's end, also when the loader's ``drop_last`` dropped
        an incomplete last batch (those samples count as consumed: they are not delivered that epoch).
        ``merge_states`` of every rank's gives the job state. With ``order="cache_first"`` it also has ``cache_window``
        and, taken inside an epoch, ``cache_snapshot`` (the cache snapshot that epoch was reordered from, a compressed
        bitmap as a string). The same holds with ``batch_sampler=`` a
        ``torch.utils.data.BatchSampler`` over an ``unstall.torch.DistributedSampler`` (its batch size is the chunk)."""
        if self.num_workers > 0 and not self.in_order:
            raise ValueError("state_dict() needs in_order=True: with in_order=False and workers, batches are handed "
                             "out of the sampler's order, so a count of batches does not say which were consumed")
        n = self._num_batches()
        epoch, yielded = position(self._progress, self.epoch, self.epoch_sampler.skip // self._items_per_batch)
        if self._global is not None:
            yielded = self._global.share(epoch).chunks_consumed(yielded, self._drops_last)
        self.echo.check_resumable("DataLoader", mid_epoch(yielded, n))
        state: dict[str, Any] = {
            "version": STATE_VERSION, "dataset": self.dataset.name, "epoch": epoch, "batches_yielded": yielded,
            "seed": self.epoch_sampler.seed, "order": self.epoch_sampler.order}
        if self._global is not None:
            g = self._global
            state.update(epoch_size=g.epoch_size, consumed=[list(r) for r in g.consumed(epoch)],
                         world_size=g.num_replicas, rank=g.rank, chunk=g.chunk, drop_last=g.drop_last)
        elif n is not None:  # a rank's batches per epoch differ with a job-wide order: not a key its ranks share
            state["num_batches"] = n
        if self.cache_order is not None:
            state.update(self.cache_order.state(epoch, mid_epoch(yielded, n)))
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores ``state_dict()`` (call it before iterating): the next iteration is the saved epoch, in the
        same order, without its first ``batches_yielded`` batches (skipped in the sampler, never fetched; all of
        them for a state taken at the epoch's end, so that iteration yields nothing); the epochs after it follow
        as they would have. Over an ``unstall.torch.DistributedSampler`` it takes this rank's own state (same world
        size, rank and batch size) or a job state (``merge_states``) on any world size and batch size, whose
        unconsumed samples the ranks share; either refuses, naming it, a state whose dataset, seed, order or
        epoch_size differ."""
        check_state(state, "DataLoader")
        name = self.dataset.name
        if state.get("dataset", name) != name:
            if isinstance(self.dataset, Mixture):
                self.dataset.check_state_name(state["dataset"])  # names what differs
            raise ValueError(f"DataLoader state_dict was taken from a loader over dataset {state['dataset']!r}; "
                             f"this one reads {name!r}")
        if self._global is not None:
            self._load_global(self._global, state)
            return
        check_loader_state(state, name, self._num_batches(), self.epoch_sampler.order, self.cache_order is not None)
        yielded = state_int(state, "batches_yielded", "DataLoader")
        if self.cache_order is not None:
            self.cache_order.restore(state, state_int(state, "epoch", "DataLoader"), len(self.dataset), "DataLoader")
        self.epoch_sampler.load_state_dict({
            "version": STATE_VERSION, "epoch": state_int(state, "epoch", "DataLoader"),
            "seed": state_int(state, "seed", "DataLoader"), "skip": yielded * self._items_per_batch})
        self._progress = None
        # Persistent workers restart, as torchdata's do: their RNG state belongs to the iterations they served.
        self._iterator = None

    def _load_global(self, g: DistributedSampler, state: Mapping[str, Any]) -> None:
        """Restores a rank's state (same world size, rank and batch size) or a job state (``merge_states``, any)."""
        resume = g.load_state(state, "DataLoader", self.dataset.name)
        self.epoch_sampler.load_state_dict({"version": STATE_VERSION, "epoch": resume.epoch, "seed": g.seed,
                                            "skip": resume.skip * self._items_per_batch})
        self._progress = None
        self._iterator = None
