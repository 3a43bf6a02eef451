"""PyTorch integration: a map-style ``Dataset`` served by the sidecar and a ``DataLoader`` that tells
the sidecar which epoch each batch belongs to.

The data path, top to bottom: the DataLoader's sampler yields ``EpochIndex(epoch, index)``; torch's
fetcher hands a whole batch of them to ``Dataset.__getitems__``; that is ONE Flight DoGet; each row's
payload goes through ``loader`` then ``transform``, its label (or key) through ``target_transform``.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import time
from typing import Any, Callable, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import torch
import torch.utils.data as tud
from torch.utils.data import get_worker_info

from . import progress as _progress
from . import tracing as _tracing
from .client import FlightClient, grpc_used_in_this_process
from .protocol import DatasetInfo
from .sidecar import Sidecar, default_sidecar

__all__ = [
    "Dataset",
    "DataLoader",
    "EpochIndex",
    "EpochSampler",
    "get_worker_info",
    "pil_loader",
    "decode_image",
    "tensor_loader",
]


# ---------------------------------------------------------------------------------------------
# Loaders: payload bytes -> sample


def pil_loader(data: bytes) -> Any:
    """Decodes an image file's bytes into an RGB ``PIL.Image`` (like torchvision's ``pil_loader``)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB")


def tensor_loader(data: bytes) -> torch.Tensor:
    """The raw bytes as a 1-D ``uint8`` tensor (owns its memory)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def decode_image(data: bytes) -> torch.Tensor:
    """Decodes a JPEG/PNG/... into a ``uint8`` CHW RGB tensor with ``torchvision.io.decode_image``."""
    from torchvision.io import ImageReadMode
    from torchvision.io import decode_image as _decode

    return _decode(tensor_loader(data), mode=ImageReadMode.RGB)


# ---------------------------------------------------------------------------------------------
# Epoch-tagged sampling


class EpochIndex(NamedTuple):
    """A sample index tagged with the epoch it is drawn for; the epoch travels in the ticket."""

    epoch: int
    index: int


class EpochSampler(tud.Sampler):
    """Wraps a sampler (or, with ``batched=True``, a batch sampler) and tags what it yields with the epoch.

    The epoch starts at 0 and advances each time a new iteration starts, so it stays right with
    ``persistent_workers=True`` (the index goes to the worker with each batch). ``set_epoch(e)`` makes
    the next iteration epoch ``e``, like ``DistributedSampler.set_epoch``, and is forwarded to the
    wrapped sampler when that has ``set_epoch``.
    """

    def __init__(
        self,
        sampler: Iterable[Any],
        *,
        batched: bool = False,
        start_epoch: int = 0,
        on_epoch: Optional[Callable[[int, List[int]], None]] = None,
    ) -> None:
        if start_epoch < 0:
            raise ValueError(f"start_epoch must be >= 0, got {start_epoch}")
        self.sampler = sampler
        self.batched = batched
        self.on_epoch = on_epoch  # told the epoch's whole order before it starts (clairvoyant prefetch)
        self._next_epoch = start_epoch
        self._forward_epoch = False
        self.last_epoch: Optional[int] = None

    @property
    def epoch(self) -> int:
        """The epoch the next iteration will carry."""
        return self._next_epoch

    def set_epoch(self, epoch: int) -> None:
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._next_epoch = int(epoch)
        self._forward_epoch = True

    def __iter__(self) -> Iterator[Any]:
        # A generator: torch calls iter() on the sampler more than once per epoch (once in
        # _BaseDataLoaderIter.__init__, again in _reset), the epoch only advances when iteration starts.
        epoch = self._next_epoch
        self._next_epoch = epoch + 1
        self.last_epoch = epoch
        if self._forward_epoch and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        order: Iterable[Any] = self.sampler
        if self.on_epoch is not None:
            order = list(self.sampler)  # the order is fixed by the seed: draw it now, replay it below
            self.on_epoch(epoch, [int(i) for b in order for i in b] if self.batched else [int(i) for i in order])
        if self.batched:
            for batch in order:
                yield [EpochIndex(epoch, int(i)) for i in batch]
        else:
            for i in order:
                yield EpochIndex(epoch, int(i))

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self._next_epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.set_epoch(int(state["epoch"]))


# ---------------------------------------------------------------------------------------------
# Dataset

Index = Union[int, EpochIndex]


class Dataset(tud.Dataset):
    """A dataset registered with the sidecar, indexed like ``torchvision.datasets.ImageFolder``.

    ``dataset[i]`` is ``(sample, target)``: ``sample = transform(loader(payload_bytes))`` (the default
    loader keeps the raw ``bytes``), ``target = target_transform(label)`` where the label is the class
    index (imagefolder) or the sample's key ``shard@offset`` for formats without labels (tfrecord).
    A batch of indices (``__getitems__``, which torch's fetcher calls) is one Flight DoGet.

    With ``root`` the dataset is registered (a no-op when it already is, alike); without, it must
    already be registered.
    """

    def __init__(
        self,
        name: str,
        root: Union[str, "os.PathLike[str]", None] = None,
        format: str = "imagefolder",
        transform: Optional[Callable[[Any], Any]] = None,
        target_transform: Optional[Callable[[Any], Any]] = None,
        loader: Optional[Callable[[bytes], Any]] = None,
        sidecar: Optional[Sidecar] = None,
        options: Optional[dict[str, Any]] = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a dataset name (non-empty str) is required, got {name!r}")
        sidecar = sidecar if sidecar is not None else default_sidecar()
        if root is not None:
            with _progress.while_running(f"indexing {name!r} ({root})"):
                self.info: DatasetInfo = sidecar.register_dataset(name, root, format=format, options=options)
        else:
            self.info = sidecar.describe(name)
        self.name = name
        self.root = root
        self.format = self.info.format
        self.transform = transform
        self.target_transform = target_transform
        self.loader = loader
        self.classes: List[str] = list(self.info.classes or [])
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.epoch = 0  # used for plain int indices (a stock torch DataLoader); EpochIndex carries its own
        self._client: FlightClient = sidecar.flight_client()
        _tracing.bind_sidecar(self, sidecar)  # loader.stats() reads cache counters over the control plane

    def __repr__(self) -> str:
        return (
            f"unstall.torch.Dataset({self.name!r}, format={self.format!r}, "
            f"num_samples={len(self)}, sidecar={self._client.location!r})"
        )

    def __len__(self) -> int:
        return self.info.num_samples

    def set_epoch(self, epoch: int) -> None:
        """The epoch reported for plain int indices (the DataLoader here tags indices itself)."""
        self.epoch = int(epoch)

    def fetch(self, ids: Union[Sequence[int], np.ndarray], epoch: Optional[int] = None) -> pa.RecordBatch:
        """The raw Arrow batch (``id``, ``label``, ``key``, ``payload``) for ``ids``: one DoGet."""
        t0 = time.perf_counter_ns()
        batch = self._client.fetch(self.name, ids, self.epoch if epoch is None else epoch)
        _tracing.record_fetch(self, batch.num_rows, _tracing.payload_bytes(batch), time.perf_counter_ns() - t0)
        return batch

    def plan(self, ids: Sequence[int], epoch: int) -> None:
        """Tells the sidecar the epoch's whole order so it reads upcoming misses ahead (``prefetch``)."""
        self._client.prefetch(self.name, ids, epoch)

    def __getitem__(self, index: Index) -> Tuple[Any, Any]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[Index]) -> List[Tuple[Any, Any]]:
        if len(indices) == 0:
            return []
        epochs: List[int] = []
        ids: List[int] = []
        for ix in indices:
            if isinstance(ix, EpochIndex):
                epochs.append(ix.epoch)
                ids.append(ix.index)
            else:
                epochs.append(self.epoch)
                ids.append(int(ix))
        n = len(self)
        for i in ids:
            if i < 0:  # negative indices: as for sequences, but the wire carries unsigned ids
                raise IndexError(f"sample index {i} is out of range for dataset {self.name!r} of {n} samples")
        if all(e == epochs[0] for e in epochs):
            return self._convert(self.fetch(ids, epochs[0]))
        # Mixed epochs (a custom sampler): one DoGet per epoch, results put back in the asked order.
        out: List[Any] = [None] * len(ids)
        for e in sorted(set(epochs)):
            pos = [p for p, pe in enumerate(epochs) if pe == e]
            for p, item in zip(pos, self._convert(self.fetch([ids[p] for p in pos], e))):
                out[p] = item
        return out

    def _convert(self, batch: pa.RecordBatch) -> List[Tuple[Any, Any]]:
        t0 = time.perf_counter_ns()
        payloads = batch.column("payload").to_pylist()
        labels = batch.column("label").to_pylist()
        keys = batch.column("key").to_pylist()
        out = []
        for payload, label, key in zip(payloads, labels, keys):
            sample = self.loader(payload) if self.loader is not None else payload
            if self.transform is not None:
                sample = self.transform(sample)
            target = label if label is not None else key
            if self.target_transform is not None:
                target = self.target_transform(target)
            out.append((sample, target))
        _tracing.record_prep(self, len(out), time.perf_counter_ns() - t0)
        return out

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()  # the FlightClient drops its connection itself; no Sidecar is held


# ---------------------------------------------------------------------------------------------
# DataLoader


class DataLoader(tud.DataLoader):
    """``torch.utils.data.DataLoader`` over an unstall ``Dataset`` (or a registered dataset's name).

    Same arguments as torch's. Its sampler is wrapped in an ``EpochSampler`` so that every ticket
    carries the epoch (0 for the first iteration, then 1, 2, ...; ``set_epoch`` overrides), also with
    ``persistent_workers=True``. ``seed`` is a shortcut for ``generator=torch.Generator().manual_seed(seed)``.
    With ``clairvoyant=True`` each epoch's order is drawn when the epoch starts and sent to the sidecar,
    which then reads upcoming misses ahead of consumption (NoPFS-style prefetch, within its window).
    When ``dataset`` is a name, ``root``/``format``/``loader``/``transform``/``target_transform``
    /``sidecar`` build the ``Dataset``.
    """

    def __init__(
        self,
        dataset: Union[Dataset, str],
        batch_size: Optional[int] = 1,
        shuffle: Optional[bool] = None,
        sampler: Union[tud.Sampler, Iterable[int], None] = None,
        batch_sampler: Union[tud.Sampler, Iterable[Sequence[int]], None] = None,
        num_workers: int = 0,
        collate_fn: Optional[Callable[[List[Any]], Any]] = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Optional[Callable[[int], None]] = None,
        multiprocessing_context: Any = None,
        generator: Optional[torch.Generator] = None,
        *,
        prefetch_factor: Optional[int] = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        seed: Optional[int] = None,
        start_epoch: int = 0,
        clairvoyant: bool = False,
        sidecar: Optional[Sidecar] = None,
        root: Optional[str] = None,
        format: str = "imagefolder",
        loader: Optional[Callable[[bytes], Any]] = None,
        transform: Optional[Callable[[Any], Any]] = None,
        target_transform: Optional[Callable[[Any], Any]] = None,
    ) -> None:
        if isinstance(dataset, str):
            dataset = Dataset(
                dataset,
                root=root,
                format=format,
                transform=transform,
                target_transform=target_transform,
                loader=loader,
                sidecar=sidecar,
            )
        elif isinstance(dataset, Dataset):
            given = [k for k, v in (("root", root), ("loader", loader), ("transform", transform),
                                    ("target_transform", target_transform), ("sidecar", sidecar)) if v is not None]
            if given:
                raise ValueError(f"{', '.join(given)} only apply when dataset is a name; set them on the Dataset")
        else:
            raise TypeError(
                f"unstall.torch.DataLoader needs an unstall.torch.Dataset or a dataset name, got {type(dataset).__name__}"
            )
        if seed is not None:
            if generator is not None:
                raise ValueError("pass either seed or generator, not both")
            generator = torch.Generator()
            generator.manual_seed(int(seed))

        # Clairvoyant prefetch (NoPFS): the sampler's order is known once the epoch starts, so send it.
        on_epoch = (lambda epoch, ids: dataset.plan(ids, epoch)) if clairvoyant else None
        common = dict(
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            generator=generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last")
            self.epoch_sampler = EpochSampler(batch_sampler, batched=True, start_epoch=start_epoch, on_epoch=on_epoch)
            super().__init__(dataset, batch_sampler=self.epoch_sampler, **common)
        else:
            if sampler is not None and shuffle:
                raise ValueError("sampler option is mutually exclusive with shuffle")
            if sampler is None:
                sampler = tud.RandomSampler(dataset, generator=generator) if shuffle else tud.SequentialSampler(dataset)
            self.epoch_sampler = EpochSampler(sampler, start_epoch=start_epoch, on_epoch=on_epoch)
            super().__init__(
                dataset, batch_size=batch_size, sampler=self.epoch_sampler, drop_last=drop_last, **common
            )
        self._user_context = multiprocessing_context is not None

    def _get_iterator(self) -> Any:
        # Workers forked from a process that has used gRPC (Flight) can hang: start them from a
        # clean forkserver instead, unless the caller chose a context.
        if (
            self.num_workers > 0
            and not self._user_context
            and grpc_used_in_this_process()
            and multiprocessing.get_start_method(allow_none=False) == "fork"
        ):
            ctx = multiprocessing.get_context("forkserver")
            # Preload torch in the fork server so each worker does not import it again (seconds).
            ctx.set_forkserver_preload(["__main__", "torch", "unstall.torch"])
            self.multiprocessing_context = ctx
        return super()._get_iterator()

    def __iter__(self) -> Any:
        # Timed and counted (loader.stats(), stall spans); under `unstall analyze`, driven by it.
        return _tracing.observe(self, super().__iter__, self.epoch_sampler.epoch)

    def stats(self) -> "_tracing.LoaderStats":
        """Stall, fetch/prep time, cache hits and bytes of the current epoch (``.total``: all epochs)."""
        return _tracing.observer_of(self).stats()

    @property
    def epoch(self) -> int:
        """The epoch the next iteration will carry."""
        return self.epoch_sampler.epoch

    def set_epoch(self, epoch: int) -> None:
        """Makes the next iteration epoch ``epoch`` (forwarded to a wrapped ``DistributedSampler``)."""
        self.epoch_sampler.set_epoch(epoch)
