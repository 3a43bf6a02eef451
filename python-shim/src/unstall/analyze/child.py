"""The shim's side of ``unstall analyze``: inside the training command, the first DataLoader iterated
follows ``UNSTALL_ANALYZE_*``: optional cache warm pass, ``warmup`` untimed steps, ``steps`` timed steps
(synthetic: copies of the first batch, nothing fetched), then the JSON report and ``SystemExit(0)``.

A step is the time from one batch's return to the next batch's return: the trainer's work on a batch
plus the wait for the next one. The timed window runs from the return of batch ``warmup`` to the return
of batch ``warmup + steps``; that last batch is never handed to the trainer.

Importing this module in a process with ``UNSTALL_ANALYZE_MODE`` set (``unstall.torch`` does) registers
:func:`iterator_hook` with ``unstall.hooks``, after ``unstall.tracing``'s: the analysis wraps the
observed iterator.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np

from . import ENV_MODE, ENV_REPORT, ENV_STEPS, ENV_WARM, ENV_WARMUP, MODES
from .. import tracing  # first: its hook must be registered before this module's
from ..hooks import IteratorWrapper, register_iterator_hook

__all__ = ["Session", "session_for", "iterator_hook", "write_json_atomic", "ProgressFile"]

REPORT_FORMAT = "unstall.analyze-run/1"


def write_json_atomic(path: Path, doc: Dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


class ProgressFile:
    """``<report>.progress``: one line ``phase done total`` the analyzer polls for its progress bar."""

    def __init__(self, path: Optional[Path]) -> None:
        self.path = path
        self._last = 0.0

    def update(self, phase: str, done: int, total: int, force: bool = False) -> None:
        if self.path is None:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.2:
            return
        self._last = now
        try:
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(f"{phase} {done} {total}\n")
            os.replace(tmp, self.path)
        except OSError:
            pass


def clone_batch(batch: Any) -> Any:
    """A copy of a collated batch: tensors cloned (fresh memory, as a new batch would have), containers
    rebuilt, anything else shared."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.clone()
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(clone_batch(b) for b in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(clone_batch(b) for b in batch)
    if isinstance(batch, dict):
        return type(batch)((k, clone_batch(v)) for k, v in batch.items())
    return batch


class AnalyzeError(Exception):
    """Ends the run with an error report (and exit status 3)."""


class Session:
    """The analysis settings of this process (from the environment) and the loader it claimed."""

    def __init__(self, mode: str, steps: int, warmup: int, report: Path, warm: bool) -> None:
        self.mode = mode
        self.steps = steps
        self.warmup = warmup
        self.report = report
        self.warm = warm or mode == "cached"
        self.progress = ProgressFile(report.with_name(report.name + ".progress"))
        self._loader: Optional[weakref.ref] = None

    @classmethod
    def from_env(cls) -> Optional["Session"]:
        mode = os.environ.get(ENV_MODE)
        if not mode:
            return None
        report = Path(os.environ.get(ENV_REPORT) or "unstall-analyze-run.json")
        try:
            if mode not in MODES:
                raise ValueError(f"{ENV_MODE}={mode!r} is not one of {', '.join(MODES)}")
            steps = int(os.environ.get(ENV_STEPS, "50"))
            warmup = int(os.environ.get(ENV_WARMUP, "2"))
            if steps < 1 or warmup < 1:
                raise ValueError(f"{ENV_STEPS} and {ENV_WARMUP} must be >= 1, got {steps} and {warmup}")
        except ValueError as e:
            _fail(report, mode, str(e))
        return cls(mode, steps, warmup, report, os.environ.get(ENV_WARM, "") == "1")

    def claims(self, loader: Any) -> bool:
        """The first DataLoader iterated in this process is the one analysed."""
        if self._loader is None:
            self._loader = weakref.ref(loader)
            return True
        return self._loader() is loader

    def iterate(self, obs: "tracing.LoaderObserver", make_iterator: Callable[[], Iterator[Any]], epoch: int) -> Iterator[Any]:
        loader = obs.loader
        try:
            return AnalyzedIterator(self, obs, make_iterator, epoch)
        except AnalyzeError as e:
            _fail(self.report, self.mode, str(e), loader=loader)
            raise AssertionError("unreachable")  # pragma: no cover


_session: Optional[Session] = None
_session_pid: Optional[int] = None


def session_for(loader: Any) -> Optional[Session]:
    """The analysis session when this process runs under ``unstall analyze`` and ``loader`` is the
    analysed one (never in a DataLoader worker)."""
    global _session, _session_pid
    if ENV_MODE not in os.environ:
        return None
    if _session_pid != os.getpid():
        _session, _session_pid = Session.from_env(), os.getpid()
    if _session is None or not _session.claims(loader):
        return None
    return _session


def iterator_hook(loader: Any, make_iterator: Callable[[], Iterator[Any]], epoch: int) -> Iterator[Any]:
    """The analysed loader's epoch iterator, driven by the analysis; any other loader's, unchanged.
    ``make_iterator`` builds the observed iterator (``unstall.tracing``'s hook runs before this one)."""
    session = session_for(loader)
    if session is None:
        return make_iterator()
    return session.iterate(tracing.observer_of(loader), make_iterator, epoch)


def _dataset_doc(loader: Any) -> Dict[str, Any]:
    ds = loader.dataset
    info = getattr(ds, "info", None)
    doc: Dict[str, Any] = {"name": getattr(ds, "name", None)}
    if info is not None:
        doc.update(num_samples=int(info.num_samples), total_bytes=int(info.total_bytes), format=info.format)
    else:
        try:
            doc["num_samples"] = len(ds)
        except TypeError:
            pass
    return doc


def _fail(report: Path, mode: str, message: str, loader: Any = None) -> None:
    doc: Dict[str, Any] = {"format": REPORT_FORMAT, "status": "error", "mode": mode, "error": message}
    if loader is not None:
        doc["dataset"] = _dataset_doc(loader)
    try:
        write_json_atomic(report, doc)
    except OSError:
        pass
    print(f"unstall analyze: {message}", file=sys.stderr)
    raise SystemExit(3)


class AnalyzedIterator(IteratorWrapper):
    """Around the observed iterator (``make_iterator()``), the analysis: warm, synthetic copies, the
    timed window, the end. Synthetic copies bypass the observed iterator: they are not observed."""

    def __init__(self, session: Session, obs: "tracing.LoaderObserver", make_iterator: Callable[[], Iterator[Any]],
                 epoch: int) -> None:
        self.s = session
        loader = obs.loader
        if not hasattr(loader.dataset, "name") or not hasattr(loader.dataset, "_client"):
            raise AnalyzeError(f"the analysed DataLoader's dataset is a {type(loader.dataset).__name__}, "
                               "not an unstall.torch.Dataset")
        try:
            self.epoch_batches: Optional[int] = len(loader)
        except TypeError:
            self.epoch_batches = None
        need = session.warmup + session.steps
        if self.epoch_batches is not None and need > self.epoch_batches:
            raise AnalyzeError(
                f"{session.warmup} warm-up + {session.steps} timed steps = {need} batches, but an epoch of this "
                f"DataLoader has only {self.epoch_batches} ({_dataset_doc(loader).get('num_samples')} samples, "
                f"batch size {loader.batch_size}); use --steps {max(self.epoch_batches - session.warmup, 0)} or fewer")
        self.warm_doc: Optional[Dict[str, Any]] = None
        if session.warm:
            self.warm_doc = warm_cache(loader.dataset, session)
        super().__init__(make_iterator())
        self._obs = obs
        self.returned = 0
        self.first_batch: Any = None
        self.window_start: Optional[int] = None
        self.waits: List[int] = []
        self.steps_ns: List[int] = []
        self.prev_return: Optional[int] = None
        self.work0: Optional[np.ndarray] = None
        self.sidecar0: Any = None
        self.synthetic_from_now = False

    def __next__(self) -> Any:
        s = self.s
        t0 = time.perf_counter_ns()
        if self.synthetic_from_now:
            batch = clone_batch(self.first_batch)
        else:
            try:
                batch = next(self._inner)
            except StopIteration:
                raise AnalyzeError(
                    f"the epoch ended after {self.returned} batches, before {s.warmup} warm-up + {s.steps} timed steps")
        t1 = time.perf_counter_ns()
        self.returned += 1
        if self.window_start is not None:
            self.waits.append(t1 - t0)
            self.steps_ns.append(t0 - (self.prev_return or t0))
        self.prev_return = t1
        s.progress.update("steps", self.returned, s.warmup + s.steps)
        if s.mode == "synthetic" and self.returned == 1:
            self.first_batch = batch
            self._stop_inner()
            self.synthetic_from_now = True
        if self.returned == s.warmup:
            self.work0 = self._obs.work()
            self.sidecar0 = self._sidecar_stats()
            self.window_start = time.perf_counter_ns()
            self.prev_return = self.window_start
        elif self.returned == s.warmup + s.steps:
            self._finish_window(time.perf_counter_ns())
        return batch

    def _stop_inner(self) -> None:
        shutdown = getattr(self._inner, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()  # no worker may keep fetching (and using CPU) behind the synthetic steps

    def _sidecar_stats(self) -> Any:
        if self.s.mode == "synthetic":
            return None
        ds = self._obs.loader.dataset
        try:
            st = tracing._dataset_stats(ds)  # over the control plane: this process may still fork workers
            return (st if st is not None else ds._client.stats().dataset(ds.name)).total
        except Exception:
            return None

    def _finish_window(self, end: int) -> None:
        s = self.s
        loader = self._obs.loader
        assert self.window_start is not None and self.work0 is not None
        work = self._obs.work() - self.work0
        sidecar1 = self._sidecar_stats()
        side = None
        if self.sidecar0 is not None and sidecar1 is not None:
            side = {k: getattr(sidecar1, k) - getattr(self.sidecar0, k)
                    for k in ("samples", "hits", "misses", "storage_bytes", "cache_bytes")}
        batch_size = loader.batch_size
        if batch_size is None and self.epoch_batches:
            batch_size = len(loader.dataset) / self.epoch_batches
        doc = {
            "format": REPORT_FORMAT,
            "status": "ok",
            "mode": s.mode,
            "steps": s.steps,
            "warmup": s.warmup,
            "batch_size": batch_size,
            "epoch_batches": self.epoch_batches,
            "num_workers": int(loader.num_workers),
            "elapsed_ns": end - self.window_start,
            "wait_ns": self.waits,
            "step_ns": self.steps_ns,
            "work": {"fetch_calls": int(work[tracing.FETCH_CALLS]), "fetch_ns": int(work[tracing.FETCH_NS]),
                     "fetch_bytes": int(work[tracing.FETCH_BYTES]), "fetch_samples": int(work[tracing.FETCH_SAMPLES]),
                     "prep_ns": int(work[tracing.PREP_NS]), "prep_samples": int(work[tracing.PREP_SAMPLES])},
            "sidecar": side,
            "warm": self.warm_doc,
            "dataset": _dataset_doc(loader),
            "cpu_count": os.cpu_count(),
        }
        write_json_atomic(s.report, doc)
        s.progress.update("done", self.returned, s.warmup + s.steps, force=True)
        self._stop_inner()
        raise SystemExit(0)


def warm_cache(dataset: Any, session: Session) -> Dict[str, Any]:
    """Reads the whole dataset once, in a separate process (this one must not use gRPC before it forks
    its DataLoader workers), so that the cache holds what fits. Returns the warm process's JSON."""
    env = dict(os.environ)
    env.update(
        UNSTALL_WARM_LOCATION=dataset._client.location,
        UNSTALL_WARM_TOKEN=(dataset._client._token or b"").decode(),
        UNSTALL_WARM_DATASET=dataset.name,
        UNSTALL_WARM_PROGRESS=str(session.progress.path or ""),
        UNSTALL_WARM_REQUIRE_ALL="1" if session.mode == "cached" else "0",
    )
    for k in (ENV_MODE, ENV_REPORT):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, "-m", "unstall.analyze.warm"], env=env, stdout=subprocess.PIPE, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    doc = json.loads(lines[-1]) if lines else {}
    if proc.returncode != 0 or doc.get("status") != "ok":
        raise AnalyzeError(doc.get("error") or f"warming the cache failed (exit status {proc.returncode})")
    return doc


if os.environ.get(ENV_MODE):  # only in a process that `unstall analyze` runs (not its warm pass)
    register_iterator_hook(iterator_hook)
