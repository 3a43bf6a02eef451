"""Job-wide positions that survive a change of world size: one order per epoch, dealt to ranks step by step.

An epoch's order is ``epoch_size`` positions (samples for ``unstall.torch.DataLoader``, batches for a prep group),
a function of ``(seed, epoch)`` only. What the job consumed of it is a set of positions, kept as sorted disjoint
ranges (``consumed``); the positions not consumed yet, in order, are the epoch's **remaining** sequence. Ranks are
dealt the remaining sequence step by step: step ``s`` gives rank ``r`` the ``chunk`` items (a batch's worth)
``remaining[s*W*chunk + r*chunk:][:chunk]``, so after ``k`` steps on every rank the job consumed a prefix of it.
The items that do not fill a whole step (fewer than ``W*chunk``) are split as evenly as the world size allows,
each rank a contiguous piece (a smaller last batch; a rank may get none): nothing is padded or repeated, and with
``drop_last`` the ``t % W`` last items are left out so that every rank gets as many.

A rank's state records the ``consumed`` its share was dealt from, its ``world_size``/``rank``/``chunk`` and the
chunks it handed out (``batches_yielded``): taking it costs nothing. :func:`merge_states` turns the states of all
``W`` ranks into a **job state** (``"kind": "job"``) whose ``consumed`` is what the whole job consumed; a loader on any
number of ranks, with any chunk, restores from it (:func:`restore`) and deals the rest of the epoch: every position
no rank consumed is delivered exactly once, none that was consumed again. Once every rank is past its share the
job state is the epoch's **end** (all of it consumed): what ``drop_last`` left out, by the dealing above or by a
loader dropping a rank's incomplete last batch (:meth:`Share.chunks_consumed`), is not delivered in that epoch
after a restore either. No torch here.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence, Tuple

from .state import STATE_VERSION, check_state, state_int

__all__ = ["Range", "normalize", "Remaining", "Share", "Resume", "restore", "merge_states", "RANK_KEYS"]

Range = Tuple[int, int]
"""Positions ``[start, end)``."""

RANK_KEYS = ("world_size", "rank", "batches_yielded")
"""The keys of a rank's state that differ between the ranks of one job (the rest must be equal to merge)."""


def normalize(ranges: Iterable[Sequence[int]], size: Optional[int] = None, what: str = "consumed") -> list[Range]:
    """Sorted, disjoint, merged ``[start, end)`` ranges (within ``[0, size)`` when ``size`` is given), or an error
    naming the bad range."""
    out: list[Range] = []
    items = list(ranges)
    try:
        pairs = sorted((r[0], r[1]) for r in items if len(r) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in r))
    except TypeError:
        pairs = []
    if len(pairs) != len(items):
        raise ValueError(f"{what} must be a list of [start, end) pairs of ints, got {items!r}")
    for a, b in pairs:
        if a < 0 or b <= a or (size is not None and b > size):
            bound = f" within [0, {size})" if size is not None else ""
            raise ValueError(f"{what}: range [{a}, {b}) is not a non-empty range of positions{bound}")
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


class Remaining:
    """The positions of ``[0, size)`` not in ``consumed``, in order: ``len()`` of them, and ``ranges(i, j)`` the
    positions of ``remaining[i:j]`` as ranges (a bisection over the gaps, however many positions)."""

    def __init__(self, size: int, consumed: Sequence[Range] = ()) -> None:
        self.size = size
        self.consumed = normalize(consumed, size)
        self._gaps: list[Range] = []
        at = 0
        for a, b in self.consumed:
            if a > at:
                self._gaps.append((at, a))
            at = b
        if at < size:
            self._gaps.append((at, size))
        self._starts = [0]  # remaining index of each gap's first position
        for a, b in self._gaps:
            self._starts.append(self._starts[-1] + b - a)

    def __len__(self) -> int:
        return self._starts[-1]

    def ranges(self, i: int, j: int) -> list[Range]:
        """The positions of ``remaining[i:j]``."""
        out: list[Range] = []
        i, j = max(i, 0), min(j, len(self))
        g = bisect.bisect_right(self._starts, i) - 1
        while i < j:
            a, b = self._gaps[g]
            start = a + i - self._starts[g]
            end = min(b, start + j - i)
            out.append((start, end))
            i += end - start
            g += 1
        return out


class Share:
    """Rank ``rank``'s share of ``remaining`` among ``world`` ranks, ``chunk`` items per step: ``len()`` chunks (the
    rank's batches), ``chunk_range(k)`` the remaining-index range of its ``k``-th, ``first_position(k)`` where it starts,
    ``positions(first)`` the positions of its chunks from the ``first``-th on, in order."""

    def __init__(self, remaining: Remaining, world: int, rank: int, chunk: int, drop_last: bool = False) -> None:
        if world < 1 or not 0 <= rank < world or chunk < 1:
            raise ValueError(f"a share needs world_size >= 1, 0 <= rank < world_size and chunk >= 1; got world_size "
                             f"{world}, rank {rank}, chunk {chunk}")
        self.remaining, self.world, self.rank, self.chunk = remaining, world, rank, chunk
        step = world * chunk
        self._steps = len(remaining) // step
        tail = len(remaining) - self._steps * step
        if drop_last:
            tail -= tail % world
        base, extra = divmod(tail, world)
        self._tail_start = self._steps * step + rank * base + min(rank, extra)
        self._tail_len = base + (1 if rank < extra else 0)

    def __len__(self) -> int:
        return self._steps + (1 if self._tail_len else 0)

    @property
    def num_items(self) -> int:
        return self._steps * self.chunk + self._tail_len

    def chunk_range(self, k: int) -> Range:
        if not 0 <= k < len(self):
            raise IndexError(f"chunk {k} of a share of {len(self)}")
        if k < self._steps:
            start = k * self.world * self.chunk + self.rank * self.chunk
            return start, start + self.chunk
        return self._tail_start, self._tail_start + self._tail_len

    def first_position(self, k: int) -> int:
        """The position of the ``k``-th chunk's first item."""
        return self.remaining.ranges(*self.chunk_range(k))[0][0]

    def positions(self, first: int = 0) -> Iterator[int]:
        for k in range(first, len(self)):
            for a, b in self.remaining.ranges(*self.chunk_range(k)):
                yield from range(a, b)

    def chunks_consumed(self, handed: int, drop_last: bool) -> int:
        """The chunks of this share that ``handed`` batches consumed, for a loader that batches its chunks: with
        ``drop_last`` (torch's: the incomplete last batch is dropped, its samples not delivered that epoch) handing
        out every full chunk consumes the incomplete last one too."""
        if drop_last and handed >= self.num_items // self.chunk:
            return len(self)
        return handed

    def consumed(self, k: int) -> list[Range]:
        """The positions of this rank's first ``k`` chunks."""
        out: list[Range] = []
        for c in range(min(k, len(self))):
            out.extend(self.remaining.ranges(*self.chunk_range(c)))
        return out


@dataclass(frozen=True)
class Resume:
    """Where a rank continues an epoch: its share is dealt from ``consumed`` (job-wide) and it skips the first
    ``skip`` chunks of that share (those it handed out before the state was taken)."""

    epoch: int
    consumed: Tuple[Range, ...]
    skip: int


def _consumed_of(state: Mapping[str, Any], size: int, what: str) -> list[Range]:
    return normalize(state.get("consumed", []), size, f"{what} state_dict: 'consumed'")


def restore(state: Mapping[str, Any], *, world: int, rank: int, chunk: int, what: str) -> Resume:
    """Where this rank (of ``world``, ``chunk`` items per step) continues from ``state``: a job state
    (:func:`merge_states`) on any world size and chunk, or this rank's own state when the world size, rank and
    chunk are unchanged. Refuses, naming the mismatch, a rank's state taken with another world size or chunk."""
    check_state(state, what)
    epoch = state_int(state, "epoch", what)
    size = state_int(state, "epoch_size", what)
    consumed = _consumed_of(state, size, what)
    if state.get("kind") == "job":
        return Resume(epoch, tuple(consumed), 0)
    saved = {k: state_int(state, k, what) for k in ("world_size", "rank", "chunk")}
    here = {"world_size": world, "rank": rank, "chunk": chunk}
    if saved != here:
        diff = ", ".join(f"{k} {saved[k]} (now {here[k]})" for k in saved if saved[k] != here[k])
        raise ValueError(f"{what} state_dict is one rank's, taken with {diff}: to continue on another number of ranks "
                         f"or batch size, merge the states of all {saved['world_size']} ranks with "
                         "unstall.torch.merge_states([...]) and load that on every rank")
    return Resume(epoch, tuple(consumed), state_int(state, "batches_yielded", what))


def _at_one_epoch(states: Sequence[Mapping[str, Any]], what: str) -> list[Mapping[str, Any]]:
    """``states`` with those taken once a rank's ``for`` was over (the next epoch's start: torchdata's semantics)
    restated as the end of the epoch the other ranks are in, so that ranks one loop apart merge."""
    epochs = sorted({state_int(s, "epoch", what) for s in states})
    if len(epochs) != 2 or epochs[1] != epochs[0] + 1:
        return list(states)
    ending = [s for s in states if s["epoch"] == epochs[0]]
    out: list[Mapping[str, Any]] = []
    for s in states:
        if s["epoch"] == epochs[1] and s.get("batches_yielded") == 0 and not s.get("consumed"):
            # its whole share of the earlier epoch: more chunks than it can have (Share caps the count)
            s = dict(s, epoch=epochs[0], consumed=ending[0].get("consumed", []),
                     batches_yielded=state_int(s, "epoch_size", what) + 1)
        out.append(s)
    return out


def merge_states(states: Sequence[Mapping[str, Any]], what: str = "DataLoader") -> dict[str, Any]:
    """The job state of ``states``, one per rank of one job (any order): what the whole job consumed of the epoch,
    loadable on any number of ranks. Refuses, naming what differs, states of different jobs, datasets, seeds,
    epochs or world sizes, a rank given twice or missing."""
    if not states:
        raise ValueError(f"merge_states needs the {what} state_dict of every rank, got none")
    for s in states:
        check_state(s, what)
        if s.get("kind") == "job":
            raise ValueError(f"merge_states takes the states of the ranks; {what} state_dict of kind 'job' is already "
                             "merged: load it as it is")
        if "epoch_size" not in s:
            raise ValueError(f"{what} state_dict has no 'epoch_size': it was not taken over a job-wide order "
                             "(unstall.torch.DistributedSampler, or a prep loader with ranks), so it cannot be merged")
    states = _at_one_epoch(states, what)
    first = states[0]
    shared = [k for k in first if k not in RANK_KEYS]
    for i, s in enumerate(states[1:], 1):
        for k in sorted(set(shared) | (set(s) - set(RANK_KEYS))):
            if s.get(k) != first.get(k):
                raise ValueError(f"{what} state_dicts from different jobs (or different restores of one): {k!r} is "
                                 f"{first.get(k)!r} in the first and {s.get(k)!r} in state {i}")
    world = state_int(first, "world_size", what)
    ranks = sorted(state_int(s, "rank", what) for s in states)
    if any(state_int(s, "world_size", what) != world for s in states):
        sizes = sorted({str(s.get("world_size")) for s in states})
        raise ValueError(f"{what} state_dicts taken with different world sizes {sizes}: merge one job's states")
    if ranks != list(range(world)):
        dup = sorted({r for r in ranks if ranks.count(r) > 1})
        missing = sorted(set(range(world)) - set(ranks))
        raise ValueError(f"{what} state_dicts of a {world}-rank job need ranks 0..{world - 1} once each"
                         + (f"; rank {dup} given more than once" if dup else "")
                         + (f"; missing rank {missing}" if missing else ""))
    size = state_int(first, "epoch_size", what)
    chunk = state_int(first, "chunk", what)
    prior = _consumed_of(first, size, what)
    remaining = Remaining(size, prior)
    consumed = list(prior)
    finished = True
    for s in states:
        share = Share(remaining, world, state_int(s, "rank", what), chunk, bool(s.get("drop_last", False)))
        yielded = state_int(s, "batches_yielded", what)
        consumed.extend(share.consumed(yielded))
        finished = finished and yielded >= len(share)
    if finished:  # every rank is past its share: what drop_last left out of the epoch is not delivered in it either
        consumed = [(0, size)] if size else []
    job = {k: v for k, v in first.items() if k not in RANK_KEYS}
    job.update(kind="job", version=STATE_VERSION, consumed=[list(r) for r in normalize(consumed, size)])
    return job
