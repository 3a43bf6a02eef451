"""TensorFlow integration: a ``tf.data.Dataset`` fed by the sidecar, sharing a coordinated prep group.

>>> import unstall.tf
>>> from unstall import prep
>>> ds = unstall.tf.dataset("imgs", prep.imagenet_train(224, layout="NHWC"), batch_size=64, seed=0, group_size=4)
>>> model.fit(ds.prefetch(2), epochs=3)

Each iteration over the dataset (each ``model.fit`` epoch, each ``for``, each ``repeat``) reads the
group's next epoch. Elements are ``(images, labels)`` (plus ``ids`` with ``with_ids=True``):
``images`` has the pipeline's shape and dtype, ``labels`` is int64 (-1 without labels). Without a
pipeline, ``images`` is the batch's raw payloads (``tf.string``), to decode with ``tf.io``.
The dataset is batched already (the group's batch size); the batch dimension is ``None`` unless
``drop_last=True`` (and no ``on_error="skip"``, which makes batches smaller where it left bad images out;
a batch of bad images only is not yielded). Auto-sharding is off: under a distribution strategy each replica gets its slice
of every global batch (``strategy.experimental_distribute_dataset``).

:func:`dataset` returns the real ``tf.data.Dataset`` (``model.fit``, ``tf.data.Dataset.zip``, a distribution
strategy take it as any other); what the shim keeps for it (:class:`UnstallInput`: its membership, fetch counters
and echo counts) is in a registry keyed weakly by the dataset object. Datasets compare and hash by identity, so
the entry lives exactly as long as the dataset, and nothing is added to an object TensorFlow owns.

Under ``unstall analyze`` (``unstall.analyze.context``), :func:`dataset` has the analysis watch the iteration
(``for x in ds``, ``iter(ds)``) of any ``tf.data.Dataset`` built on one it returned (``.map``, ``.batch``,
``.prefetch``, ...): ``Session.watch_tf``.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import numpy as np

from . import prep as _prep
from .echo import Echo, EchoCounts
from .analyze import context as _analysis
from .analyze.sources import Source, TfSource, pipeline_datasets
from .prep import Membership, Pipeline
from .protocol import PayloadBatch

__all__ = ["dataset", "membership", "echo_counts", "unstall_input", "pipeline_datasets", "FetchCounters", "UnstallInput"]


@dataclass
class FetchCounters:
    """What a dataset's generator fetched from the sidecar (``unstall analyze``'s fetch counters; prep runs
    in tf.data's own threads, which the shim does not time)."""

    fetch_calls: int = 0
    fetch_ns: int = 0
    fetch_bytes: int = 0
    fetch_samples: int = 0

    def add(self, samples: int, nbytes: int, ns: int) -> None:
        self.fetch_calls += 1
        self.fetch_ns += ns
        self.fetch_bytes += nbytes
        self.fetch_samples += samples

    def as_dict(self) -> Dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class UnstallInput:
    """What the shim keeps for a dataset :func:`dataset` returned."""

    membership: Membership
    counters: FetchCounters
    echoes: EchoCounts


_inputs: "weakref.WeakKeyDictionary[Any, UnstallInput]" = weakref.WeakKeyDictionary()
_joined: List[Membership] = []  # every membership joined here, left at exit (leave() again is a no-op)
_lock = threading.Lock()


def dataset(
    name: str,
    pipeline: Union[Pipeline, Mapping[str, Any], None] = None,
    *,
    batch_size: int,
    with_ids: bool = False,
    device: Optional[str] = None,
    device_prefetch: int = 2,
    **join_kwargs: Any,
) -> Any:
    """Joins the prep group and returns a batched ``tf.data.Dataset`` over it.

    ``join_kwargs`` are those of :func:`unstall.prep.join` (``seed``, ``shuffle``, ``drop_last``,
    ``group_size``, ``member_timeout``, ``window``, ``staging_bytes``, ``epochs``, ``sidecar``, ...).
    ``echo``/``echo_level``: data echoing in this process (``unstall.echo``; not part of the group's key), each
    group batch (or sample) yielded ``echo`` times per epoch, reshuffled by the seed and the epoch;
    :func:`echo_counts` says what was yielded and what came fresh.

    ``device`` (a TensorFlow device name, ``"/gpu:0"``): the batches are copied to that device ahead of the step,
    ``device_prefetch`` of them in flight (``tf.data.experimental.prefetch_to_device``, which TensorFlow requires
    to be the dataset's last transformation: iterate the returned dataset as it is, or hand it to ``model.fit``).
    TensorFlow runs no dataset op on the device after the copy, so cast and normalize in the model (a
    ``Rescaling``/``Normalization`` layer runs on the GPU) over a uint8 pipeline.
    """
    import tensorflow as tf

    if device is not None and (not isinstance(device_prefetch, int) or device_prefetch < 1):
        raise ValueError(f"device_prefetch (batches in flight) must be an int >= 1, got {device_prefetch!r}")
    join_kwargs = dict(join_kwargs)
    echo = Echo.of(join_kwargs.pop("echo", 1), join_kwargs.pop("echo_level", "batch"))
    echoes = echo.counts()
    m = _prep.join(name, pipeline, batch_size=batch_size, **join_kwargs)
    skip = m.info.get("on_error") == "skip"
    batch_dim = batch_size if join_kwargs.get("drop_last") and not skip else None
    if m.shape is not None:
        images = tf.TensorSpec((batch_dim, *m.shape), tf.as_dtype(np.dtype(m.dtype)))
    else:
        images = tf.TensorSpec((batch_dim,), tf.string)
    spec: Tuple[Any, ...] = (images, tf.TensorSpec((batch_dim,), tf.int64))
    if with_ids:
        spec += (tf.TensorSpec((batch_dim,), tf.int64),)

    state = {"next": m.start_epoch}
    state_lock = threading.Lock()

    counters = FetchCounters()

    def timed(batches: Iterator[Any]) -> Iterator[Any]:
        while True:
            t0 = time.perf_counter_ns()
            try:
                b = next(batches)
            except StopIteration:
                return
            ns = time.perf_counter_ns() - t0
            if isinstance(b, PayloadBatch):  # raw payloads
                counters.add(len(b.ids), int(b.offsets[-1]), ns)
            else:  # prepared (tensors, labels, ids)
                counters.add(len(b[2]), int(b[0].nbytes), ns)
            yield b

    def generate() -> Iterator[Tuple[Any, ...]]:
        with state_lock:  # each iteration of the dataset is the group's next epoch
            epoch = state["next"]
            state["next"] = epoch + 1
        yield from echo.apply(fresh(epoch), seed=int(join_kwargs.get("seed", 0)), epoch=epoch, batch_size=batch_size,
                              counts=echoes)

    def fresh(epoch: int) -> Iterator[Tuple[Any, ...]]:
        if m.shape is not None:
            for arr, labels, ids in timed(m.epoch_arrays(epoch)):  # TF copies the view into its own tensor
                if len(ids) == 0:
                    continue  # every sample of the batch was skipped (m.skipped says which)
                out: Tuple[Any, ...] = (arr, labels.astype(np.int64, copy=False))
                yield out + ((ids.astype(np.int64, copy=False),) if with_ids else ())
            return
        for p in timed(m.epoch_payloads(epoch)):  # shared memory or Flight; TF gets bytes of its own
            raw = (np.array(p.row_bytes(), dtype=object), p.labels.astype(np.int64))
            yield raw + ((p.ids.astype(np.int64, copy=False),) if with_ids else ())

    ds = tf.data.Dataset.from_generator(generate, output_signature=spec)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    ds = ds.with_options(options)
    if device is not None:
        ds = ds.apply(tf.data.experimental.prefetch_to_device(device, buffer_size=device_prefetch))
    with _lock:
        _inputs[ds] = UnstallInput(m, counters, echoes)
        _joined.append(m)
    analysis = _analysis.current()
    if analysis is not None:  # a run of `unstall analyze`: the loop's pipelines on ds go through the analysis
        analysis.watch_tf(_analysed_source)
    return ds


def unstall_input(ds: Any) -> UnstallInput:
    """What the shim keeps for ``ds``, a dataset :func:`dataset` returned."""
    with _lock:
        v = _inputs.get(ds)
    if v is None:
        raise ValueError(f"{type(ds).__name__} is not a dataset returned by unstall.tf.dataset "
                         "(transformations return new datasets)")
    return v


def membership(ds: Any) -> Membership:
    """The group membership behind a dataset :func:`dataset` returned (``.leave()``, ``.info``)."""
    return unstall_input(ds).membership


def echo_counts(ds: Any) -> EchoCounts:
    """What a dataset :func:`dataset` returned yielded vs what came fresh from its group (``unstall.echo``)."""
    return unstall_input(ds).echoes


def _analysed_source(ds: Any) -> Optional[Tuple[Any, Source]]:
    """For the analysis: ``(the dataset :func:`dataset` returned that ``ds`` is built on, the source the
    analysis reads)``, or None when ``ds`` is built on none (``ds`` itself, an input of an input, ...)."""
    with _lock:
        found = next(((d, _inputs[d]) for d in pipeline_datasets(ds) if d in _inputs), None)
    if found is None:
        return None
    root, inp = found
    return root, TfSource(ds, inp.membership, inp.counters, inp.echoes.factor)


@atexit.register
def _leave_all() -> None:
    with _lock:
        ms = list(_joined)
        _joined.clear()
    for m in ms:
        m.leave()
