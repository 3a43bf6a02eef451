"""``unstall.torch.Dataset``: the map-style dataset served by the sidecar, one request per batch of
``EpochIndex``es (the local socket when the sidecar runs on this host, else Flight)."""


from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import torch.utils.data as tud

from ._alloc import tune_worker_allocator
from . import formats as _formats
from . import progress as _progress
from . import tracing as _tracing
from .client import FlightClient
from .errors import ProtocolMismatchError, SidecarError, SidecarUnavailableError
from .local import LocalClient
from .protocol import DatasetInfo, SampleBatch, parse_cached
from .sidecar import Sidecar, default_sidecar
from .sampling import EpochIndex, batch_rng, split_indices


__all__ = ["Dataset", "TRANSPORTS"]

log = logging.getLogger("unstall")

TRANSPORTS = ("auto", "shm", "flight")


# ---------------------------------------------------------------------------------------------
# Dataset

Index = Union[int, EpochIndex]


def _resolve_transport(transport: Optional[str]) -> str:
    t = transport if transport is not None else (os.environ.get("UNSTALL_TRANSPORT") or "auto")
    t = str(t).strip().lower()
    if t not in TRANSPORTS:
        source = "transport" if transport is not None else "UNSTALL_TRANSPORT"
        raise ValueError(f"{source} must be 'auto', 'shm' or 'flight', got {t!r}")
    return t


def _open_local(sidecar: Any, wanted: str) -> Optional[LocalClient]:
    """The sidecar's local socket, connected, or None (``auto``) or an error saying why (``shm``)."""
    make = getattr(sidecar, "local_client", None)
    client = make() if make is not None else None
    if client is None:
        why = ("the sidecar advertises no local socket: it runs on another host, with --no-shm or without a "
               "writable /dev/shm, or was attached by address while $UNSTALL_HOME/sidecar.json names no such "
               "sidecar")
    else:
        try:
            return client.connect()
        except SidecarError as e:
            why = str(e)
    if wanted == "shm":
        raise SidecarUnavailableError(f"transport 'shm' is not available: {why}", "UNAVAILABLE")
    log.debug("unstall: local socket unavailable (%s); using Flight", why)
    return None


class Dataset(tud.Dataset):
    """A dataset registered with the sidecar, indexed like ``torchvision.datasets.ImageFolder``.

    ``dataset[i]`` is ``(sample, target)``: ``sample = transform(loader(payload))``, ``target =
    target_transform(label)`` where the label is the class index (imagefolder) or the sample's key
    ``shard@offset`` for formats without labels (tfrecord). A batch of indices (``__getitems__``, which
    torch's fetcher calls) is one request to the sidecar. A batch of ``EpochIndex``es with a ``batch_seed`` (what
    ``unstall.torch.DataLoader`` draws) runs its loader and transforms in ``unstall.sampling.batch_rng``: their
    random draws are a function of the batch, not of the process that prepares it.

    The formats ``webdataset``, ``npy``, ``npz`` and ``csv`` (``unstall.formats``) decode their samples
    themselves, as the format's own reader does: a webdataset dict (or, with ``options={"payload": ...}``,
    the payload's bytes), a numpy row, a CSV row's dict. ``dataset[i]`` is then ``transform(sample)`` alone,
    or ``(transform(sample), target_transform(label))`` when ``options`` name a ``label``. A ``loader``
    given for them replaces the decoder: it receives the stored bytes of the sample.

    ``loader`` receives the payload as a read-only ``memoryview``, in place (no copy): in the sidecar's
    shared memory, or in the received Flight buffer. Return something that owns its data (a decoded
    image, ``bytes(view)``): a view is not picklable (DataLoader workers send samples to the trainer),
    and one kept alive pins the shared memory it maps. Without ``loader`` the sample is the payload as
    ``bytes`` (one copy). ``pil_loader``, ``decode_image`` and ``tensor_loader`` take any buffer.

    ``transport``: ``"auto"`` (the default, or ``$UNSTALL_TRANSPORT``) uses the sidecar's local socket
    when it advertises one that answers (same host: shared memory, no gRPC, so DataLoader workers can
    be forked) and Flight otherwise; ``"shm"`` requires the local socket (an error says why it is not
    available); ``"flight"`` always uses Flight. ``self.transport`` is the one chosen.

    With ``root`` the dataset is registered (a no-op when it already is, alike); without, it must
    already be registered.

    ``work_counters``: the path of the shared-memory table (``unstall.tracing.WorkCounters``) where this
    process and each DataLoader worker add up their fetch and prep time; set by the iterating
    DataLoader from its stall observer before its workers start, so that it reaches them with the pickled
    Dataset. None while no DataLoader counts for the dataset.
    """

    work_counters: Optional[str] = None

    def __init__(
        self,
        name: str,
        root: Union[str, "os.PathLike[str]", None] = None,
        format: str = "imagefolder",
        transform: Optional[Callable[[Any], Any]] = None,
        target_transform: Optional[Callable[[Any], Any]] = None,
        loader: Optional[Callable[[memoryview], Any]] = None,
        sidecar: Optional[Sidecar] = None,
        options: Optional[dict[str, Any]] = None,
        transport: Optional[str] = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a dataset name (non-empty str) is required, got {name!r}")
        wanted = _resolve_transport(transport)
        sidecar = sidecar if sidecar is not None else default_sidecar()
        if root is not None:
            with _progress.while_running(f"indexing {name!r} ({root})"):
                self.info: DatasetInfo = sidecar.register_dataset(name, os.fspath(root), format=format, options=options)
        else:
            self.info = sidecar.describe(name)
        self.name = name
        self.root = root
        self.format = self.info.format
        self.transform = transform
        self.target_transform = target_transform
        self.loader = loader
        self.decoder: Optional[_formats.Decoder] = _formats.decoder_for(self.info) if loader is None else None
        self.classes: List[str] = list(self.info.classes or [])
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.epoch = 0  # used for plain int indices (a stock torch DataLoader); EpochIndex carries its own
        self._client: FlightClient = sidecar.flight_client()  # connects only if used
        self._local: Optional[LocalClient] = _open_local(sidecar, wanted) if wanted != "flight" else None
        self.transport = "shm" if self._local is not None else "flight"
        self.work_counters = None
        _tracing.bind_sidecar(self, sidecar)  # loader.stats() reads cache counters over the control plane

    def __repr__(self) -> str:
        where = self._local.socket_path if self._local is not None else self._client.location
        return (
            f"unstall.torch.Dataset({self.name!r}, format={self.format!r}, "
            f"num_samples={len(self)}, transport={self.transport!r}, sidecar={where!r})"
        )

    def __len__(self) -> int:
        return self.info.num_samples

    def set_epoch(self, epoch: int) -> None:
        """The epoch reported for plain int indices (the DataLoader here tags indices itself)."""
        self.epoch = int(epoch)

    def _session(self, session: int) -> int:
        assert self._local is not None
        return session or self._local.default_session(self.name)

    def fetch_samples(self, ids: Union[Sequence[int], np.ndarray], epoch: Optional[int] = None,
                      session: int = 0) -> SampleBatch:
        """The samples ``ids`` in order, payloads as read-only views (no copy): one request. ``session``
        (local socket only) is a DataLoader's; 0 is this process's own session of the dataset. After a
        sidecar fault the client asks for the same ids again, so each sample is delivered once."""
        epoch = self.epoch if epoch is None else epoch
        t0 = time.perf_counter_ns()
        if self._local is not None:
            batch = self._local.fetch(self._session(session), ids, epoch, dataset=self.name)
        else:
            batch = self._client.fetch_samples(self.name, ids, epoch)
        _tracing.record_fetch(self, len(batch), batch.nbytes, time.perf_counter_ns() - t0, batch.transport)
        return batch

    def fetch(self, ids: Union[Sequence[int], np.ndarray], epoch: Optional[int] = None) -> pa.RecordBatch:
        """The batch for ``ids`` as Arrow (``id``, ``label``, ``key``, ``payload``): one request (over the
        local socket, a copy of the shared-memory payloads)."""
        return self.fetch_samples(ids, epoch).to_arrow()

    def plan(self, ids: Union[Sequence[int], np.ndarray], epoch: int, session: int = 0) -> int:
        """Tells the sidecar the epoch's whole order so it reads upcoming misses ahead: a PLAN for
        ``session`` on the local socket, the ``prefetch`` action over Flight. Returns the planned count.
        A plan names at most one id per sample (the sidecar refuses longer ones): of a sampler that draws
        more (with replacement), the first ``len(self)`` ids are planned."""
        ids = ids[: len(self)]
        if self._local is not None:
            return self._local.plan(self._session(session), ids, epoch, dataset=self.name)
        return self._client.prefetch(self.name, ids, epoch)

    def cached(self, session: int = 0) -> np.ndarray:
        """Which samples the sidecar holds now (memory cache or disk tier): a bool array of ``len(self)``, by sample
        id. One request (CACHED for ``session`` on the local socket, the ``cached`` action over Flight)."""
        if self._local is not None:
            doc: Any = self._local.cached(self._session(session), dataset=self.name)
        else:
            doc = self._client.cached(self.name)
        try:
            return parse_cached(doc, self.name, len(self))
        except ValueError as e:
            raise ProtocolMismatchError(str(e)) from None

    def open_session(self, name: str) -> int:
        """A new session on the local socket (owned by this process's connection); needs transport 'shm'."""
        if self._local is None:
            raise SidecarUnavailableError(f"dataset {self.name!r} uses Flight, which has no sessions")
        return self._local.open_session(self.name, name)

    def __getitem__(self, index: Index) -> Tuple[Any, Any]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[Index]) -> List[Tuple[Any, Any]]:
        if len(indices) == 0:
            return []
        groups, ids = split_indices(indices, self.epoch)  # (epoch, session) of each index, and the indices
        n = len(self)
        for i in ids:
            if i < 0:  # negative indices: as for sequences, but the wire carries unsigned ids
                raise IndexError(f"sample index {i} is out of range for dataset {self.name!r} of {n} samples")
        if all(g == groups[0] for g in groups):
            batch = self.fetch_samples(ids, *groups[0])
            with batch_rng(indices):
                return self._convert(batch)
        # Mixed epochs or sessions (a custom sampler): one request each, results put back in the asked order.
        fetched: List[Tuple[List[int], SampleBatch]] = []
        for g in sorted(set(groups)):
            pos = [p for p, pg in enumerate(groups) if pg == g]
            fetched.append((pos, self.fetch_samples([ids[p] for p in pos], *g)))
        out: List[Any] = [None] * len(ids)
        with batch_rng(indices):
            for pos, batch in fetched:
                for p, item in zip(pos, self._convert(batch)):
                    out[p] = item
        return out

    def _convert(self, batch: SampleBatch) -> List[Tuple[Any, Any]]:
        tune_worker_allocator()  # a worker keeps its freed heap for the next batch (unstall/_alloc.py)
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        if self.decoder is not None:
            out = self._decoded(self.decoder, batch)
            _tracing.record_prep(self, len(out), time.perf_counter_ns() - t0, time.thread_time_ns() - c0)
            return out
        load = self.loader if self.loader is not None else bytes
        out = []
        for payload, label, key in zip(batch.payloads, batch.label_list(), batch.keys):
            try:
                sample = load(payload)
                if self.transform is not None:
                    sample = self.transform(sample)
            except Exception as e:  # the error as raised, told which sample it was
                e.add_note(f"unstall: in dataset {self.name!r}, sample {key!r} ({len(payload)} bytes)")
                raise
            target = label if label is not None else key
            if self.target_transform is not None:
                target = self.target_transform(target)
            out.append((sample, target))
        _tracing.record_prep(self, len(out), time.perf_counter_ns() - t0, time.thread_time_ns() - c0)
        return out

    def _decoded(self, decoder: "_formats.Decoder", batch: SampleBatch) -> List[Any]:
        items = decoder.decode(batch.payloads, batch.label_list(), batch.keys)
        transform, target_transform = self.transform, self.target_transform
        if not decoder.labelled:
            return items if transform is None else [transform(s) for s in items]
        return [(s if transform is None else transform(s), t if target_transform is None else target_transform(t))
                for s, t in items]

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()  # the clients drop their connections themselves; no Sidecar is held
