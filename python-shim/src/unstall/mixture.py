"""``unstall.torch.Mixture``: several sidecar-served datasets read at fixed proportions, as one map-style dataset
whose position p of epoch e is a fixed sample of a fixed source.

Two parts: ``schedule`` (which source each position draws from: a function of the weights alone, computed once)
and each source's order in an epoch (a permutation per (seed, epoch, source), repeated with fresh permutations
while a source's draws outnumber its samples). A batch of positions becomes one request per source it touches,
each through that source's own ``Dataset.__getitems__``: its transport, session, loader and transforms, all
of them inside the one ``batch_rng`` of the mixture's batch.
"""

from __future__ import annotations

import heapq
import json
import math
import numbers
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch.utils.data as tud

from .dataset import Dataset, Index
from .errors import SidecarUnavailableError
from .sampling import EpochIndex, batch_rng, split_indices
from .state import epoch_seed


__all__ = ["Mixture", "schedule", "ORDER_STREAM"]

ORDER_STREAM = 3
"""The ``epoch_seed`` stream of the sources' orders within an epoch."""

_NAME_PREFIX = "mixture"


def schedule(weights: Sequence[float], n: int) -> np.ndarray:
    """The source (an index into ``weights``) that each of ``n`` positions draws from: for every prefix length
    m, source i has been drawn within one of ``m * w_i`` times (``w`` normalised to sum 1).

    Earliest-deadline-first over each source's draws, as a Pfair schedule on one processor: draw j (1-based)
    of source i is due by ``j / w_i`` and may not go before position ``floor((j - 1) / w_i)``; with the
    weights summing to 1 EDF meets every due time, which bounds each source's lag below one draw. Ties go
    to the lower index, so the result is a function of the weights alone."""
    w = [float(x) for x in weights]
    total = sum(w)
    w = [x / total for x in w]
    out = np.empty(n, dtype=np.int16 if len(w) > 127 else np.int8)
    counts = [0] * len(w)
    ready = [(1.0 / x, i) for i, x in enumerate(w)]  # (due time of the next draw, source): drawable now
    heapq.heapify(ready)
    waiting: List[Tuple[int, int]] = []  # (first position of the next draw, source): not yet
    push, pop, floor = heapq.heappush, heapq.heappop, math.floor
    for t in range(n):
        while waiting and waiting[0][0] <= t:
            i = pop(waiting)[1]
            push(ready, ((counts[i] + 1) / w[i], i))
        # Float rounding can leave no draw ready at a position; the earliest waiting one goes then.
        i = pop(ready)[1] if ready else pop(waiting)[1]
        out[t] = i
        c = counts[i] = counts[i] + 1
        first = floor(c / w[i])
        if first <= t + 1:
            push(ready, ((c + 1) / w[i], i))
        else:
            push(waiting, (first, i))
    return out


class _SourceSessions:
    """The sources' local-socket clients, driven as one the way ``DataLoader`` drives a ``Dataset``'s
    (``follow``, ``connection_id``, ``close_session``): a mixture's session number stands for one session per
    source on the local socket (0 for a source over Flight)."""

    def __init__(self, sources: Sequence[Dataset]) -> None:
        # A Dataset's client of the local socket; None over Flight.
        self.clients = [getattr(s, "_local", None) for s in sources]
        self.opened: Dict[int, Tuple[int, ...]] = {}  # mixture session -> the sources' sessions

    def follow(self) -> bool:
        return any([c.follow() for c in self.clients if c is not None])

    @property
    def connection_id(self) -> Tuple[Any, ...]:
        return tuple(c.connection_id if c is not None else None for c in self.clients)

    def close_session(self, session: int) -> None:
        for client, s in zip(self.clients, self.opened.pop(session, ())):
            if client is not None and s:
                client.close_session(s)


class Mixture(tud.Dataset):
    """Several ``unstall.torch.Dataset``s read at fixed proportions, as one map-style dataset: the weighted
    mixture of Mosaic Streaming's ``Stream(proportion=...)`` and LitData's ``CombinedStreamingDataset(weights=...)``.

    ``Mixture([(dataset, weight), ...], seed=0, samples_per_epoch=None)``: weights are numbers > 0, normalised
    to sum 1 (``mixture.weights``). Iterate it with ``DataLoader(mixture, batch_size=..., shuffle=False)``:
    the mixture does the shuffling, and a shuffled sampler would lose the proportions of each batch (the DataLoader
    warns). Under torch.distributed the loader's default ``DistributedSampler`` deals each rank's batch as a window
    of the schedule, so it holds the proportions too, and the state is the job-wide one (``merge_states``).

    **An epoch is ``samples_per_epoch`` draws** (by samples drawn, not by the first source exhausted; default:
    the sum of the sources' lengths). Position p of epoch e draws from the source ``schedule`` gives it, the
    same every epoch: for every prefix of an epoch each source's count is within one sample of its share,
    so every batch holds the proportions within one sample at its boundaries. Each source is read in its
    own permutation per (seed, epoch, source); a source drawn more often than it has samples starts a fresh
    permutation when one runs out (upsampling), one drawn less reads part of its permutation
    (downsampling). So ``mixture[EpochIndex(e, p)]`` is a function of the sources, weights, ``seed``, ``e``
    and ``p`` only: a ``DataLoader``'s ``state_dict`` resumes it exactly, and a sampler that deals positions
    to ranks deals the same samples.

    Every fetch goes through its source's own request path (one request per source a batch touches), so
    the sidecar's caches, clairvoyant prefetch (``plan``) and the DataLoader's sessions apply to each source.
    ``name`` describes the mixture (its sources, weights, seed and epoch length) and goes into the loader's
    ``state_dict``: a state taken over another mixture is refused, naming what differs.
    """

    def __init__(self, datasets: Sequence[Tuple[Dataset, float]], *, seed: int = 0,
                 samples_per_epoch: Optional[int] = None) -> None:
        if isinstance(datasets, (str, bytes)) or not isinstance(datasets, Sequence) or len(datasets) == 0:
            raise ValueError(f"Mixture needs a non-empty list of (dataset, weight) pairs, got {datasets!r}")
        sources: List[Dataset] = []
        raw: List[float] = []
        for k, entry in enumerate(datasets):
            if not isinstance(entry, (tuple, list)) or len(entry) != 2:
                raise TypeError(f"Mixture entry {k} must be a (dataset, weight) pair, got {entry!r}")
            ds, weight = entry
            if not isinstance(ds, Dataset):
                raise TypeError(f"Mixture entry {k}: the dataset must be an unstall.torch.Dataset, got "
                                f"{type(ds).__name__}")
            if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight) \
                    or weight <= 0:
                raise ValueError(f"Mixture entry {k} (dataset {ds.name!r}): the weight must be a finite number > 0, "
                                 f"got {weight!r}")
            if len(ds) == 0:
                raise ValueError(f"Mixture entry {k}: dataset {ds.name!r} has no samples to draw")
            sources.append(ds)
            raw.append(float(weight))
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise TypeError(f"Mixture seed must be an int, got {seed!r}")
        total = sum(raw)
        if not math.isfinite(total):
            raise ValueError(f"Mixture weights {raw} sum to {total}; scale them down")
        for k, w in enumerate(raw):
            if not math.isfinite(total / w):  # the schedule divides by each normalised weight
                raise ValueError(f"Mixture entry {k} (dataset {sources[k].name!r}): the weight {w!r} is too small "
                                 f"beside the sum of the weights, {total!r}")
        self.sources: Tuple[Dataset, ...] = tuple(sources)
        self.weights: Tuple[float, ...] = tuple(w / total for w in raw)
        self.seed: int = int(seed)
        n = sum(len(s) for s in sources) if samples_per_epoch is None else samples_per_epoch
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"Mixture samples_per_epoch must be an int >= 1, got {samples_per_epoch!r}")
        self.samples_per_epoch: int = int(n)
        self.name: str = _NAME_PREFIX + json.dumps(self._spec(), separators=(",", ":"))
        self.epoch: int = 0  # used for plain int indices (a stock torch DataLoader); EpochIndex carries its own
        self._source_of: np.ndarray = schedule(self.weights, self.samples_per_epoch)  # position -> source
        self._ids: Dict[int, np.ndarray] = {}  # epoch -> position -> sample of its source (the latest epochs)
        local = any(s.transport == "shm" for s in sources)
        self._local: Optional[_SourceSessions] = _SourceSessions(sources) if local else None  # the loader's sessions
        self._next_session: int = 1
        self._work_counters: Optional[str] = None

    def _spec(self) -> Dict[str, Any]:
        return {"sources": [[s.name, w] for s, w in zip(self.sources, self.weights)], "seed": self.seed,
                "samples_per_epoch": self.samples_per_epoch}

    def __repr__(self) -> str:
        parts = ", ".join(f"({s.name!r}, {w:.6g})" for s, w in zip(self.sources, self.weights))
        return (f"unstall.torch.Mixture([{parts}], seed={self.seed}, samples_per_epoch={self.samples_per_epoch}, "
                f"transport={self.transport!r})")

    def __len__(self) -> int:
        return self.samples_per_epoch

    @property
    def transport(self) -> str:
        """The sources' transport: ``"shm"`` or ``"flight"`` when they agree, else ``"mixed"``."""
        kinds = {s.transport for s in self.sources}
        return kinds.pop() if len(kinds) == 1 else "mixed"

    @property
    def work_counters(self) -> Optional[str]:
        """The stall observer's counters table (``Dataset.work_counters``), shared by every source."""
        return self._work_counters

    @work_counters.setter
    def work_counters(self, path: Optional[str]) -> None:
        self._work_counters = path
        for s in self.sources:
            s.work_counters = path

    def set_epoch(self, epoch: int) -> None:
        """The epoch used for plain int indices (the DataLoader here tags indices itself)."""
        self.epoch = int(epoch)

    def draws(self, positions: Union[Sequence[int], np.ndarray], epoch: int) -> Tuple[np.ndarray, np.ndarray]:
        """``(source, sample)`` arrays: what each position of ``epoch`` reads, a source's index in
        ``sources`` and the sample's index in that source."""
        pos = np.asarray(positions, dtype=np.int64)
        bad = pos[(pos < 0) | (pos >= self.samples_per_epoch)]
        if len(bad):
            raise IndexError(f"position {int(bad[0])} is out of range for mixture {self.name} of "
                             f"{self.samples_per_epoch} samples per epoch")
        return self._source_of[pos].astype(np.int64), self._epoch_ids(int(epoch))[pos]

    def _epoch_ids(self, epoch: int) -> np.ndarray:
        ids = self._ids.get(epoch)
        if ids is not None:
            return ids
        ids = np.empty(self.samples_per_epoch, dtype=np.int64)
        positions = np.argsort(self._source_of, kind="stable")  # each source's positions, in order
        ends = np.cumsum(np.bincount(self._source_of, minlength=len(self.sources)))
        base = epoch_seed(self.seed, epoch, stream=ORDER_STREAM)
        for i, source in enumerate(self.sources):
            mine = positions[(ends[i - 1] if i else 0):ends[i]]
            n = len(source)
            rounds = -(-len(mine) // n)
            # One permutation per round, from one generator per (seed, epoch, source).
            orders = np.random.default_rng([base, i]).permuted(np.tile(np.arange(n, dtype=np.int64), (rounds, 1)),
                                                                axis=1)
            ids[mine] = orders.ravel()[: len(mine)]
        self._ids = {e: a for e, a in self._ids.items() if e == epoch - 1}  # a worker may still finish the last epoch
        self._ids[epoch] = ids
        return ids

    def __getitem__(self, index: Index) -> Any:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[Index]) -> List[Any]:
        if len(indices) == 0:
            return []
        groups, positions = split_indices(indices, self.epoch)  # (epoch, session) of each index, and the indices
        out: List[Any] = [None] * len(positions)
        # The batch is seeded once, here: the sources' requests carry no batch_seed, so their transforms draw on
        # from it, one source after the other, rather than each restarting the batch's draws.
        with batch_rng(indices):
            for epoch, session in sorted(set(groups)):
                asked = np.asarray([p for p, g in enumerate(groups) if g == (epoch, session)], dtype=np.int64)
                source_of, ids = self.draws([positions[p] for p in asked], epoch)
                sessions = self._sessions(session)
                for i in np.unique(source_of):
                    mine = np.flatnonzero(source_of == i)
                    batch = [EpochIndex(epoch, int(ids[m]), sessions[i]) for m in mine]
                    for p, item in zip(asked[mine], self.sources[int(i)].__getitems__(batch)):
                        out[p] = item
        return out

    def _sessions(self, session: int) -> Tuple[int, ...]:
        """The sources' sessions for a mixture's session; each source's own (0) for 0, or for a session opened
        after this process got its copy of the mixture (a persistent worker after a sidecar restart)."""
        opened = self._local.opened.get(session) if session and self._local is not None else None
        return opened if opened is not None else (0,) * len(self.sources)

    def open_session(self, name: str) -> int:
        """A session on each source over the local socket (Flight has none), under one number that the
        DataLoader puts in its ``EpochIndex``es; needs some source with transport 'shm'."""
        if self._local is None:
            raise SidecarUnavailableError(f"mixture {self.name}: every source uses Flight, which has no sessions")
        session = self._next_session
        self._next_session += 1
        self._local.opened[session] = tuple(s.open_session(f"{name} source {i}") if s.transport == "shm" else 0
                                            for i, s in enumerate(self.sources))
        return session

    def plan(self, ids: Union[Sequence[int], np.ndarray], epoch: int, session: int = 0) -> int:
        """Tells the sidecar the epoch's order of positions ``ids`` as each source's order of samples (one plan
        per source, ``Dataset.plan``); returns the samples planned over all sources."""
        source_of, sample = self.draws(ids, epoch)
        sessions = self._sessions(session)
        planned = 0
        for i in np.unique(source_of):
            planned += self.sources[int(i)].plan(sample[source_of == i], epoch, session=sessions[i])
        return planned

    def check_state_name(self, saved: Any) -> None:
        """Raises the ``ValueError`` for a loader state taken over ``saved`` (its ``"dataset"``), naming what
        differs from this mixture; returns when ``saved`` is this mixture's ``name``."""
        if saved == self.name:
            return
        spec: Any = None
        if isinstance(saved, str) and saved.startswith(_NAME_PREFIX + "{"):
            try:
                spec = json.loads(saved[len(_NAME_PREFIX):])
            except ValueError:
                spec = None
        if not isinstance(spec, dict):
            raise ValueError(f"DataLoader state_dict was taken from a loader over dataset {saved!r}, not over a "
                             f"mixture; this one reads mixture {self.name}")
        mine = self._spec()
        theirs = [tuple(e) for e in spec.get("sources", []) if isinstance(e, list) and len(e) == 2]
        diffs: List[str] = []
        names, their_names = [n for n, _ in mine["sources"]], [n for n, _ in theirs]
        if names != their_names:
            diffs.append(f"its sources were {their_names}, this mixture's are {names}")
        else:
            diffs += [f"source {n!r} had weight {tw!r} there, {w!r} here"
                      for (n, w), (_, tw) in zip(mine["sources"], theirs) if w != tw]
        diffs += [f"{key} was {spec.get(key)!r} there, {mine[key]!r} here" for key in ("seed", "samples_per_epoch")
                  if spec.get(key) != mine[key]]
        raise ValueError("DataLoader state_dict was taken from a loader over another mixture: "
                         + ("; ".join(diffs) or f"{saved}, this one reads {self.name}"))

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state["_ids"] = {}  # each process draws the epochs it reads
        return state
