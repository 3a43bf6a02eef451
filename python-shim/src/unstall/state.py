"""Loader state shared by ``unstall.torch.DataLoader`` and the prep loaders (``unstall.prep``): where an
iteration stands, counted in the batches the training loop was handed, and the checks of a ``state_dict``.

The state dicts follow torchdata's ``StatefulDataLoader`` in use: taken between batches, restored into a
new loader built with the same arguments, which then continues with the very next batch (after an epoch's
last batch, that is the end of the epoch: ``position``). They are plain
dicts of ints and strings, so ``torch.save`` persists them. No torch import here.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterator, Mapping, Optional, Tuple

import numpy as np

from .observers import IteratorWrapper

__all__ = ["STATE_VERSION", "BATCH_STREAM", "epoch_seed", "batch_seed", "Progress", "CountingIterator", "position",
           "mid_epoch", "check_state", "check_loader_state", "state_int"]

STATE_VERSION = 1
"""The version of every loader ``state_dict()`` (the ``"version"`` key)."""

_U64 = 0xFFFF_FFFF_FFFF_FFFF


@functools.lru_cache(maxsize=256)  # asked once per batch (batch_seed) with the same few arguments
def epoch_seed(seed: int, epoch: int, stream: int = 0) -> int:
    """The seed of epoch ``epoch``'s generator: a function of ``(seed, epoch)`` only (numpy's
    ``SeedSequence``), so the order of an epoch never depends on how far an earlier one advanced.
    ``stream`` separates independent uses (0: the sampler's order, 1: the workers' base seed, 2: data echoing,
    3: a ``Mixture``'s per-source orders, 4: the random transforms of each batch, ``batch_seed``)."""
    entropy = [int(seed) & 0xFFFF_FFFF_FFFF_FFFF, int(epoch), int(stream)]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0])


BATCH_STREAM = 4
"""The ``epoch_seed`` stream of the batches' random transforms."""


def batch_seed(seed: int, epoch: int, batch: int) -> int:
    """The seed of the random transforms of batch ``batch`` of epoch ``epoch`` (``unstall.sampling.batch_rng``): a
    function of ``(seed, epoch, batch)`` only, so a restored loader draws the same augmentations on any number of
    workers. ``batch`` names the batch within its epoch (``unstall.sampling.EpochSampler`` says how)."""
    # splitmix64's finalizer over the epoch's seed and the batch: per batch in the loader's main process, a few
    # integer operations rather than a SeedSequence
    z = (epoch_seed(seed, epoch, BATCH_STREAM) + (int(batch) + 1) * 0x9E3779B97F4A7C15) & _U64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _U64
    return z ^ (z >> 31)


class Progress:
    """One epoch's iteration: its epoch and the batches handed to the loop, ``yielded`` (a resumed epoch
    starts at the count it skipped); ``done`` once the iterator is exhausted. ``counter``: where the count
    of batches handed out is read (torch's iterator keeps one); without, a ``CountingIterator`` adds it up."""

    def __init__(self, epoch: int, start: int, counter: Optional[Callable[[], int]] = None) -> None:
        self.epoch = epoch
        self.start = start
        self.handed = 0
        self.done = False
        self._counter = counter

    @property
    def yielded(self) -> int:
        return self.start + (self._counter() if self._counter is not None else self.handed)


class CountingIterator(IteratorWrapper):
    """The outermost wrapper of an epoch's iterator: counts the batches the loop receives (what workers
    prefetched is not consumed until it is handed out)."""

    def __init__(self, inner: Iterator[Any], progress: Progress) -> None:
        super().__init__(inner)
        self._progress = progress

    def __next__(self) -> Any:
        try:
            batch = next(self._inner)
        except StopIteration:
            self._progress.done = True
            raise
        self._progress.handed += 1
        return batch


def position(progress: Optional[Progress], next_epoch: int, pending: int) -> Tuple[int, int]:
    """``(epoch, batches_yielded)`` of a loader, as torchdata's ``StatefulDataLoader`` counts it: its iteration's
    until that iterator has ended, else the next epoch's (``pending``: batches a restored epoch will skip).
    Taken after an epoch's last batch but before its iterator ended, it is that epoch's end (all its batches
    yielded): restored, the next ``for`` yields nothing and the one after reads the next epoch. Taken once the
    ``for`` is over, it is the next epoch's start."""
    if progress is not None and not progress.done:
        return progress.epoch, progress.yielded
    return next_epoch, pending


def mid_epoch(yielded: int, num_batches: Optional[int]) -> bool:
    """Whether a position lies inside its epoch: some of its batches handed out, not all of them."""
    return yielded > 0 and (num_batches is None or yielded < num_batches)


def check_state(state: Any, what: str) -> None:
    """A ``state_dict`` of this version, or an error naming ``what`` took it."""
    if not isinstance(state, Mapping):
        raise TypeError(f"{what} state_dict must be a dict, got {type(state).__name__}")
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"{what} state_dict has version {state.get('version')!r}; this unstall reads version "
                         f"{STATE_VERSION}")


def state_int(state: Mapping[str, Any], key: str, what: str) -> int:
    """``state[key]``, a non-negative int, or an error naming the key."""
    value = state.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what} state_dict: {key!r} must be a non-negative int, got {value!r}")
    return value


def check_loader_state(state: Mapping[str, Any], dataset: str, num_batches: Optional[int], order: str,
                       cache_first: bool) -> None:
    """Refuses a ``DataLoader`` state whose batches per epoch, order or cache order differ from the loader's,
    naming what differs and how to build a loader it fits."""
    if "num_batches" in state and num_batches is not None and state["num_batches"] != num_batches:
        raise ValueError(f"DataLoader state_dict was taken from a loader with {state['num_batches']} batches per "
                         f"epoch over dataset {dataset!r}; this one has {num_batches} (build it with the same "
                         "batch_size, drop_last and sampler)")
    if state.get("order", order) != order:
        raise ValueError(f"DataLoader state_dict was taken from a loader whose order is {state['order']!r}; this "
                         f"one's is {order!r} (build it with the same shuffle and sampler)")
    if "cache_window" in state and not cache_first:
        raise ValueError("DataLoader state_dict was taken from a loader with order='cache_first'; this one's order "
                         "is 'sampler' (build it with the same order and order_window)")
