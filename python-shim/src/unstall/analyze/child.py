"""The shim's side of ``unstall analyze``: inside the training command, every loader the command
iterates follows ``UNSTALL_ANALYZE_*``: optional cache warm pass, ``warmup`` untimed steps, ``steps``
timed steps (synthetic: copies of the first batch, nothing fetched), then that loader's epoch ends early
and the command goes on to its next loader. Each loader is one section of the run's JSON report. The
process ends with ``SystemExit(0)`` when the loop comes back to a loader already analysed, or after
``UNSTALL_ANALYZE_SECTIONS`` loaders; a command that ends by itself gets its report written at exit.

A step is the time from one batch's return to the next batch's return: the trainer's work on a batch
plus the wait for the next one. The timed window runs from the return of batch ``warmup`` to the return
of batch ``warmup + steps``; that last batch is never handed to the trainer.

A :class:`Session` is the analysis: loaders find it through ``unstall.analyze.context``. It is an
``unstall.torch.DataLoader``'s outermost observer (``Session.iterate``: it wraps the observed iterator), and
``unstall.tf`` has it watch the iteration of tf.data pipelines built on an ``unstall.tf.dataset``
(``Session.watch_tf``).
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from . import AnalyzeError, ENV_MODE, ENV_REPORT, ENV_SECTIONS, ENV_STEPS, ENV_WARM, ENV_WARMUP, ENV_WORKERS, MODES
from ..observers import IteratorWrapper
from .sources import SIDECAR_KEYS, WORK_KEYS, Source, TorchSource

__all__ = ["Session", "session", "write_json_atomic", "ProgressFile", "AnalyzeError"]

REPORT_FORMAT = "unstall.analyze-run/2"


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


class Session:
    """The analysis settings of this process (from the environment) and its sections, one per loader."""

    def __init__(self, mode: str, steps: int, warmup: int, report: Path, warm: bool,
                 expected_sections: Optional[int] = None, workers: Optional[int] = None) -> None:
        self.mode = mode
        self.steps = steps
        self.warmup = warmup
        self.report = report
        self.warm = warm or mode == "cached"
        self.expected_sections = expected_sections
        self.workers = workers
        self.progress = ProgressFile(report.with_name(report.name + ".progress"))
        self.sections: List[Dict[str, Any]] = []
        self._keys: List[weakref.ref] = []
        self._active: Dict[int, "AnalyzedIterator"] = {}
        self._warmed: Dict[str, Dict[str, Any]] = {}
        self._written = False
        self._tf_restore: Optional[Callable[[], None]] = None

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
            expected = int(os.environ[ENV_SECTIONS]) if os.environ.get(ENV_SECTIONS) else None
            workers = int(os.environ[ENV_WORKERS]) if os.environ.get(ENV_WORKERS) else None
        except ValueError as e:
            _fail(report, mode, str(e))
        return cls(mode, steps, warmup, report, os.environ.get(ENV_WARM, "") == "1", expected, workers)

    def iterate(self, loader: Any, make_iterator: Callable[[], Iterator[Any]], epoch: int) -> Iterator[Any]:
        """As an ``unstall.torch.DataLoader``'s observer (the outermost: ``make_iterator`` builds the
        observed iterator): the epoch's iterator, analysed."""
        return self.analyse(loader, lambda: TorchSource(loader), make_iterator)

    def watch_tf(self, source_of: Callable[[Any], Optional[Tuple[Any, Source]]]) -> None:
        """Has iterating (``iter(ds)``, ``for x in ds``, eager) any tf.data dataset for which ``source_of``
        gives ``(loader key, source)`` go through the analysis, until :meth:`close`. tf.data has no iteration hook and the
        loop iterates a pipeline built on the unstall dataset (``.map``, ``.prefetch``), not the dataset
        itself: ``tf.data.Dataset.__iter__`` is wrapped; other datasets iterate as before."""
        if self._tf_restore is not None:
            return
        import tensorflow as tf

        base = tf.data.Dataset
        original = base.__iter__

        def __iter__(ds: Any) -> Any:
            found = source_of(ds) if tf.executing_eagerly() else None
            if found is None:
                return original(ds)
            key, source = found
            return self.analyse(key, lambda: source, lambda: original(ds))

        def restore() -> None:
            base.__iter__ = original

        base.__iter__ = __iter__
        self._tf_restore = restore

    def close(self) -> None:
        """Stops watching tf.data iteration (:meth:`watch_tf`)."""
        restore, self._tf_restore = self._tf_restore, None
        if restore is not None:
            restore()

    def analyse(self, key: Any, make_source: Callable[[], Source], make_iterator: Callable[[], Iterator[Any]]) -> Iterator[Any]:
        """The epoch iterator of the loader ``key``: analysed the first time the loop iterates it; when
        the loop comes back to a loader already seen, every loader has had its turn: the run ends."""
        if any(k() is key for k in self._keys):
            self.finish()
        self._keys.append(weakref.ref(key))
        index = len(self._keys) - 1
        source: Optional[Source] = None
        try:
            source = make_source()
            it = AnalyzedIterator(self, index, source, make_iterator)
        except AnalyzeError as e:  # this loader cannot be analysed: it runs unchanged, its section says why
            self.add_section(index, source, error=str(e))
            return make_iterator()
        self._active[index] = it
        return it

    def warm_cache(self, source: Source) -> Dict[str, Any]:
        target = source.warm_target()
        if target.dataset not in self._warmed:
            self._warmed[target.dataset] = warm_cache(target.location, target.token, target.dataset, self)
        return self._warmed[target.dataset]

    def add_section(self, index: int, source: Optional[Source], error: Optional[str] = None,
                    **doc: Any) -> None:
        self._active.pop(index, None)
        section: Dict[str, Any] = {"index": index, "status": "ok" if error is None else "error"}
        if source is not None:
            section.update(kind=source.kind, dataset=_describe(source))
        if error is not None:
            section["error"] = error
        section.update(doc)
        self.sections.append(section)
        self.sections.sort(key=lambda s: s["index"])
        if self.expected_sections is not None and len(self.sections) >= self.expected_sections:
            self.finish()

    def write(self) -> None:
        """The run's report: every section so far; a loader still in its window is one that the
        command stopped iterating."""
        if self._written or not self._keys:
            return
        self._written = True
        for index, it in list(self._active.items()):
            self.add_section(index, it.source, error=(
                f"the loop stopped iterating this {it.source.kind} after {it.returned} batches, before "
                f"{self.warmup} warm-up + {self.steps} timed steps"))
        write_json_atomic(self.report, {"format": REPORT_FORMAT, "status": "ok", "mode": self.mode,
                                        "sections": self.sections, "cpu_count": os.cpu_count(),
                                        "load_average": os.getloadavg()[0]})
        self.progress.update("done", 1, 1, force=True)

    def finish(self) -> None:
        self.write()
        raise SystemExit(0)


_session: Optional[Session] = None
_session_pid: Optional[int] = None


def session() -> Optional[Session]:
    """The analysis session when this process runs under ``unstall analyze`` (never in a DataLoader
    worker: a forked copy gets its own, unused)."""
    global _session, _session_pid
    if ENV_MODE not in os.environ:
        return None
    if _session_pid != os.getpid():
        _session, _session_pid = Session.from_env(), os.getpid()
        if _session is not None:
            atexit.register(_session.write)
    return _session


def _describe(source: Source) -> Dict[str, Any]:
    try:
        return source.describe()
    except Exception as e:  # the report still says which loader failed
        return {"error": str(e)}


def _fail(report: Path, mode: str, message: str) -> None:
    doc: Dict[str, Any] = {"format": REPORT_FORMAT, "status": "error", "mode": mode, "error": message}
    try:
        write_json_atomic(report, doc)
    except OSError:
        pass
    print(f"unstall analyze: {message}", file=sys.stderr)
    raise SystemExit(3)


class AnalyzedIterator(IteratorWrapper):
    """Around the loader's real iterator (``make_iterator()``), the analysis: warm, synthetic copies,
    the timed window, the early end of the epoch. Synthetic copies bypass the real iterator."""

    def __init__(self, session: Session, index: int, source: Source, make_iterator: Callable[[], Iterator[Any]]) -> None:
        self.s = session
        self.index = index
        self.source = source
        if session.workers is not None and isinstance(source, TorchSource):
            source.set_num_workers(session.workers)
        self.epoch_batches = source.epoch_batches()
        need = session.warmup + session.steps
        if self.epoch_batches is not None and need > self.epoch_batches:
            ds = source.describe()
            raise AnalyzeError(
                f"{session.warmup} warm-up + {session.steps} timed steps = {need} batches, but an epoch of this "
                f"{source.kind} has only {self.epoch_batches} ({ds.get('num_samples')} samples, batch size "
                f"{_g(source.batch_size(None))}); use --steps {max(self.epoch_batches - session.warmup, 0)} or fewer")
        self.warm_doc: Optional[Dict[str, Any]] = session.warm_cache(source) if session.warm else None
        super().__init__(make_iterator())
        self.returned = 0
        self.first_batch: Any = None
        self.batch_size: Optional[float] = None
        self.window_start: Optional[int] = None
        self.waits: List[int] = []
        self.steps_ns: List[int] = []
        self.prev_return: Optional[int] = None
        self.work0: Dict[str, int] = {}
        self.sidecar0: Optional[Dict[str, int]] = None
        self.synthetic_from_now = False
        self.done = False

    def __next__(self) -> Any:
        s = self.s
        if self.done:
            raise StopIteration
        t0 = time.perf_counter_ns()
        if self.synthetic_from_now:
            batch = self.source.clone(self.first_batch)
        else:
            try:
                batch = next(self._inner)
            except StopIteration:
                self.done = True
                s.add_section(self.index, self.source, error=(
                    f"the epoch ended after {self.returned} batches, before {s.warmup} warm-up + {s.steps} timed steps; "
                    f"use --steps {max(self.returned - s.warmup, 0)} or fewer"))
                raise
        t1 = time.perf_counter_ns()
        self.returned += 1
        if self.window_start is not None:
            self.waits.append(t1 - t0)
            self.steps_ns.append(t0 - (self.prev_return or t0))
        self.prev_return = t1
        s.progress.update("steps", self.returned, s.warmup + s.steps)
        if self.returned == 1:
            self.batch_size = self.source.batch_size(batch)
            if s.mode == "synthetic":
                self.first_batch = batch
                self.source.stop(self._inner)
                self._inner = iter(())  # nothing may keep loading (and using CPU) behind the synthetic steps
                self.synthetic_from_now = True
        if self.returned == s.warmup:
            self.work0 = self.source.work()
            self.sidecar0 = None if s.mode == "synthetic" else self.source.sidecar_totals()
            self.window_start = time.perf_counter_ns()
            self.prev_return = self.window_start
        elif self.returned == s.warmup + s.steps:
            self._finish_window(time.perf_counter_ns())
            raise StopIteration  # this loader's epoch ends here: the command goes on to its next loader
        return batch

    def _finish_window(self, end: int) -> None:
        s = self.s
        assert self.window_start is not None
        self.done = True
        work1 = self.source.work()
        sidecar1 = None if s.mode == "synthetic" else self.source.sidecar_totals()
        side = None
        if self.sidecar0 is not None and sidecar1 is not None:
            side = {k: sidecar1[k] - self.sidecar0[k] for k in SIDECAR_KEYS}
        if not self.synthetic_from_now:
            self.source.stop(self._inner)
        self._inner = iter(())  # the real iterator goes now (a tf.data iterator's threads with it)
        s.add_section(
            self.index, self.source, mode=s.mode, steps=s.steps, warmup=s.warmup, batch_size=self.batch_size,
            epoch_batches=self.epoch_batches, num_workers=self.source.num_workers(), elapsed_ns=end - self.window_start,
            echo=int(getattr(self.source, "echo", 1)),
            wait_ns=self.waits, step_ns=self.steps_ns,
            work={k: work1.get(k, 0) - self.work0.get(k, 0) for k in WORK_KEYS}, sidecar=side, warm=self.warm_doc)


def _g(x: Optional[float]) -> str:
    return "?" if x is None else f"{x:g}"


def warm_cache(location: str, token: str, dataset: str, session: Session) -> Dict[str, Any]:
    """Reads the whole dataset once, in a separate process (this one must not use gRPC before it forks
    its DataLoader workers), so that the cache holds what fits. Returns the warm process's JSON."""
    env = dict(os.environ)
    env.update(
        UNSTALL_WARM_LOCATION=location,
        UNSTALL_WARM_TOKEN=token,
        UNSTALL_WARM_DATASET=dataset,
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
