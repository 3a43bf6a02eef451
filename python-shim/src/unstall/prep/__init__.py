"""Coordinated prep: the sidecar decodes and augments each batch once for a whole group of jobs.

Jobs of a hyper-parameter search that declare the same dataset, pipeline, seed, batch size, shuffle
and drop_last join one group (``prep.join``); the sidecar prepares every batch once, with a pool of
native prep threads, keeps it until every member has read it, and frees it. See docs/PREP.md.

>>> from unstall import prep
>>> pipe = prep.imagenet_train(224)
>>> with prep.PrepLoader("imgs", pipe, batch_size=64, seed=0, group_size=4) as loader:
...     for epoch in range(3):
...         for images, labels in loader:  # torch tensors, [64, 3, 224, 224] float32
...             ...

``PrepLoader`` needs torch; ``Membership`` and the pipeline builders need only pyarrow and numpy.

Modules, each importing only those above it: ``pipeline`` (the pure op builders), ``membership`` (``join``
and a member's calls), ``workers`` (the worker processes of ``SharedTransformLoader``, which need only a
membership), ``group_loader`` (``GroupLoader``: what the torch loaders share: joining, epochs, ranks, state) and
``loaders`` (``PrepLoader``, ``SharedTransformLoader``). The prepared-batch schema (its
encoding and decoding) is ``unstall.protocol``'s.
"""

from __future__ import annotations

from ..protocol import KIND_PREP, batch_to_numpy, encode_prep_ticket, numpy_dtype, skipped_of, tensor_batch
from .loaders import PrepLoader, SharedTransformLoader, device_pipeline, to_torch
from .membership import Membership, join
from .pipeline import (
    DECODE_BACKENDS,
    DTYPES,
    IMAGENET_MEAN,
    IMAGENET_STD,
    ON_ERROR,
    Pipeline,
    center_crop,
    decode,
    hflip,
    imagenet_eval,
    imagenet_train,
    normalize,
    random_resized_crop,
    resize,
    with_on_error,
)

__all__ = [
    "KIND_PREP",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "Pipeline",
    "decode",
    "random_resized_crop",
    "resize",
    "center_crop",
    "hflip",
    "normalize",
    "imagenet_train",
    "imagenet_eval",
    "encode_prep_ticket",
    "batch_to_numpy",
    "skipped_of",
    "with_on_error",
    "Membership",
    "join",
    "PrepLoader",
    "SharedTransformLoader",
    "device_pipeline",
    "DTYPES",
    "DECODE_BACKENDS",
    "ON_ERROR",
    "numpy_dtype",
    "tensor_batch",
    "to_torch",
]
