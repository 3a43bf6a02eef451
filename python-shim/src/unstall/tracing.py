"""Seeing the stall: every wait for the next batch timed, counted and (optionally) traced.

A :class:`StallObserver` is one of a loader's observers (``unstall.observers``; an ``unstall.torch.DataLoader``
holds one unless told otherwise): it wraps each epoch's iterator in an :class:`ObservedIterator`, which times each
``next()`` (the **wait**, the data stall) and the time between batches (the **step**: the trainer's own
work), and reads the loader's work counters: how long ``Dataset`` spent in fetches (**fetch**: local
socket or Flight) and in ``loader``/``transform`` (**prep**), in this process and in every DataLoader
worker (each worker writes its own row of a small shared-memory table, :class:`WorkCounters`, that the
observer owns and whose path the loader hands its ``Dataset``).

From these come ``loader.stats()`` (:class:`LoaderStats`), one log line at the end of every epoch, and
OpenTelemetry spans named as the Java agent's (docs/AGENT.md): ``unstall.stall`` per wait and
``unstall.step`` per step. Tracing is optional and cheap: without ``opentelemetry-sdk`` installed, with
``OTEL_SDK_DISABLED=true``, ``OTEL_TRACES_EXPORTER=none`` or ``UNSTALL_TRACING=0`` there are no spans
and nothing else changes. It is on when the SDK is installed and OTel is configured through the
standard variables (``OTEL_EXPORTER_OTLP_*ENDPOINT``, ``OTEL_TRACES_EXPORTER``, ``OTEL_SERVICE_NAME``)
or ``UNSTALL_TRACING=1``: a job that merely has the SDK installed does not start exporting to nowhere.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np

from .counters import (
    _COLUMNS,
    _dataset_stats,
    FETCH_CALLS as FETCH_CALLS,
    FETCH_NS as FETCH_NS,
    FETCH_BYTES as FETCH_BYTES,
    FETCH_SAMPLES as FETCH_SAMPLES,
    PREP_NS as PREP_NS,
    PREP_SAMPLES as PREP_SAMPLES,
    SHM_CALLS as SHM_CALLS,
    PREP_CPU_NS as PREP_CPU_NS,
    WorkCounters,
    record_fetch,
    record_prep,
    bind_sidecar,
)
from .spans import (
    STALL_SPAN,
    STEP_SPAN,
    SCOPE as SCOPE,
    A_STALL_NS as A_STALL_NS,
    A_IO_BYTES as A_IO_BYTES,
    A_IO_CALLS as A_IO_CALLS,
    A_IO_TIME as A_IO_TIME,
    A_IO_PROCESS_BYTES as A_IO_PROCESS_BYTES,
    A_ITER_CLASS as A_ITER_CLASS,
    A_ITER_METHOD as A_ITER_METHOD,
    A_THREAD_NAME as A_THREAD_NAME,
    A_THREAD_ID as A_THREAD_ID,
    A_EXC_TYPE as A_EXC_TYPE,
    A_STEP_NS as A_STEP_NS,
    A_BATCH as A_BATCH,
    A_EPOCH as A_EPOCH,
    A_DATASET as A_DATASET,
    A_WORKERS as A_WORKERS,
    A_FETCH_NS as A_FETCH_NS,
    A_PREP_NS as A_PREP_NS,
    tracing_wanted as tracing_wanted,
    build_tracer,
    StallTracer,
)
from .observers import IteratorWrapper

__all__ = [
    "LoaderStats",
    "ObservedIterator",
    "WorkCounters",
    "StallObserver",
    "StallTracer",
    "stall_tracer",
    "record_fetch",
    "record_prep",
    "bind_sidecar",
    "STALL_SPAN",
    "STEP_SPAN",
]

log = logging.getLogger("unstall")

# ---------------------------------------------------------------------------------------------
# The process's tracer

_tracer: Optional[StallTracer] = None
_tracer_pid: Optional[int] = None
_tracer_lock = threading.Lock()


def stall_tracer() -> StallTracer:
    """The process's tracer (built on first use from the OTEL_* environment; never in a worker)."""
    global _tracer, _tracer_pid
    with _tracer_lock:
        if _tracer is None or _tracer_pid != os.getpid():
            try:
                _tracer = build_tracer()
            except Exception as e:  # a broken OTel install must not stop training
                log.warning("unstall: cannot set up tracing (%s); no spans", e)
                _tracer = StallTracer()
            _tracer_pid = os.getpid()
        return _tracer


def reset_tracer() -> None:
    """Forgets the tracer so that the next use reads the environment again (tests)."""
    global _tracer
    with _tracer_lock:
        if _tracer is not None:
            _tracer.shutdown()
        _tracer = None


# ---------------------------------------------------------------------------------------------
# Stats


@dataclass
class LoaderStats:
    """What ``loader.stats()`` returns: the current (or last finished) epoch and all epochs together.

    ``wait_s`` is the data stall (time inside ``next()``), ``step_s`` the time between batches.
    ``fetch_s``/``prep_s`` are busy times summed over the iterating process and its workers (they
    overlap with steps when workers run ahead). ``stall_fetch_s``/``stall_prep_s`` split the stall in
    proportion to them: an estimate; ``unstall analyze`` measures the split differentially.
    Cache counters come from the sidecar (``None`` when it is not reachable over its control plane).
    ``transport`` is how the batches came: ``"shm"`` (the local socket and shared memory), ``"flight"``,
    or ``"mixed"``; before any fetch, the dataset's choice.
    Data echoing (``echo``, ``echo_level``; ``unstall.echo``): ``batches`` and ``samples_seen`` are what the
    loop was handed, ``fresh_batches`` and ``fresh_samples`` what came from the sidecar's fetch and prep (without
    echoing the same numbers: ``samples_fetched``, which counts what workers prefetched too); ``wait_s`` is the
    stall with echoing.
    """

    epoch: int = 0
    batches: int = 0
    samples_fetched: int = 0
    bytes_fetched: int = 0
    elapsed_s: float = 0.0
    wait_s: float = 0.0
    step_s: float = 0.0
    stall_fraction: float = 0.0
    fetch_s: float = 0.0
    prep_s: float = 0.0
    stall_fetch_s: float = 0.0
    stall_prep_s: float = 0.0
    cache_hits: Optional[int] = None
    cache_misses: Optional[int] = None
    storage_bytes: Optional[int] = None
    cache_bytes: Optional[int] = None
    peer_hits: Optional[int] = None  # a cluster: served from the cache of the sidecar that owns the sample
    peer_bytes: Optional[int] = None
    prefetch_hits: Optional[int] = None  # served from what the sidecar read ahead (clairvoyant or cache-first plans)
    order_spearman: Optional[float] = None  # order="cache_first", the epoch's view: rank correlation with the seeded order
    order_max_displacement: Optional[int] = None  # ... and the most positions a sample moved (below order_window)
    transport: Optional[str] = None
    echo: int = 1
    echo_level: str = "batch"
    fresh_batches: int = 0
    samples_seen: int = 0
    fresh_samples: int = 0
    total: Optional["LoaderStats"] = field(default=None, repr=False)

    def as_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d.pop("total")
        if self.total is not None:
            d["total"] = self.total.as_dict()
        return d

    def line(self) -> str:
        """The end-of-epoch log line."""
        busy = self.fetch_s + self.prep_s
        s = (f"unstall: epoch {self.epoch}: {self.batches} batches in {self.elapsed_s:.2f} s, "
             f"stall {self.wait_s:.2f} s ({100 * self.stall_fraction:.0f}%")
        if self.wait_s > 0 and busy > 0:
            s += f": fetch ~{self.stall_fetch_s:.2f} s, prep ~{self.stall_prep_s:.2f} s"
        s += f"), loader busy: fetch {self.fetch_s:.2f} s, prep {self.prep_s:.2f} s"
        if self.echo > 1:
            s += (f", echo {self.echo} ({self.echo_level}): {self.fresh_batches} fresh batches, "
                  f"{self.fresh_samples}/{self.samples_seen} samples fresh")
        if self.cache_hits is not None and self.cache_misses is not None:
            n = self.cache_hits + self.cache_misses
            pct = f" ({100 * self.cache_hits / n:.0f}%)" if n else ""
            s += (f", cache {self.cache_hits}/{n} hits{pct}, {_mb(self.storage_bytes)} from storage, "
                  f"{_mb(self.cache_bytes)} from cache")
            if self.peer_hits:
                s += f", {self.peer_hits} peer hits ({_mb(self.peer_bytes)})"
            if self.prefetch_hits:
                s += f", {self.prefetch_hits} read ahead"
        else:
            s += f", {_mb(self.bytes_fetched)} fetched"
        if self.order_spearman is not None:
            s += f", cache-first order: spearman {self.order_spearman:.4f}, max move {self.order_max_displacement}"
        return s


def _transport(calls: int, shm_calls: int, dataset: Any) -> Optional[str]:
    if calls == 0:
        return getattr(dataset, "transport", None)
    return "shm" if shm_calls == calls else "flight" if shm_calls == 0 else "mixed"


def _mb(n: Optional[int]) -> str:
    return "?" if n is None else f"{n / 1e6:.1f} MB"


class _Acc:
    """Timing accumulators of one epoch (or of all)."""

    __slots__ = ("batches", "wait_ns", "step_ns", "first_ns", "last_ns", "work_base", "work_final")

    def __init__(self, work_base: np.ndarray) -> None:
        self.batches = 0
        self.wait_ns = 0
        self.step_ns = 0
        self.first_ns: Optional[int] = None
        self.last_ns: Optional[int] = None
        self.work_base = work_base  # counters when the epoch began; the work done since is the epoch's
        self.work_final: Optional[np.ndarray] = None


class StallObserver:
    """An observer of one loader (``unstall.observers``): its work counters, accumulators, spans, the
    end-of-epoch line and ``stats()``. The loader binds it (``bind``) when it takes it."""

    def __init__(self) -> None:
        self._loader: Optional[weakref.ref] = None  # weak: the loader holds its observer, not the other way
        self.counters: Optional[WorkCounters] = None
        zero = np.zeros(_COLUMNS, dtype=np.int64)
        self.epoch_acc = _Acc(zero)
        self.total_acc = _Acc(zero)
        self.epoch = 0
        self.epochs_seen: List[int] = []
        self.iterator_class = ""

    def bind(self, loader: Any) -> None:
        """Makes this the observer of ``loader``; one loader each, since the counters are that loader's."""
        bound = self.loader
        if bound is not None and bound is not loader:
            raise ValueError(f"this StallObserver already observes {type(bound).__name__} {id(bound):#x}; "
                             "give each loader its own")
        self._loader = weakref.ref(loader)
        self.iterator_class = f"{type(loader).__module__}.{type(loader).__qualname__}"

    @property
    def loader(self) -> Any:
        return self._loader() if self._loader is not None else None

    def iterate(self, loader: Any, make_iterator: Callable[[], Iterator[Any]], epoch: int) -> Iterator[Any]:
        """The epoch's iterator, observed (timed, counted, traced)."""
        self.bind(loader)
        return ObservedIterator(self, make_iterator(), epoch)

    def work_counters(self, num_workers: int) -> Optional[str]:
        """The path of the counters table, made on the first call with a row for this process and one per
        worker: the loader puts it in its Dataset, which takes it to every worker. None when none can be made."""
        if self.counters is None:
            try:
                self.counters = WorkCounters(max(num_workers, 0) + 1)
            except Exception as e:
                log.debug("unstall: no work counters (%s)", e)
                return None
        return self.counters.path

    def work(self) -> np.ndarray:
        return self.counters.totals() if self.counters is not None else np.zeros(_COLUMNS, dtype=np.int64)

    def stats(self) -> LoaderStats:
        ds_stats = _dataset_stats(self.loader.dataset)  # one control-plane call for both views
        total = self._stats(self.total_acc, self.epoch, True, ds_stats)
        current = self._stats(self.epoch_acc, self.epoch, False, ds_stats)
        current.total = total
        return current

    def _stats(self, acc: _Acc, epoch: int, all_epochs: bool, ds_stats: Any) -> LoaderStats:
        w = acc.work_final if acc.work_final is not None else self.work() - acc.work_base
        elapsed = (acc.last_ns - acc.first_ns) / 1e9 if acc.first_ns is not None and acc.last_ns is not None else 0.0
        wait_s, fetch_s, prep_s = acc.wait_ns / 1e9, w[FETCH_NS] / 1e9, w[PREP_NS] / 1e9
        busy = fetch_s + prep_s
        st = LoaderStats(
            epoch=epoch, batches=acc.batches, samples_fetched=int(w[FETCH_SAMPLES]), bytes_fetched=int(w[FETCH_BYTES]),
            elapsed_s=elapsed, wait_s=wait_s, step_s=acc.step_ns / 1e9,
            stall_fraction=wait_s / elapsed if elapsed > 0 else 0.0, fetch_s=float(fetch_s), prep_s=float(prep_s),
            stall_fetch_s=float(wait_s * fetch_s / busy) if busy > 0 else 0.0,
            stall_prep_s=float(wait_s * prep_s / busy) if busy > 0 else 0.0,
            transport=_transport(int(w[FETCH_CALLS]), int(w[SHM_CALLS]), self.loader.dataset),
        )
        echo = getattr(self.loader, "echo_counts", None)  # unstall.echo.EchoCounts
        if echo is not None and echo.factor > 1:
            c = echo.total if all_epochs else echo.as_dict()
            st.echo, st.echo_level = echo.factor, echo.level
            st.fresh_batches, st.samples_seen, st.fresh_samples = c["fresh_batches"], c["samples"], c["fresh_samples"]
        else:  # no echoing: every batch handed out is fresh
            st.fresh_batches, st.samples_seen, st.fresh_samples = st.batches, st.samples_fetched, st.samples_fetched
        if ds_stats is not None:
            if all_epochs:
                epochs = [ds_stats.epoch(e) for e in self.epochs_seen]
            else:
                epochs = [ds_stats.epoch(epoch)]
            st.cache_hits = sum(e.hits for e in epochs)
            st.cache_misses = sum(e.misses for e in epochs)
            st.storage_bytes = sum(e.storage_bytes for e in epochs)
            st.cache_bytes = sum(e.cache_bytes for e in epochs)
            st.peer_hits = sum(e.peer_hits for e in epochs)
            st.peer_bytes = sum(e.peer_bytes for e in epochs)
            st.prefetch_hits = sum(e.prefetch_hits for e in epochs)
        order = getattr(self.loader, "order_stats", None)  # unstall.cache_order.CacheOrderStats
        if order is not None and not all_epochs and order.epoch == epoch:
            st.order_spearman, st.order_max_displacement = order.spearman, order.max_displacement
        return st

    def begin_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.epoch_acc = _Acc(self.work())
        if epoch not in self.epochs_seen:
            self.epochs_seen.append(epoch)

    def end_epoch(self) -> None:
        if self.epoch_acc.work_final is None:
            self.epoch_acc.work_final = self.work() - self.epoch_acc.work_base
        if self.epoch_acc.batches == 0:
            return
        st = self.stats()
        if os.environ.get("UNSTALL_EPOCH_LOG", "1") != "0":
            _log_line(st.line())


def _log_line(line: str) -> None:
    # Shown even when the application never configured logging (logging's last resort drops INFO).
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    log.info(line)


# ---------------------------------------------------------------------------------------------
# The iterator


class ObservedIterator(IteratorWrapper):
    """Wraps one epoch's DataLoader iterator; behaves like it (attributes and ``len`` pass through)."""

    def __init__(self, observer: StallObserver, inner: Iterator[Any], epoch: int) -> None:
        super().__init__(inner)
        self._obs = observer
        self._loader = observer.loader  # the loader lives while one of its iterators does
        self._tracer = stall_tracer()
        self._epoch = epoch
        self._index = 0
        self._last_return_ns: Optional[int] = None
        self._done = False
        self._offset_ns = time.time_ns() - time.perf_counter_ns()
        self._thread = threading.current_thread()
        observer.begin_epoch(epoch)

    def __next__(self) -> Any:
        obs = self._obs
        t0 = time.perf_counter_ns()
        main0 = obs.counters.row(0) if obs.counters is not None else None
        all0 = obs.work()
        if self._last_return_ns is not None:
            self._step(self._last_return_ns, t0)
        try:
            batch = next(self._inner)
        except StopIteration:
            self._finish()
            raise
        except BaseException as e:
            t1 = time.perf_counter_ns()
            self._stall(t0, t1, main0, all0, error=e)
            raise
        t1 = time.perf_counter_ns()
        self._stall(t0, t1, main0, all0)
        self._last_return_ns = t1
        self._index += 1
        return batch

    def _step(self, start: int, end: int) -> None:
        obs = self._obs
        for acc in (obs.epoch_acc, obs.total_acc):
            acc.step_ns += end - start
            acc.last_ns = end
        if self._tracer.enabled:
            self._tracer.span(STEP_SPAN, start + self._offset_ns, end + self._offset_ns, {
                A_STEP_NS: end - start, A_BATCH: self._index - 1, A_EPOCH: self._epoch,
                A_THREAD_NAME: self._thread.name, A_THREAD_ID: self._thread.ident or 0,
            })

    def _stall(self, t0: int, t1: int, main0: Optional[np.ndarray], all0: np.ndarray,
               error: Optional[BaseException] = None) -> None:
        obs = self._obs
        work = obs.work() - all0
        for acc in (obs.epoch_acc, obs.total_acc):
            if acc.first_ns is None:
                acc.first_ns = t0
            acc.last_ns = t1
            acc.wait_ns += t1 - t0
            if error is None:
                acc.batches += 1
        if self._tracer.enabled:
            main = obs.counters.row(0) - main0 if main0 is not None and obs.counters is not None else np.zeros(_COLUMNS, dtype=np.int64)
            attrs: Dict[str, Any] = {
                A_STALL_NS: t1 - t0,
                A_IO_BYTES: int(main[FETCH_BYTES]), A_IO_CALLS: int(main[FETCH_CALLS]), A_IO_TIME: int(main[FETCH_NS]),
                A_IO_PROCESS_BYTES: int(work[FETCH_BYTES]),
                A_FETCH_NS: int(work[FETCH_NS]), A_PREP_NS: int(work[PREP_NS]),
                A_ITER_CLASS: obs.iterator_class, A_ITER_METHOD: "__next__",
                A_THREAD_NAME: self._thread.name, A_THREAD_ID: self._thread.ident or 0,
                A_BATCH: self._index, A_EPOCH: self._epoch, A_WORKERS: int(obs.loader.num_workers),
            }
            name = getattr(obs.loader.dataset, "name", None)
            if isinstance(name, str):
                attrs[A_DATASET] = name
            self._tracer.span(STALL_SPAN, t0 + self._offset_ns, t1 + self._offset_ns, attrs, error)

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            self._obs.end_epoch()
