"""PyTorch integration: a map-style ``Dataset`` served by the sidecar and a ``DataLoader`` that tells
the sidecar which epoch (and session) each batch belongs to.

The data path, top to bottom: the DataLoader's sampler yields ``EpochIndex(epoch, index, session)``;
torch's fetcher hands a whole batch of them to ``Dataset.__getitems__``; that is ONE request: a FETCH on
the sidecar's local socket when it runs on this host (payloads read in place from its shared memory, no
gRPC anywhere), else a Flight DoGet; each row's payload goes through ``loader`` then ``transform``, its
label (or key) through ``target_transform``.

Each epoch's iterator is torch's wrapped by the loader's observers (``unstall.observers``; by default
``unstall.tracing``'s stall observer: ``loader.stats()``, stall spans, the epoch line) and, in a process run
by ``unstall analyze``, by the analysis (``unstall.analyze.context``), composed in ``DataLoader.__iter__``.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import time
import warnings
import weakref
from typing import Any, Callable, Iterable, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import torch
import torch.utils.data as tud
from torch.utils.data import get_worker_info

from ._alloc import tune_worker_allocator
from . import formats as _formats
from . import progress as _progress
from . import tracing as _tracing
from .analyze import context as _analysis
from .observers import Observer, held, observed
from .client import FlightClient, grpc_used_in_this_process
from .errors import SidecarError, SidecarUnavailableError
from .local import LocalClient
from .protocol import DatasetInfo, SampleBatch
from .sidecar import Sidecar, default_sidecar
from .device import DevicePrefetcher, DeviceStats
from .echo import Echo, EchoCounts, EchoedIterator
from .state import STATE_VERSION, Progress, check_state, epoch_seed, position, state_int
from .samples import decode_image, pil_loader, tensor_loader
from .tracing import StallObserver

__all__ = [
    "Dataset",
    "DataLoader",
    "EpochIndex",
    "EpochSampler",
    "epoch_seed",
    "get_worker_info",
    "pil_loader",
    "decode_image",
    "tensor_loader",
    "TRANSPORTS",
    "Observer",
    "StallObserver",
]

log = logging.getLogger("unstall")

TRANSPORTS = ("auto", "shm", "flight")


# ---------------------------------------------------------------------------------------------
# Epoch-tagged sampling

_MISSING = object()


class EpochIndex(NamedTuple):
    """A sample index tagged with the epoch it is drawn for (it travels in the request) and the session
    of the DataLoader that drew it (local socket; 0: the dataset's own session in each process)."""

    epoch: int
    index: int  # type: ignore[assignment]  # the name torch users know; shadows tuple.index
    session: int = 0


def _draw_seed() -> int:
    """A base seed drawn from torch's global RNG, as ``RandomSampler`` draws one without a generator."""
    return int(torch.empty((), dtype=torch.int64).random_().item())


def _reseeder(sampler: Any) -> Tuple[str, Callable[[int, int], None]]:
    """How an epoch's order is made a function of ``(seed, epoch)`` for ``sampler``: ``(order, reseed)``
    where ``order`` names the way (it goes into the state) and ``reseed(seed, epoch)`` applies it.

    ``"set_epoch"``: the sampler's own ``set_epoch`` (``DistributedSampler``: its order is its seed and
    the epoch); ``"seed"``: a sampler drawing from a ``torch.Generator`` (``RandomSampler``,
    ``SubsetRandomSampler``, ``WeightedRandomSampler``; one without a generator is given its own),
    reseeded per epoch; ``"fixed"``: no randomness (``SequentialSampler``, a list or range);
    ``"sampler"``: anything else, whose order comes from its own state, which nothing here restores."""
    if hasattr(sampler, "set_epoch"):
        return "set_epoch", lambda seed, epoch: sampler.set_epoch(epoch)
    if isinstance(sampler, tud.BatchSampler):
        return _reseeder(sampler.sampler)
    generator = getattr(sampler, "generator", _MISSING)
    if generator is None or isinstance(generator, torch.Generator):
        if generator is None:
            sampler.generator = torch.Generator()

        def reseed(seed: int, epoch: int) -> None:
            sampler.generator.manual_seed(epoch_seed(seed, epoch))

        return "seed", reseed
    if isinstance(sampler, (tud.SequentialSampler, range, list, tuple)):
        return "fixed", lambda seed, epoch: None
    return "sampler", lambda seed, epoch: None


def _own_seed(sampler: Any) -> Optional[int]:
    """The initial seed of the ``torch.Generator`` a (batch) sampler draws from, if it has one."""
    if isinstance(sampler, tud.BatchSampler):
        return _own_seed(sampler.sampler)
    generator = getattr(sampler, "generator", None)
    return int(generator.initial_seed()) if isinstance(generator, torch.Generator) else None


class EpochSampler(tud.Sampler):
    """Wraps a sampler (or, with ``batched=True``, a batch sampler) and tags what it yields with the epoch.

    The epoch starts at 0 and advances each time a new iteration starts, so it stays right with
    ``persistent_workers=True`` (the index goes to the worker with each batch). ``set_epoch(e)`` makes
    the next iteration epoch ``e``, like ``DistributedSampler.set_epoch``.

    **The order of epoch e is a function of (seed, e) only**, however many epochs ran before in this
    process: before each epoch a sampler with ``set_epoch`` (``DistributedSampler``) is told the epoch,
    and one drawing from a ``torch.Generator`` (``RandomSampler``...) has it reseeded with
    ``epoch_seed(seed, e)``. ``seed`` is the base seed: given, else the initial seed of the wrapped
    sampler's generator, else drawn once from torch's global RNG (as ``RandomSampler`` does) when
    first needed; it is part of the state. A wrapped sampler whose ``epoch`` the caller sets itself
    (``sampler.set_epoch(e)`` before each epoch, the usual ``DistributedSampler`` loop) is followed: the
    iteration carries that epoch. A sampler with neither (a custom random sampler) replays from its own
    state, which ``state_dict`` does not hold: its ``"order"`` is ``"sampler"`` and restoring warns.

    ``state_dict()``: ``{"version", "epoch", "seed", "order", "skip"}`` (plain ints and strings, for
    ``torch.save``); ``skip`` is how many items (indices, or batches when ``batched``) of ``epoch`` the
    next iteration leaves out, drawn but not yielded (a resumed epoch). ``load_state_dict`` restores it.
    """

    def __init__(
        self,
        sampler: Iterable[Any],
        *,
        batched: bool = False,
        start_epoch: int = 0,
        on_epoch: Optional[Callable[[int, List[int]], None]] = None,
        seed: Optional[int] = None,
    ) -> None:
        if start_epoch < 0:
            raise ValueError(f"start_epoch must be >= 0, got {start_epoch}")
        self.sampler = sampler
        self.batched = batched
        self.on_epoch = on_epoch  # told the epoch's (remaining) order before it starts (clairvoyant prefetch)
        self._seed = int(seed) if seed is not None else _own_seed(sampler)
        self.order, self._reseed = _reseeder(sampler)
        self._next_epoch = start_epoch
        self._explicit = False  # the next epoch was set here (set_epoch, load_state_dict): it wins
        self._told: Optional[int] = self._sampler_epoch()  # the wrapped sampler's epoch as last set here
        self._skip = 0  # items of epoch _next_epoch the next iteration leaves out
        self.last_epoch: Optional[int] = None
        self.session = 0  # the DataLoader's session, set before it iterates (local socket only)

    @property
    def seed(self) -> int:
        """The base seed (drawn from torch's global RNG on first use when none was given)."""
        if self._seed is None:
            self._seed = _draw_seed()
        return self._seed

    def _sampler_epoch(self) -> Optional[int]:
        e = getattr(self.sampler, "epoch", None) if self.order == "set_epoch" else None
        return e if isinstance(e, int) and not isinstance(e, bool) else None

    @property
    def epoch(self) -> int:
        """The epoch the next iteration will carry."""
        if not self._explicit:
            own = self._sampler_epoch()
            if own is not None and own != self._told:  # the caller set the wrapped sampler's epoch itself
                return own
        return self._next_epoch

    @property
    def skip(self) -> int:
        """Items (indices, or batches when ``batched``) of the next epoch that its iteration leaves out."""
        return self._skip if self.epoch == self._next_epoch else 0

    def set_epoch(self, epoch: int) -> None:
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch != self._next_epoch:
            self._skip = 0  # a resumed epoch's skip applies to that epoch only
        self._next_epoch = int(epoch)
        self._explicit = True

    def __iter__(self) -> Iterator[Any]:
        # A generator: torch calls iter() on the sampler more than once per epoch (once in
        # _BaseDataLoaderIter.__init__, again in _reset), the epoch only advances when iteration starts.
        epoch, skip = self.epoch, self.skip
        self._next_epoch = epoch + 1
        self._explicit = False
        self._skip = 0
        self.last_epoch = epoch
        session = self.session
        self._reseed(self.seed, epoch)
        self._told = self._sampler_epoch()
        order: Iterable[Any] = itertools.islice(self.sampler, skip, None) if skip else self.sampler
        if self.on_epoch is not None:
            order = list(order)  # the order is fixed by the seed: draw it now, replay it below
            self.on_epoch(epoch, [int(i) for b in order for i in b] if self.batched else [int(i) for i in order])
        if self.batched:
            for batch in order:
                yield [EpochIndex(epoch, int(i), session) for i in batch]
        else:
            for i in order:
                yield EpochIndex(epoch, int(i), session)

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]

    def state_dict(self) -> dict[str, Union[int, str]]:
        return {"version": STATE_VERSION, "epoch": self.epoch, "seed": self.seed, "order": self.order,
                "skip": self.skip}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores ``state_dict()``: the next iteration is ``state["epoch"]`` with the same order, less its
        first ``state["skip"]`` items. Warns when the wrapped sampler's order cannot be restored."""
        check_state(state, "EpochSampler")
        epoch, skip = state_int(state, "epoch", "EpochSampler"), state_int(state, "skip", "EpochSampler")
        self._seed = state_int(state, "seed", "EpochSampler")
        self.set_epoch(epoch)
        self._skip = skip
        if self.order == "sampler" and (skip or epoch):
            warnings.warn(
                f"restoring epoch {epoch}: {type(self.sampler).__name__} can be neither told the epoch (set_epoch) "
                "nor reseeded (a torch.Generator), so its order comes from its own state, which the state_dict does "
                "not restore; the resumed epoch may repeat or miss samples", stacklevel=2)


# ---------------------------------------------------------------------------------------------
# Dataset

Index = Union[int, EpochIndex]


def _resolve_transport(transport: Optional[str]) -> str:
    t = transport if transport is not None else (os.environ.get("UNSTALL_TRANSPORT") or "auto")
    t = str(t).strip().lower()
    if t not in TRANSPORTS:
        source = "transport" if transport is not None else "UNSTALL_TRANSPORT"
        raise ValueError(f"{source} must be 'auto', 'shm' or 'flight', got {t!r}")
    return t


def _open_local(sidecar: Any, wanted: str) -> Optional[LocalClient]:
    """The sidecar's local socket, connected, or None (``auto``) or an error saying why (``shm``)."""
    make = getattr(sidecar, "local_client", None)
    client = make() if make is not None else None
    if client is None:
        why = ("the sidecar advertises no local socket: it runs on another host, with --no-shm or without a "
               "writable /dev/shm, or was attached by address while $UNSTALL_HOME/sidecar.json names no such "
               "sidecar")
    else:
        try:
            return client.connect()
        except SidecarError as e:
            why = str(e)
    if wanted == "shm":
        raise SidecarUnavailableError(f"transport 'shm' is not available: {why}", "UNAVAILABLE")
    log.debug("unstall: local socket unavailable (%s); using Flight", why)
    return None


class Dataset(tud.Dataset):
    """A dataset registered with the sidecar, indexed like ``torchvision.datasets.ImageFolder``.

    ``dataset[i]`` is ``(sample, target)``: ``sample = transform(loader(payload))``, ``target =
    target_transform(label)`` where the label is the class index (imagefolder) or the sample's key
    ``shard@offset`` for formats without labels (tfrecord). A batch of indices (``__getitems__``, which
    torch's fetcher calls) is one request to the sidecar.

    The formats ``webdataset``, ``npy``, ``npz`` and ``csv`` (``unstall.formats``) decode their samples
    themselves, as the format's own reader does: a webdataset dict (or, with ``options={"payload": ...}``,
    the payload's bytes), a numpy row, a CSV row's dict. ``dataset[i]`` is then ``transform(sample)`` alone,
    or ``(transform(sample), target_transform(label))`` when ``options`` name a ``label``. A ``loader``
    given for them replaces the decoder: it receives the stored bytes of the sample.

    ``loader`` receives the payload as a read-only ``memoryview``, in place (no copy): in the sidecar's
    shared memory, or in the received Flight buffer. Return something that owns its data (a decoded
    image, ``bytes(view)``): a view is not picklable (DataLoader workers send samples to the trainer),
    and one kept alive pins the shared memory it maps. Without ``loader`` the sample is the payload as
    ``bytes`` (one copy). ``pil_loader``, ``decode_image`` and ``tensor_loader`` take any buffer.

    ``transport``: ``"auto"`` (the default, or ``$UNSTALL_TRANSPORT``) uses the sidecar's local socket
    when it advertises one that answers (same host: shared memory, no gRPC, so DataLoader workers can
    be forked) and Flight otherwise; ``"shm"`` requires the local socket (an error says why it is not
    available); ``"flight"`` always uses Flight. ``self.transport`` is the one chosen.

    With ``root`` the dataset is registered (a no-op when it already is, alike); without, it must
    already be registered.

    ``work_counters``: the path of the shared-memory table (``unstall.tracing.WorkCounters``) where this
    process and each DataLoader worker add up their fetch and prep time; set by the iterating
    DataLoader from its stall observer before its workers start, so that it reaches them with the pickled
    Dataset. None while no DataLoader counts for the dataset.
    """

    work_counters: Optional[str] = None

    def __init__(
        self,
        name: str,
        root: Union[str, "os.PathLike[str]", None] = None,
        format: str = "imagefolder",
        transform: Optional[Callable[[Any], Any]] = None,
        target_transform: Optional[Callable[[Any], Any]] = None,
        loader: Optional[Callable[[memoryview], Any]] = None,
        sidecar: Optional[Sidecar] = None,
        options: Optional[dict[str, Any]] = None,
        transport: Optional[str] = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a dataset name (non-empty str) is required, got {name!r}")
        wanted = _resolve_transport(transport)
        sidecar = sidecar if sidecar is not None else default_sidecar()
        if root is not None:
            with _progress.while_running(f"indexing {name!r} ({root})"):
                self.info: DatasetInfo = sidecar.register_dataset(name, os.fspath(root), format=format, options=options)
        else:
            self.info = sidecar.describe(name)
        self.name = name
        self.root = root
        self.format = self.info.format
        self.transform = transform
        self.target_transform = target_transform
        self.loader = loader
        self.decoder: Optional[_formats.Decoder] = _formats.decoder_for(self.info) if loader is None else None
        self.classes: List[str] = list(self.info.classes or [])
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.epoch = 0  # used for plain int indices (a stock torch DataLoader); EpochIndex carries its own
        self._client: FlightClient = sidecar.flight_client()  # connects only if used
        self._local: Optional[LocalClient] = _open_local(sidecar, wanted) if wanted != "flight" else None
        self.transport = "shm" if self._local is not None else "flight"
        self.work_counters = None
        _tracing.bind_sidecar(self, sidecar)  # loader.stats() reads cache counters over the control plane

    def __repr__(self) -> str:
        where = self._local.socket_path if self._local is not None else self._client.location
        return (
            f"unstall.torch.Dataset({self.name!r}, format={self.format!r}, "
            f"num_samples={len(self)}, transport={self.transport!r}, sidecar={where!r})"
        )

    def __len__(self) -> int:
        return self.info.num_samples

    def set_epoch(self, epoch: int) -> None:
        """The epoch reported for plain int indices (the DataLoader here tags indices itself)."""
        self.epoch = int(epoch)

    def _session(self, session: int) -> int:
        assert self._local is not None
        return session or self._local.default_session(self.name)

    def fetch_samples(self, ids: Union[Sequence[int], np.ndarray], epoch: Optional[int] = None,
                      session: int = 0) -> SampleBatch:
        """The samples ``ids`` in order, payloads as read-only views (no copy): one request. ``session``
        (local socket only) is a DataLoader's; 0 is this process's own session of the dataset. After a
        sidecar fault the client asks for the same ids again, so each sample is delivered once."""
        epoch = self.epoch if epoch is None else epoch
        t0 = time.perf_counter_ns()
        if self._local is not None:
            batch = self._local.fetch(self._session(session), ids, epoch, dataset=self.name)
        else:
            batch = self._client.fetch_samples(self.name, ids, epoch)
        _tracing.record_fetch(self, len(batch), batch.nbytes, time.perf_counter_ns() - t0, batch.transport)
        return batch

    def fetch(self, ids: Union[Sequence[int], np.ndarray], epoch: Optional[int] = None) -> pa.RecordBatch:
        """The batch for ``ids`` as Arrow (``id``, ``label``, ``key``, ``payload``): one request (over the
        local socket, a copy of the shared-memory payloads)."""
        return self.fetch_samples(ids, epoch).to_arrow()

    def plan(self, ids: Sequence[int], epoch: int, session: int = 0) -> int:
        """Tells the sidecar the epoch's whole order so it reads upcoming misses ahead: a PLAN for
        ``session`` on the local socket, the ``prefetch`` action over Flight. Returns the planned count.
        A plan names at most one id per sample (the sidecar refuses longer ones): of a sampler that draws
        more (with replacement), the first ``len(self)`` ids are planned."""
        ids = ids[: len(self)]
        if self._local is not None:
            return self._local.plan(self._session(session), ids, epoch, dataset=self.name)
        return self._client.prefetch(self.name, ids, epoch)

    def open_session(self, name: str) -> int:
        """A new session on the local socket (owned by this process's connection); needs transport 'shm'."""
        if self._local is None:
            raise SidecarUnavailableError(f"dataset {self.name!r} uses Flight, which has no sessions")
        return self._local.open_session(self.name, name)

    def __getitem__(self, index: Index) -> Tuple[Any, Any]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[Index]) -> List[Tuple[Any, Any]]:
        if len(indices) == 0:
            return []
        groups: List[Tuple[int, int]] = []  # (epoch, session) of each index
        ids: List[int] = []
        for ix in indices:
            if isinstance(ix, EpochIndex):
                groups.append((ix.epoch, ix.session))
                ids.append(ix.index)
            else:
                groups.append((self.epoch, 0))
                ids.append(int(ix))
        n = len(self)
        for i in ids:
            if i < 0:  # negative indices: as for sequences, but the wire carries unsigned ids
                raise IndexError(f"sample index {i} is out of range for dataset {self.name!r} of {n} samples")
        if all(g == groups[0] for g in groups):
            return self._convert(self.fetch_samples(ids, *groups[0]))
        # Mixed epochs or sessions (a custom sampler): one request each, results put back in the asked order.
        out: List[Any] = [None] * len(ids)
        for g in sorted(set(groups)):
            pos = [p for p, pg in enumerate(groups) if pg == g]
            for p, item in zip(pos, self._convert(self.fetch_samples([ids[p] for p in pos], *g))):
                out[p] = item
        return out

    def _convert(self, batch: SampleBatch) -> List[Tuple[Any, Any]]:
        tune_worker_allocator()  # a worker keeps its freed heap for the next batch (unstall/_alloc.py)
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        if self.decoder is not None:
            out = self._decoded(self.decoder, batch)
            _tracing.record_prep(self, len(out), time.perf_counter_ns() - t0, time.thread_time_ns() - c0)
            return out
        load = self.loader if self.loader is not None else bytes
        out = []
        for payload, label, key in zip(batch.payloads, batch.label_list(), batch.keys):
            sample = load(payload)
            if self.transform is not None:
                sample = self.transform(sample)
            target = label if label is not None else key
            if self.target_transform is not None:
                target = self.target_transform(target)
            out.append((sample, target))
        _tracing.record_prep(self, len(out), time.perf_counter_ns() - t0, time.thread_time_ns() - c0)
        return out

    def _decoded(self, decoder: "_formats.Decoder", batch: SampleBatch) -> List[Any]:
        items = decoder.decode(batch.payloads, batch.label_list(), batch.keys)
        transform, target_transform = self.transform, self.target_transform
        if not decoder.labelled:
            return items if transform is None else [transform(s) for s in items]
        return [(s if transform is None else transform(s), t if target_transform is None else target_transform(t))
                for s, t in items]

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()  # the clients drop their connections themselves; no Sidecar is held


# ---------------------------------------------------------------------------------------------
# DataLoader

_loader_numbers = itertools.count(1)


def _rank_prefix() -> str:
    """``"rank R "`` (and ``"local L "``) in a distributed job, as torch numbers its processes: the rank from an
    initialized ``torch.distributed`` group, else ``$RANK`` (torchrun, SLURM through it), and ``$LOCAL_RANK``.
    Ranks sharing one sidecar then tell their sessions apart in ``sidecar.stats()``; "" outside such a job."""
    rank: Optional[str] = None
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank = str(dist.get_rank())
    except (ImportError, RuntimeError):
        pass
    rank = rank if rank is not None else os.environ.get("RANK", "").strip() or None
    if rank is None:
        return ""
    local = os.environ.get("LOCAL_RANK", "").strip()
    return f"rank {rank} " + (f"local {local} " if local else "")


def _close_session(local: LocalClient, session: int, conn: Optional[Tuple[int, int]]) -> None:
    if local.connection_id == conn:
        try:
            local.close_session(session)
        except SidecarError:
            pass


class DataLoader(tud.DataLoader):
    """``torch.utils.data.DataLoader`` over an unstall ``Dataset`` (or a registered dataset's name).

    Same arguments as torch's. Its sampler is wrapped in an ``EpochSampler`` so that every ticket
    carries the epoch (0 for the first iteration, then 1, 2, ...; ``set_epoch`` overrides), also with
    ``persistent_workers=True``. The order of epoch e is a function of ``(seed, e)`` only (``EpochSampler``):
    ``seed``, or ``generator``'s initial seed, or one drawn once from torch's global RNG; the workers' base
    seed is derived from it per epoch too. ``state_dict()``/``load_state_dict()`` behave as torchdata's
    ``StatefulDataLoader``'s: a loader restored in a new process continues with the very next batch.
    ``echo=e`` (int >= 1) with ``echo_level="batch"`` or ``"example"``: data echoing (``unstall.echo``), each
    fetched batch (or sample) handed out ``e`` times per epoch, reshuffled by ``(seed, epoch)``; ``len(loader)``
    counts the echoed batches, ``loader.stats()`` the fresh ones too. Batch-level repeats are the same tensors:
    never modify a batch in place. ``state_dict()`` with ``echo > 1`` is taken between epochs only.
    With ``clairvoyant=True`` each epoch's order is drawn when the epoch starts and sent to the sidecar,
    which then reads upcoming misses ahead of consumption (NoPFS-style prefetch, within its window).

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
    CPU time per batch.

    ``observers`` (``unstall.observers``): what wraps each epoch's iterator, the first innermost; by default
    one ``StallObserver``, whose measurements ``loader.stats()`` reads (``observers=()``: ``iter(loader)`` is
    torch's iterator and nothing is measured). In a run of ``unstall analyze`` the analysis wraps them all.
    """

    dataset: Dataset  # always unstall's (a name is looked up); narrows torch's ``Dataset[Any]``

    def __init__(
        self,
        dataset: Union[Dataset, str],
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
        elif isinstance(dataset, Dataset):
            given = [k for k, v in (("root", root), ("loader", loader), ("transform", transform),
                                    ("target_transform", target_transform), ("sidecar", sidecar),
                                    ("transport", transport), ("options", options)) if v is not None]
            if given:
                raise ValueError(f"{', '.join(given)} only apply when dataset is a name; set them on the Dataset")
        else:
            raise TypeError(
                f"unstall.torch.DataLoader needs an unstall.torch.Dataset or a dataset name, got {type(dataset).__name__}"
            )
        if seed is not None and generator is not None:
            raise ValueError("pass either seed or generator, not both")
        # The base seed: the order of epoch e is a function of (seed, e) (EpochSampler); without seed or
        # generator it is drawn from torch's global RNG when first needed.
        base_seed = int(seed) if seed is not None else int(generator.initial_seed()) if generator is not None else None
        # Reseeded per epoch from (seed, epoch) in _get_iterator: the workers' base seed.
        generator = torch.Generator()

        # Clairvoyant prefetch (NoPFS): the sampler's order is known once the epoch starts, so send it.
        on_epoch = self._plan_epoch if clairvoyant else None
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
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last")
            self.epoch_sampler = EpochSampler(batch_sampler, batched=True, start_epoch=start_epoch, on_epoch=on_epoch,
                                              seed=base_seed)
            super().__init__(dataset, batch_sampler=self.epoch_sampler, **common)
        else:
            if sampler is not None and shuffle:
                raise ValueError("sampler option is mutually exclusive with shuffle")
            if sampler is None:
                # RandomSampler without a generator: the EpochSampler gives it one, reseeded per epoch.
                sampler = tud.RandomSampler(dataset) if shuffle else tud.SequentialSampler(dataset)
            self.epoch_sampler = EpochSampler(sampler, start_epoch=start_epoch, on_epoch=on_epoch, seed=base_seed)
            super().__init__(
                dataset, batch_size=batch_size, sampler=self.epoch_sampler, drop_last=drop_last, **common
            )
        self._user_context = multiprocessing_context is not None
        # Sampler items per batch handed out: a resumed epoch skips batches_yielded * this in the sampler.
        self._items_per_batch = 1 if batch_sampler is not None or batch_size is None else int(batch_size)
        self._progress: Optional[Progress] = None  # the latest iterator's epoch and batches handed out

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
        return super()._get_iterator()

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
            if self.echo.factor == 1:
                self._progress = Progress(epoch, skipped, handed)
                return source
            counts = self.echo_counts
            self._progress = Progress(epoch, skipped, lambda: counts.batches)
            echoed = self.echo.apply(source, seed=self.epoch_sampler.seed, epoch=epoch, batch_size=self.batch_size,
                                     counts=counts)
            return EchoedIterator(source, echoed, self._echoed_length)

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
        self._session = self.dataset.open_session(f"{_rank_prefix()}pid {os.getpid()} DataLoader#{self._number}")
        self._session_conn = local.connection_id
        self.epoch_sampler.session = self._session
        self._session_closer = weakref.finalize(self, _close_session, local, self._session, self._session_conn)
        self._session_closer.atexit = False  # at exit the connection closes, and its sessions with it

    def _plan_epoch(self, epoch: int, ids: List[int]) -> None:
        self.dataset.plan(ids, epoch, session=self._session or 0)

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

    def state_dict(self) -> dict[str, Union[int, str]]:
        """The loader's position, as torchdata's ``StatefulDataLoader.state_dict``: take it between batches;
        ``load_state_dict`` into a new DataLoader built with the same arguments (any ``num_workers``)
        continues with the very next batch. A plain dict of ints and strings (``torch.save`` it):
        ``version``, ``dataset``, ``epoch`` (the one in progress, or the next), ``batches_yielded`` (batches
        of that epoch the loop was handed, not those the workers prefetched), ``num_batches`` (per epoch),
        ``seed`` (the base seed: epoch e's order is a function of (seed, e)) and ``order`` (how that holds:
        ``"seed"``, ``"set_epoch"``, ``"fixed"``, or ``"sampler"``: the wrapped sampler replays from its own
        state, which this does not restore). Taken after an epoch's last batch, it is the next epoch's start."""
        if self.num_workers > 0 and not self.in_order:
            raise ValueError("state_dict() needs in_order=True: with in_order=False and workers, batches are handed "
                             "out of the sampler's order, so a count of batches does not say which were consumed")
        n = self._num_batches()
        epoch, yielded = position(self._progress, self.epoch, self.epoch_sampler.skip // self._items_per_batch, n)
        self.echo.check_resumable("DataLoader", yielded > 0)
        state: dict[str, Union[int, str]] = {
            "version": STATE_VERSION, "dataset": self.dataset.name, "epoch": epoch, "batches_yielded": yielded,
            "seed": self.epoch_sampler.seed, "order": self.epoch_sampler.order}
        if n is not None:
            state["num_batches"] = n
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores ``state_dict()`` (call it before iterating): the next iteration is the saved epoch, in the
        same order, without its first ``batches_yielded`` batches (skipped in the sampler, never fetched);
        the epochs after it follow as they would have."""
        check_state(state, "DataLoader")
        name = self.dataset.name
        if state.get("dataset", name) != name:
            raise ValueError(f"DataLoader state_dict was taken from a loader over dataset {state['dataset']!r}; "
                             f"this one reads {name!r}")
        n = self._num_batches()
        if "num_batches" in state and n is not None and state["num_batches"] != n:
            raise ValueError(f"DataLoader state_dict was taken from a loader with {state['num_batches']} batches per "
                             f"epoch over dataset {name!r}; this one has {n} (build it with the same batch_size, "
                             "drop_last and sampler)")
        if state.get("order", self.epoch_sampler.order) != self.epoch_sampler.order:
            raise ValueError(f"DataLoader state_dict was taken from a loader whose order is {state['order']!r}; this "
                             f"one's is {self.epoch_sampler.order!r} (build it with the same shuffle and sampler)")
        yielded = state_int(state, "batches_yielded", "DataLoader")
        self.epoch_sampler.load_state_dict({
            "version": STATE_VERSION, "epoch": state_int(state, "epoch", "DataLoader"),
            "seed": state_int(state, "seed", "DataLoader"), "skip": yielded * self._items_per_batch})
        self._progress = None

