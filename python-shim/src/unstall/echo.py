"""Data echoing (Choi et al., "Faster Neural Network Training with Data Echoing", 2019): when fetch and prep
are slower than the trainer, each prepared batch (``level="batch"``) or each prepared example
(``level="example"``) is handed to the loop ``factor`` times, reshuffled, so the trainer waits less, at the
cost of fewer fresh samples per step (1 / factor of them).

One implementation for every loader (``unstall.torch.DataLoader``, ``unstall.prep.PrepLoader`` and
``SharedTransformLoader``, ``unstall.tf.dataset``, or any iterator of batches, e.g. ``Membership.epoch_arrays``):
:meth:`Echo.apply` wraps an epoch's iterator of batches in the trainer process, after the data crossed from
the sidecar, so the sidecar's staging and a prep group's coordination never see it.

* **batch**: a window of up to ``window`` upstream batches, each with ``factor`` copies left (an epoch starts
  once 2 are in; each step draws at most one more); each step draws one copy at random (weighted by the copies
  left), never the batch handed out just before while another one is in the window. Every
  upstream batch is handed out exactly ``factor`` times per epoch. The copies are the same objects (no
  copy): a loop must not modify a batch in place (``x.mul_()``); out-of-place ops and ``.to(device)`` are fine.
* **example**: the rows of ``window`` upstream batches are concatenated (one copy), each row index repeated
  ``factor`` times and shuffled, and cut into batches of the upstream batch size (a second copy per handed
  row): ``1 + factor`` row copies per fresh sample, and every handed batch is fresh memory. Rows left over at
  a window's end (only when upstream batches are not full) go into the next window; the epoch's last batch
  may be smaller. Every leaf of a batch (tensor, array, list of payloads) must have the rows as its first
  dimension.

The order is a function of ``(seed, epoch)`` only: numpy's ``SeedSequence`` on the loader's seed, the
epoch and a stream of its own, so it differs per epoch and replays in a new process. ``factor`` is an
integer >= 1 (the paper also uses fractional factors, an echo with probability; not here: an integer
keeps "each batch exactly ``factor`` times per epoch" exact). ``factor=1`` hands out the upstream batches
unchanged (and counts them).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence

import numpy as np

from .observers import IteratorWrapper

__all__ = ["Echo", "EchoCounts", "EchoedIterator", "LEVELS", "DEFAULT_WINDOW", "echo_rng", "num_rows"]

LEVELS = ("batch", "example")
DEFAULT_WINDOW = 4  # upstream batches held for reshuffling (memory: this many batches in the trainer process)
_ECHO_STREAM = 2  # epoch_seed's streams: 0 the sampler's order, 1 the workers' base seed, 2 echoing


def echo_rng(seed: int, epoch: int) -> np.random.Generator:
    """The echo order's generator: a function of ``(seed, epoch)`` only."""
    from .state import epoch_seed

    return np.random.default_rng(epoch_seed(seed, epoch, _ECHO_STREAM))


_COUNTS: tuple[str, ...] = ("batches", "samples", "fresh_batches", "fresh_samples")


@dataclass
class EchoCounts:
    """What an echoing loader handed out vs what came fresh from upstream, this epoch and over all epochs.
    ``batches``/``samples``: handed to the loop; ``fresh_batches``/``fresh_samples``: drawn from upstream (the
    sidecar's fetch and prep). Samples are rows of the batches' first leaf."""

    factor: int = 1
    level: str = "batch"
    batches: int = 0
    samples: int = 0
    fresh_batches: int = 0
    fresh_samples: int = 0
    total: Dict[str, int] = field(default_factory=lambda: dict.fromkeys(_COUNTS, 0))

    def begin_epoch(self) -> None:
        self.batches = self.samples = self.fresh_batches = self.fresh_samples = 0

    def _add(self, name: str, n: int) -> None:
        setattr(self, name, getattr(self, name) + n)
        self.total[name] += n

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)



@dataclass(frozen=True)
class Echo:
    """An echo setting: ``factor`` (int >= 1), ``level`` (``"batch"`` or ``"example"``), ``window`` (upstream
    batches reshuffled together)."""

    factor: int = 1
    level: str = "batch"
    window: int = DEFAULT_WINDOW

    @classmethod
    def of(cls, echo: Any = 1, echo_level: Any = "batch") -> "Echo":
        """The setting of a loader's ``echo``/``echo_level`` options, or a ValueError naming the option."""
        if isinstance(echo, bool) or not isinstance(echo, (int, np.integer)) or echo < 1:
            raise ValueError(f"echo must be an int >= 1 (each batch handed out that many times), got {echo!r}")
        if echo_level not in LEVELS:
            raise ValueError(f"echo_level must be 'batch' or 'example', got {echo_level!r}")
        return cls(int(echo), str(echo_level))

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"echo window must be >= 1, got {self.window!r}")

    def length(self, upstream_batches: int, samples: Optional[int], batch_size: Optional[int]) -> int:
        """Batches per epoch handed out for ``upstream_batches`` (example level: of ``samples`` rows cut into
        ``batch_size``; exact when only the last upstream batch is partial)."""
        if self.level == "example" and samples is not None and batch_size:
            return -(-self.factor * samples // batch_size)
        return self.factor * upstream_batches

    def check_resumable(self, what: str, mid_epoch: bool) -> None:
        """A ``state_dict`` mid-epoch cannot say which echoed copies were handed out: refused, naming the option."""
        if self.factor > 1 and mid_epoch:
            raise ValueError(f"{what}.state_dict() with echo={self.factor} is exact between epochs only (the echoed "
                             "order depends on the whole window of upstream batches): take it after an epoch's last "
                             "batch, or use echo=1")

    def counts(self) -> EchoCounts:
        return EchoCounts(self.factor, self.level)

    def apply(self, batches: Iterable[Any], *, seed: int, epoch: int, batch_size: Optional[int] = None,
              counts: Optional[EchoCounts] = None) -> Iterator[Any]:
        """The echoed epoch of ``batches`` (see the module doc); ``counts`` starts the epoch now (not at the first
        batch: a ``state_dict`` taken before it must not see the last epoch's counts) and is updated as batches go by."""
        counts = counts if counts is not None else self.counts()
        counts.begin_epoch()
        return self._apply(batches, seed, epoch, batch_size, counts)

    def _apply(self, batches: Iterable[Any], seed: int, epoch: int, batch_size: Optional[int],
               counts: EchoCounts) -> Iterator[Any]:
        def fresh() -> Iterator[Any]:
            for b in batches:
                counts._add("fresh_batches", 1)
                counts._add("fresh_samples", num_rows(b))
                yield b

        if self.factor == 1:
            out: Iterator[Any] = fresh()
        elif self.level == "batch":
            out = _echo_batches(fresh(), self.factor, self.window, echo_rng(seed, epoch))
        else:
            out = _echo_examples(fresh(), self.factor, self.window, echo_rng(seed, epoch), batch_size)
        for b in out:
            counts._add("batches", 1)
            counts._add("samples", num_rows(b))
            yield b


class EchoedIterator(IteratorWrapper):
    """An epoch's echoed iterator that otherwise behaves like ``inner`` (the loader's own iterator: its
    attributes pass through); ``len()`` is the echoed length."""

    def __init__(self, inner: Iterator[Any], echoed: Iterator[Any], length: Callable[[int], int]) -> None:
        super().__init__(inner)
        self._echoed = echoed
        self._length = length

    def __next__(self) -> Any:
        return next(self._echoed)

    def __len__(self) -> int:
        return self._length(len(self._inner))  # type: ignore[arg-type]


def _echo_batches(upstream: Iterator[Any], factor: int, window: int, rng: np.random.Generator) -> Iterator[Any]:
    pool: List[List[Any]] = []  # [batch, copies left]
    last: Any = None  # the entry handed out last
    exhausted = False
    while True:
        # Two batches before a step (so repeats need not be back to back), then at most one more per step up to
        # the window: an epoch's first step waits for 2 fresh batches, not for the whole window.
        pulled = False
        while not exhausted and (len(pool) < min(2, window) or (not pulled and len(pool) < window)):
            b = next(upstream, _END)
            pulled = True
            if b is _END:
                exhausted = True
            else:
                pool.append([b, factor])
        if not pool:
            return
        candidates = [e for e in pool if e is not last] or pool  # never the same batch twice in a row, if avoidable
        left = np.array([e[1] for e in candidates], dtype=np.float64)
        entry = candidates[int(rng.choice(len(candidates), p=left / left.sum()))]
        entry[1] -= 1
        if entry[1] == 0:
            pool = [e for e in pool if e is not entry]  # by identity: a batch's == may be elementwise
        last = entry
        yield entry[0]


_END = object()


def _echo_examples(upstream: Iterator[Any], factor: int, window: int, rng: np.random.Generator,
                   batch_size: Optional[int]) -> Iterator[Any]:
    carry: Optional[Any] = None  # rows already echoed, left over from the last window
    while True:
        got = [b for b in (next(upstream, _END) for _ in range(window)) if b is not _END]
        if batch_size is None and got:
            batch_size = num_rows(got[0])
        if not got and carry is None:
            return
        parts = ([carry] if carry is not None else []) + got
        rows = _concat(parts)
        n_carry = num_rows(carry) if carry is not None else 0
        fresh = num_rows(rows) - n_carry
        order = np.concatenate([np.arange(n_carry), np.repeat(np.arange(n_carry, n_carry + fresh), factor)])
        order = order[rng.permutation(len(order))]
        last_window = len(got) < window
        size = max(1, int(batch_size or 1))
        full = len(order) if last_window else len(order) - len(order) % size
        for start in range(0, full, size):
            yield _take(rows, order[start:start + size])
        carry = _take(rows, order[full:]) if full < len(order) else None
        if last_window:
            return


# ---------------------------------------------------------------------------------------------
# Batches as nested structures: tuples, lists, dicts of row leaves (tensors, arrays, lists of payloads)

_SCALARS = (bytes, bytearray, str, int, float, bool, type(None))


def _is_leaf(x: Any) -> bool:
    if hasattr(x, "shape") and hasattr(x, "__len__"):  # torch.Tensor, np.ndarray, tf.Tensor
        return True
    return isinstance(x, list) and all(isinstance(v, _SCALARS) for v in x)  # raw payloads, collated strings


def _leaves(x: Any) -> Iterator[Any]:
    if _is_leaf(x):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _leaves(v)


def num_rows(batch: Any) -> int:
    """The samples of a batch: the first dimension of its first leaf (0 when it has none)."""
    leaf = next(_leaves(batch), None)
    return 0 if leaf is None else len(leaf)


def _map(f: Callable[[Sequence[Any]], Any], parts: Sequence[Any]) -> Any:
    """``f`` over corresponding leaves of batches of the same structure."""
    first = parts[0]
    if _is_leaf(first):
        return f(parts)
    if isinstance(first, dict):
        return type(first)((k, _map(f, [p[k] for p in parts])) for k in first)
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(_map(f, [p[i] for p in parts]) for i in range(len(first))))
    if isinstance(first, (list, tuple)):
        return type(first)(_map(f, [p[i] for p in parts]) for i in range(len(first)))
    raise ValueError(f"echo_level='example' needs batches of tensors, arrays or lists of samples, got a "
                     f"{type(first).__name__} leaf; use echo_level='batch'")


def _concat(parts: Sequence[Any]) -> Any:
    def cat(leaves: Sequence[Any]) -> Any:
        n = {len(x) for x in leaves}
        head = leaves[0]
        if isinstance(head, list):
            return [v for x in leaves for v in x]
        if type(head).__module__.startswith("torch"):
            import torch

            return torch.cat(list(leaves)) if len(leaves) > 1 else head.clone()
        if n and type(head).__module__.startswith("tensorflow"):
            import tensorflow as tf

            return tf.concat(list(leaves), 0)
        return np.concatenate([np.asarray(x) for x in leaves])

    rows = _map(cat, parts)
    sizes = {len(leaf) for leaf in _leaves(rows)}
    if len(sizes) > 1:
        raise ValueError(f"echo_level='example' needs every leaf of a batch to have the batch's rows as its first "
                         f"dimension; got leaves of {sorted(sizes)} rows; use echo_level='batch'")
    return rows


def _take(rows: Any, index: np.ndarray) -> Any:
    def take(leaves: Sequence[Any]) -> Any:
        x = leaves[0]
        if isinstance(x, list):
            return [x[int(i)] for i in index]
        if type(x).__module__.startswith("torch"):
            import torch

            return x.index_select(0, torch.from_numpy(index.astype(np.int64)))
        if type(x).__module__.startswith("tensorflow"):
            import tensorflow as tf

            return tf.gather(x, index)
        return np.take(x, index, axis=0)

    return _map(take, [rows])

