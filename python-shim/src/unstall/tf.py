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
"""

from __future__ import annotations

import atexit
import threading
from typing import Any, Iterator, Mapping, Optional, Tuple, Union

import numpy as np

from . import prep as _prep
from .prep import Membership, Pipeline

__all__ = ["dataset", "membership"]

_memberships: dict[int, Membership] = {}
_lock = threading.Lock()


def dataset(
    name: str,
    pipeline: Union[Pipeline, Mapping[str, Any], None] = None,
    *,
    batch_size: int,
    with_ids: bool = False,
    **join_kwargs: Any,
) -> Any:
    """Joins the prep group and returns a batched ``tf.data.Dataset`` over it.

    ``join_kwargs`` are those of :func:`unstall.prep.join` (``seed``, ``shuffle``, ``drop_last``,
    ``group_size``, ``member_timeout``, ``window``, ``staging_bytes``, ``epochs``, ``sidecar``, ...).
    """
    import tensorflow as tf

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

    def generate() -> Iterator[Tuple[Any, ...]]:
        with state_lock:  # each iteration of the dataset is the group's next epoch
            epoch = state["next"]
            state["next"] = epoch + 1
        if m.shape is not None:
            for arr, labels, ids in m.epoch_arrays(epoch):  # TF copies the view into its own tensor
                if len(ids) == 0:
                    continue  # every sample of the batch was skipped (m.skipped says which)
                out: Tuple[Any, ...] = (arr, labels.astype(np.int64, copy=False))
                yield out + ((ids.astype(np.int64, copy=False),) if with_ids else ())
            return
        for rb in m.epoch(epoch):
            ids = rb.column("id").to_numpy(zero_copy_only=False)
            labels = _prep.pc.fill_null(rb.column("label"), -1).to_numpy(zero_copy_only=False)
            raw = (np.array(rb.column("payload").to_pylist(), dtype=object), labels.astype(np.int64))
            yield raw + ((ids.astype(np.int64, copy=False),) if with_ids else ())

    ds = tf.data.Dataset.from_generator(generate, output_signature=spec)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    ds = ds.with_options(options)
    with _lock:
        _memberships[id(ds)] = m
    return ds


def membership(ds: Any) -> Membership:
    """The group membership behind a dataset :func:`dataset` returned (``.leave()``, ``.info``)."""
    with _lock:
        m = _memberships.get(id(ds))
    if m is None:
        raise ValueError("not a dataset returned by unstall.tf.dataset (transformations return new datasets)")
    return m


@atexit.register
def _leave_all() -> None:
    with _lock:
        ms = list(_memberships.values())
        _memberships.clear()
    for m in ms:
        m.leave()
