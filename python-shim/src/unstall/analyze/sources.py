"""What the analysis needs from the loop's data source, for each kind of source it can drive.

The analysis itself (``child.AnalyzedIterator``: warm-up, the timed window, synthetic copies, the report)
is one piece of code; a :class:`Source` gives it the few facts that differ between an
``unstall.torch.DataLoader`` and a ``tf.data.Dataset`` fed by ``unstall.tf.dataset``: the dataset, the
loader's parallelism, its fetch and prep counters, the sidecar's counters, how to copy a batch and how
to stop the real iterator.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional, Protocol, Tuple

from . import AnalyzeError

__all__ = ["Source", "WarmTarget", "TorchSource", "TfSource", "WORK_KEYS", "SIDECAR_KEYS", "pipeline_datasets"]

WORK_KEYS = ("fetch_calls", "fetch_ns", "fetch_bytes", "fetch_samples", "prep_ns", "prep_samples", "prep_cpu_ns")
SIDECAR_KEYS = ("samples", "hits", "misses", "storage_bytes", "cache_bytes")


@dataclass(frozen=True)
class WarmTarget:
    """Where the cache warm pass reads the source's dataset from."""

    location: str
    token: str
    dataset: str


class Source(Protocol):
    kind: str  # "torch.DataLoader" or "tf.data.Dataset"

    def describe(self) -> Dict[str, Any]:
        """``name``, ``num_samples``, ``total_bytes``, ``format`` of the dataset (what is known)."""

    def epoch_batches(self) -> Optional[int]: ...

    def num_workers(self) -> int:
        """The loader's parallelism in the analysis model's terms: 0 when the trainer's thread does the
        loading, else how many batches are prepared at once beside the trainer."""

    def batch_size(self, batch: Any) -> Optional[float]: ...

    def work(self) -> Dict[str, int]:
        """Cumulative fetch and prep counters (``WORK_KEYS``)."""

    def sidecar_totals(self) -> Optional[Dict[str, int]]:
        """The sidecar's cumulative counters for the dataset (``SIDECAR_KEYS``), or None."""

    def warm_target(self) -> WarmTarget: ...

    def clone(self, batch: Any) -> Any:
        """A copy of a batch, as a new batch would be (fresh memory)."""

    def stop(self, iterator: Any) -> None:
        """Stops the real iterator's background work (workers, prefetch)."""


def _totals(st: Any) -> Dict[str, int]:
    return {k: int(getattr(st, k)) for k in SIDECAR_KEYS}


class TorchSource:
    """An ``unstall.torch.DataLoader``, through its stall observer (``unstall.tracing.StallObserver``)."""

    kind = "torch.DataLoader"

    def __init__(self, loader: Any) -> None:
        from .. import tracing

        self._tracing = tracing
        self.loader = loader
        observer = getattr(loader, "stall_observer", None)
        if observer is None:
            raise AnalyzeError(f"the analysed {type(loader).__name__} has no StallObserver among its observers, "
                               "which counts its fetch and prep time")
        self.obs = observer
        ds = self.loader.dataset
        if not hasattr(ds, "name") or not hasattr(ds, "_client"):
            raise AnalyzeError(f"the analysed DataLoader's dataset is a {type(ds).__name__}, not an unstall.torch.Dataset")

    def describe(self) -> Dict[str, Any]:
        ds = self.loader.dataset
        info = getattr(ds, "info", None)
        doc: Dict[str, Any] = {"name": getattr(ds, "name", None)}
        if info is not None:
            doc.update(num_samples=int(info.num_samples), total_bytes=int(info.total_bytes), format=info.format)
        return doc

    def epoch_batches(self) -> Optional[int]:
        try:
            return len(self.loader)
        except TypeError:
            return None

    def set_num_workers(self, k: int) -> None:
        """For a validation run: this many workers from the next iterator on (before it is made)."""
        loader = self.loader
        loader.num_workers = k
        if k > 0 and loader.prefetch_factor is None:
            loader.prefetch_factor = 2  # torch's default, which it leaves unset for num_workers=0

    def num_workers(self) -> int:
        return int(self.loader.num_workers)

    @property
    def echo(self) -> int:
        """The loader's data echoing factor (``unstall.echo``)."""
        return int(self.loader.echo.factor)

    def batch_size(self, batch: Any) -> Optional[float]:
        loader = self.loader
        if loader.batch_size is not None:
            return float(loader.batch_size)
        n = self.epoch_batches()
        return len(loader.dataset) / n if n else None

    def work(self) -> Dict[str, int]:
        t = self._tracing
        w = self.obs.work()
        cols = (t.FETCH_CALLS, t.FETCH_NS, t.FETCH_BYTES, t.FETCH_SAMPLES, t.PREP_NS, t.PREP_SAMPLES, t.PREP_CPU_NS)
        return {k: int(w[c]) for k, c in zip(WORK_KEYS, cols)}

    def sidecar_totals(self) -> Optional[Dict[str, int]]:
        ds = self.loader.dataset
        try:
            st = self._tracing._dataset_stats(ds)  # over the control plane: this process may still fork workers
            return _totals((st if st is not None else ds._client.stats().dataset(ds.name)).total)
        except Exception:
            return None

    def warm_target(self) -> WarmTarget:
        c = self.loader.dataset._client
        return WarmTarget(c.location, (c._token or b"").decode(), self.loader.dataset.name)

    def clone(self, batch: Any) -> Any:
        import torch

        if isinstance(batch, torch.Tensor):
            return batch.clone()
        if isinstance(batch, tuple) and hasattr(batch, "_fields"):
            return type(batch)(*(self.clone(b) for b in batch))
        if isinstance(batch, (list, tuple)):
            return type(batch)(self.clone(b) for b in batch)
        if isinstance(batch, dict):
            return type(batch)((k, self.clone(v)) for k, v in batch.items())
        return batch

    def stop(self, iterator: Any) -> None:
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()  # no worker may keep fetching (and using CPU) behind the synthetic steps


class TfSource:
    """A ``tf.data.Dataset`` whose input is an ``unstall.tf.dataset`` (a prep group's batches):
    ``dataset`` is the one the loop iterates, ``membership`` and ``counters`` those of its unstall input."""

    kind = "tf.data.Dataset"

    def __init__(self, dataset: Any, membership: Any, counters: Any, echo: int = 1) -> None:
        self.dataset = dataset
        self.m = membership
        self.counters = counters
        self.echo = echo  # the unstall.tf.dataset's data echoing factor

    def describe(self) -> Dict[str, Any]:
        doc: Dict[str, Any] = {"name": self.m.dataset}
        try:
            info = self.m.client.describe(self.m.dataset)
            doc.update(num_samples=int(info.num_samples), total_bytes=int(info.total_bytes), format=info.format)
        except Exception:
            pass
        try:
            plans = self.m.group_stats().get("cache_forms") or []
            if plans:
                doc["cache_forms"] = plans[-1]  # the sidecar's latest plan for this prep group
        except Exception:
            pass  # a sidecar without the group (restarted): the report has no cache-forms line
        return doc

    def epoch_batches(self) -> Optional[int]:
        n = int(self.dataset.cardinality())
        return n if n >= 0 else None  # unknown (-2) through from_generator: the epoch's end says it

    def num_workers(self) -> int:
        """The largest ``num_parallel_calls`` of a parallel map (AUTOTUNE: the cores), else 1 when the
        pipeline prefetches (prep runs beside the trainer) and 0 when it runs inside ``next()``."""
        par, prefetch = _pipeline_parallelism(self.dataset)
        return par if par > 0 else (1 if prefetch else 0)

    def batch_size(self, batch: Any) -> Optional[float]:
        import tensorflow as tf

        flat = tf.nest.flatten(batch)
        return float(flat[0].shape[0]) if flat and flat[0].shape.rank else None

    def work(self) -> Dict[str, int]:
        return self.counters.as_dict()

    def sidecar_totals(self) -> Optional[Dict[str, int]]:
        try:
            return _totals(self.m.client.stats().dataset(self.m.dataset).total)
        except Exception:
            return None

    def warm_target(self) -> WarmTarget:
        c = self.m.client
        return WarmTarget(c.location, (c._token or b"").decode(), self.m.dataset)

    def clone(self, batch: Any) -> Any:
        import tensorflow as tf

        return tf.nest.map_structure(lambda t: tf.identity(t) if isinstance(t, tf.Tensor) else t, batch)

    def stop(self, iterator: Any) -> None:
        pass  # dropping the iterator stops its threads; the prep group waits for the member's next read


def _pipeline_parallelism(dataset: Any) -> Tuple[int, bool]:
    """(largest parallel map width, whether the pipeline has a prefetch) over the dataset's inputs."""
    par, prefetch = 0, False
    for d in pipeline_datasets(dataset):
        calls = getattr(d, "_num_parallel_calls", None)
        if calls is not None:
            n = int(calls)
            par = max(par, (os.cpu_count() or 1) if n < 0 else n)
        prefetch = prefetch or type(d).__name__.endswith("PrefetchDataset")
    return par, prefetch


def pipeline_datasets(ds: Any) -> Iterator[Any]:
    """``ds`` and every dataset it is built on (its inputs, their inputs, ...), each once."""
    seen, todo = set(), [ds]
    while todo:
        d = todo.pop()
        if id(d) in seen:
            continue
        seen.add(id(d))
        yield d
        try:
            todo.extend(d._inputs())
        except Exception:  # a dataset kind that does not list its inputs: the walk stops there
            pass
