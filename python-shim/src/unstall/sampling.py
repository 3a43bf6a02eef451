"""Epoch-tagged sampling for ``unstall.torch``: ``EpochIndex`` (a sample index tagged with its epoch, the
loader's session and its batch's seed), ``EpochSampler`` (the sampler that draws them, reseeded per epoch) and
``batch_rng`` (the seeded RNGs a batch's transforms run in)."""

from __future__ import annotations

import contextlib
import itertools
import random
import warnings
from typing import Any, Callable, Iterable, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.utils.data as tud

from .sharding import DistributedSampler
from .state import STATE_VERSION, batch_seed, check_state, epoch_seed, state_int


__all__ = ["EpochIndex", "EpochSampler", "batch_rng", "split_indices"]

# ---------------------------------------------------------------------------------------------
# Epoch-tagged sampling

_MISSING = object()


class EpochIndex(NamedTuple):
    """A sample index tagged with the epoch it is drawn for (it travels in the request), the session of the
    DataLoader that drew it (local socket; 0: the dataset's own session in each process) and the seed of its
    batch's random transforms (``unstall.state.batch_seed``; None: they draw from the process's RNGs)."""

    epoch: int
    index: int  # type: ignore[assignment]  # the name torch users know; shadows tuple.index
    session: int = 0
    batch_seed: Optional[int] = None


def split_indices(indices: Sequence[Any], epoch: int) -> Tuple[List[Tuple[int, int]], List[int]]:
    """A batch's ``(epoch, session)`` per index and its sample indices: an ``EpochIndex`` carries both, a plain int
    is of ``epoch`` (the dataset's own) and its default session 0."""
    groups: List[Tuple[int, int]] = []
    positions: List[int] = []
    for ix in indices:
        if isinstance(ix, EpochIndex):
            groups.append((ix.epoch, ix.session))
            positions.append(ix.index)
        else:
            groups.append((epoch, 0))
            positions.append(int(ix))
    return groups, positions


@contextlib.contextmanager
def batch_rng(indices: Sequence[Any]) -> Iterator[None]:
    """Runs the body (a batch's loader and transforms) with torch's CPU, python's and numpy's global RNGs seeded
    from the batch's seed (its first index's ``batch_seed``): the augmentations of a batch are then a function of
    (seed, epoch, batch) wherever it is prepared. In the main process (no workers) their states are given back
    afterwards, so the trainer's own RNGs do not move; a worker's are the loader's, and are not saved. Without a
    seed (plain int indices) the body draws as it would."""
    first = indices[0] if len(indices) else None
    seed = first.batch_seed if isinstance(first, EpochIndex) else None
    if seed is None:
        yield
        return
    if tud.get_worker_info() is not None:
        # A DataLoader worker's RNGs are the loader's (torch seeds them per worker): seeded per batch, nothing to
        # give back, and saving numpy's state would cost more than the rest together.
        _seed_all(seed)
        yield
        return
    py, legacy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        _seed_all(seed)
        try:
            yield
        finally:
            random.setstate(py)
            np.random.set_state(legacy)


def _seed_all(seed: int) -> None:
    # Not torch.manual_seed: it also queues seeds for every accelerator, this is the CPU generator only.
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    # torch and numpy both start an MT19937 from 32 bits of the seed: torch from the low half, numpy from the high
    # one, or their streams would be the same numbers.
    np.random.seed(seed >> 32)


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
    ``"sampler"``: anything else, whose order comes from its own state, which nothing here restores;
    ``"global"``: ``unstall.torch.DistributedSampler``, told the epoch too, whose job-wide order the loader's
    state records as consumed ranges (``unstall.elastic``)."""
    if isinstance(sampler, DistributedSampler):
        return "global", lambda seed, epoch: sampler.set_epoch(epoch)
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
    """The initial seed of the ``torch.Generator`` a (batch) sampler draws from, if it has one (the seed of
    ``unstall.torch.DistributedSampler``'s order)."""
    if isinstance(sampler, DistributedSampler):
        return sampler.seed
    if isinstance(sampler, tud.BatchSampler):
        return _own_seed(sampler.sampler)
    generator = getattr(sampler, "generator", None)
    return int(generator.initial_seed()) if isinstance(generator, torch.Generator) else None


def _batch_names(sampler: Any, epoch: int) -> Callable[[int], int]:
    """How batch ``k`` of ``epoch`` (counted from the epoch's start) is named in its ``batch_seed``: over
    ``unstall.torch.DistributedSampler``, the job-wide position of its first sample, so that one batch size gives
    the same batches the same draws on any number of ranks; over a sampler of ``num_replicas`` ranks (torch's
    ``DistributedSampler``), the step-major ``k * num_replicas + rank``, so that no two ranks draw alike; else ``k``."""
    if isinstance(sampler, tud.BatchSampler):
        return _batch_names(sampler.sampler, epoch)
    if isinstance(sampler, DistributedSampler):
        return sampler.share(epoch).first_position
    world, rank = getattr(sampler, "num_replicas", None), getattr(sampler, "rank", None)
    if isinstance(world, int) and isinstance(rank, int):
        return lambda k: k * world + rank
    return lambda k: k


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

    **The random transforms of a batch are a function of (seed, epoch, batch) too**: every index carries its
    batch's ``batch_seed`` (``unstall.state.batch_seed``; the dataset runs the batch's transforms in
    ``batch_rng``). A batch is what the wrapped batch sampler yields (``batched``), or ``batch_size`` consecutive
    items (the DataLoader's batch size; 1 without automatic batching), counted from the epoch's start, the skip of
    a resumed epoch included; ``_batch_names`` says how a distributed sampler's batches are named.

    ``reorder(epoch, order)``: given the epoch's whole order, the order to serve instead (``unstall.cache_order``'s
    cache-first order); the skip of a resumed epoch applies to what it returns.

    ``state_dict()``: ``{"version", "epoch", "seed", "order", "skip"}`` (plain ints and strings, for
    ``torch.save``); ``skip`` is how many items (indices, or batches when ``batched``) of ``epoch`` the
    next iteration leaves out, drawn but not yielded (a resumed epoch; a skip of the whole epoch, a state
    taken at its end, makes an iteration that yields nothing). ``load_state_dict`` restores it.
    """

    def __init__(
        self,
        sampler: Iterable[Any],
        *,
        batched: bool = False,
        batch_size: int = 1,
        start_epoch: int = 0,
        on_epoch: Optional[Callable[[int, List[int]], None]] = None,
        seed: Optional[int] = None,
        reorder: Optional[Callable[[int, List[int]], List[int]]] = None,
    ) -> None:
        if reorder is not None and batched:
            raise ValueError("a reordered epoch (reorder) needs a sampler of indices, not a batch sampler")
        if start_epoch < 0:
            raise ValueError(f"start_epoch must be >= 0, got {start_epoch}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size (items per batch) must be an int >= 1, got {batch_size!r}")
        self.sampler = sampler
        self.batched = batched
        self.batch_size = batch_size  # items per batch when not batched: batches name their seeds
        self.on_epoch = on_epoch  # told the epoch's (remaining) order before it starts (clairvoyant prefetch)
        # Given epoch e's whole order, returns the order to serve (unstall.cache_order); a resumed epoch's skip applies
        # to what it returns.
        self.reorder = reorder
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
        e = getattr(self.sampler, "epoch", None) if self.order in ("set_epoch", "global") else None
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
        order: Iterable[Any]
        if self.reorder is not None:
            order = self.reorder(epoch, [int(i) for i in self.sampler])[skip:]
        else:
            order = itertools.islice(self.sampler, skip, None) if skip else self.sampler
        if self.on_epoch is not None:
            order = list(order)  # the order is fixed by the seed: draw it now, replay it below
            if order:  # empty: an epoch restored at its end, nothing left to read
                self.on_epoch(epoch, [int(i) for b in order for i in b] if self.batched else [int(i) for i in order])
        name = _batch_names(self.sampler, epoch)
        if self.batched:
            for k, batch in enumerate(order, skip):
                bs = batch_seed(self.seed, epoch, name(k))
                yield [EpochIndex(epoch, int(i), session, bs) for i in batch]
        else:
            size, k, bs = self.batch_size, -1, 0
            for n, i in enumerate(order, skip):
                if n // size != k:
                    k = n // size
                    bs = batch_seed(self.seed, epoch, name(k))
                yield EpochIndex(epoch, int(i), session, bs)

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
