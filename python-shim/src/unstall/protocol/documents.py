"""The JSON documents the sidecar answers with: dataset descriptions, tenant tokens, stats, manifest exports."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Optional

import numpy as np


from .tickets import PROTOCOL_VERSION


__all__ = [
    "DatasetInfo",
    "parse_description",
    "parse_descriptions",
    "TenantToken",
    "IssuedToken",
    "parse_tenant_token",
    "parse_tenant_tokens",
    "parse_issued_token",
    "EpochStats",
    "DatasetStats",
    "SessionStats",
    "ClusterStats",
    "CacheStats",
    "Stats",
    "parse_stats",
    "ManifestExport",
    "parse_manifest_export",
    "parse_cached",
]


def _check_version(doc: Mapping[str, Any], what: str) -> None:
    v = doc.get("v")
    if v != PROTOCOL_VERSION:
        raise ValueError(f"{what}: unsupported version {v!r} (this client speaks version {PROTOCOL_VERSION})")


def _loads(text: str | bytes, what: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what}: not valid JSON ({e})") from None
    except RecursionError:  # "[[[[..." nested deeper than the interpreter's stack
        raise ValueError(f"{what}: not valid JSON (nested too deeply)") from None


@dataclass(frozen=True)
class DatasetInfo:
    """A registered dataset, as the sidecar describes it."""

    name: str
    format: str
    uri: str
    num_samples: int
    total_bytes: int
    classes: tuple[str, ...] | None = None
    # What a format's decoder needs (unstall.formats): dtype and row shape, columns and types, ...; None when
    # samples are plain files or records.
    layout: Mapping[str, Any] | None = field(default=None, hash=False)

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.classes or ())}


def parse_description(doc: str | bytes | Mapping[str, Any]) -> DatasetInfo:
    """Parses a dataset description (``GetFlightInfo`` app_metadata or ``describeDataset``)."""
    d = _loads(doc, "dataset description") if isinstance(doc, (str, bytes)) else doc
    if not isinstance(d, Mapping):
        raise ValueError(f"dataset description: expected a JSON object, got {type(d).__name__}")
    _check_version(d, "dataset description")
    try:
        classes = d.get("classes")
        return DatasetInfo(
            name=str(d["name"]),
            format=str(d["format"]),
            uri=str(d["uri"]),
            num_samples=int(d["num_samples"]),
            total_bytes=int(d["total_bytes"]),
            classes=tuple(str(c) for c in classes) if classes is not None else None,
            layout=_layout(d.get("layout")),
        )
    except KeyError as e:
        raise ValueError(f"dataset description: missing field {e.args[0]!r}") from None
    except (TypeError, AttributeError, ValueError, OverflowError) as e:  # a field of the wrong type, e.g. null
        raise ValueError(f"dataset description: a field has the wrong type ({e})") from None


def _layout(v: Any) -> Mapping[str, Any] | None:
    if v is not None and not isinstance(v, Mapping):
        raise TypeError(f"layout must be an object, got {type(v).__name__}")
    return v


def parse_descriptions(doc: str | bytes) -> list[DatasetInfo]:
    items = _loads(doc, "dataset list")
    if not isinstance(items, list):
        raise ValueError(f"dataset list: expected a JSON array, got {type(items).__name__}")
    return [parse_description(i) for i in items]


@dataclass(frozen=True)
class TenantToken:
    """A tenant token the owner issued (``listTokens``): its id, who it is for, the datasets it grants."""

    id: str
    name: str
    datasets: tuple[str, ...]
    created: str


@dataclass(frozen=True)
class IssuedToken(TenantToken):
    """A token just issued (``issueToken``): the only time the sidecar hands out the token itself."""

    token: str = field(default="", repr=False)  # never in a repr, a log line or a traceback


def parse_tenant_token(doc: str | bytes | Mapping[str, Any]) -> TenantToken:
    d = _loads(doc, "tenant token") if isinstance(doc, (str, bytes)) else doc
    if not isinstance(d, Mapping):
        raise ValueError(f"tenant token: expected a JSON object, got {type(d).__name__}")
    _check_version(d, "tenant token")
    try:
        return TenantToken(id=str(d["id"]), name=str(d.get("name", "")),
                           datasets=tuple(str(x) for x in d["datasets"]), created=str(d.get("created", "")))
    except KeyError as e:
        raise ValueError(f"tenant token: missing field {e.args[0]!r}") from None


def parse_tenant_tokens(doc: str | bytes) -> list[TenantToken]:
    items = _loads(doc, "tenant token list")
    if not isinstance(items, list):
        raise ValueError(f"tenant token list: expected a JSON array, got {type(items).__name__}")
    return [parse_tenant_token(i) for i in items]


def parse_issued_token(doc: str | bytes) -> IssuedToken:
    d = _loads(doc, "issued token")
    t = parse_tenant_token(d)
    token = d.get("token")
    if not isinstance(token, str) or len(token) < 16:
        raise ValueError("issued token: the reply carries no token")
    return IssuedToken(id=t.id, name=t.name, datasets=t.datasets, created=t.created, token=token)


@dataclass(frozen=True)
class EpochStats:
    samples: int = 0
    hits: int = 0
    misses: int = 0
    storage_bytes: int = 0
    cache_bytes: int = 0
    disk_hits: int = 0
    disk_bytes: int = 0
    prefetch_hits: int = 0
    # Digests an imported manifest claimed, checked against the dataset's own bytes on first read:
    # confirmed, and refused (the claimed entry is never served; the sample's own bytes are).
    verified: int = 0
    verify_mismatches: int = 0
    peer_hits: int = 0  # served from the cache of the sidecar that owns the sample (a cluster)
    peer_bytes: int = 0
    peer_fallbacks: int = 0  # samples whose owner failed or left: read from storage (counted in misses too)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EpochStats:
        return cls(**{f.name: int(d.get(f.name, 0)) for f in fields(cls)})


@dataclass(frozen=True)
class DatasetStats:
    epochs: dict[int, EpochStats] = field(default_factory=dict)
    total: EpochStats = field(default_factory=EpochStats)
    # In a cluster: what this sidecar served to peers as the samples' owner (not its own clients' epochs).
    served_to_peers: Optional[DatasetStats] = None

    def epoch(self, epoch: int) -> EpochStats:
        """The counters of one epoch (zeros when the sidecar saw none of it)."""
        return self.epochs.get(epoch, EpochStats())


@dataclass(frozen=True)
class SessionStats(DatasetStats):
    """One session's counters (a DataLoader's view of a dataset over the local socket): its dataset,
    name and transport, and epochs like a dataset's."""

    dataset: str = ""
    name: str = ""
    transport: str = ""


def _dataset_stats(d: Mapping[str, Any], cls: type = DatasetStats, **extra: Any) -> Any:
    peers = d.get("served_to_peers")
    return cls(
        epochs={int(e): EpochStats.from_json(v) for e, v in d.get("epochs", {}).items()},
        total=EpochStats.from_json(d.get("total", {})),
        served_to_peers=None if peers is None else _dataset_stats(peers),
        **extra,
    )


@dataclass(frozen=True)
class ClusterStats:
    """The partitioned cache's view from this sidecar: members it sees, and whether ownership is settled."""

    members: int
    settled: bool


@dataclass(frozen=True)
class CacheStats:
    policy: str
    capacity_bytes: int
    used_bytes: int
    entries: int
    shared_bytes: int = 0


@dataclass(frozen=True)
class Stats:
    cache: CacheStats
    datasets: dict[str, DatasetStats]
    sessions: dict[int, SessionStats] = field(default_factory=dict)
    cluster: Optional[ClusterStats] = None  # None: a sidecar on its own

    def dataset(self, name: str) -> DatasetStats:
        return self.datasets.get(name, DatasetStats())

    def session(self, session: int) -> SessionStats:
        """The counters of one local-socket session (zeros when the sidecar lists none such)."""
        return self.sessions.get(int(session), SessionStats())


def parse_stats(doc: str | bytes | Mapping[str, Any]) -> Stats:
    """Parses the stats JSON (the ``stats`` action and the Py4J ``stats()`` method)."""
    d = _loads(doc, "stats") if isinstance(doc, (str, bytes)) else doc
    if not isinstance(d, Mapping):
        raise ValueError(f"stats: expected a JSON object, got {type(d).__name__}")
    _check_version(d, "stats")
    try:
        c = d["cache"]
        cache = CacheStats(
            policy=str(c["policy"]),
            capacity_bytes=int(c["capacity_bytes"]),
            used_bytes=int(c["used_bytes"]),
            entries=int(c["entries"]),
            shared_bytes=int(c.get("shared_bytes", 0)),
        )
        datasets = {str(name): _dataset_stats(ds) for name, ds in d.get("datasets", {}).items()}
        sessions = {
            int(sid): _dataset_stats(
                ss, SessionStats, dataset=str(ss.get("dataset", "")), name=str(ss.get("name", "")),
                transport=str(ss.get("transport", "")),
            )
            for sid, ss in d.get("sessions", {}).items()
        }
        k = d.get("cluster")
        cluster = None if k is None else ClusterStats(members=int(k["members"]), settled=bool(k["settled"]))
    except KeyError as e:
        raise ValueError(f"stats: missing field {e.args[0]!r}") from None
    except (TypeError, AttributeError, ValueError, OverflowError) as e:  # a field of the wrong type, e.g. a list
        raise ValueError(f"stats: a field has the wrong type ({e})") from None
    except RecursionError:  # served_to_peers nested past the stack
        raise ValueError("stats: nested too deeply") from None
    return Stats(cache=cache, datasets=datasets, sessions=sessions, cluster=cluster)


@dataclass(frozen=True)
class ManifestExport:
    """What ``exportManifest`` wrote: the file, how many sample digests it holds (each computed from the
    dataset's own bytes), and the dataset's sample count."""

    path: str
    known: int
    num_samples: int


def parse_manifest_export(doc: str | bytes) -> ManifestExport:
    """Parses the reply of the control plane's ``exportManifest``."""
    d = _loads(doc, "manifest export")
    if not isinstance(d, Mapping):
        raise ValueError(f"manifest export: expected a JSON object, got {type(d).__name__}")
    try:
        return ManifestExport(path=str(d["path"]), known=int(d["known"]), num_samples=int(d["num_samples"]))
    except KeyError as e:
        raise ValueError(f"manifest export: missing field {e.args[0]!r}") from None


def parse_cached(doc: str | bytes | Mapping[str, Any], dataset: str, samples: int) -> "np.ndarray":
    """The ``cached`` document (the Flight action, the local socket's CACHED) of ``dataset`` with ``samples`` samples:
    a bool array, True where the sample is in the memory cache or the disk tier. Its ``bitmap`` is base64 of
    ``ceil(samples / 8)`` bytes, bit ``id % 8`` (least significant first) of byte ``id // 8`` for sample ``id``."""
    d = _loads(doc, "cached") if isinstance(doc, (str, bytes)) else doc
    if not isinstance(d, Mapping):
        raise ValueError(f"cached: expected a JSON object, got {type(d).__name__}")
    _check_version(d, "cached")
    if d.get("dataset") != dataset or d.get("samples") != samples:
        raise ValueError(f"cached: the answer is for dataset {d.get('dataset')!r} of {d.get('samples')!r} samples, "
                         f"asked for {dataset!r} of {samples}")
    try:
        raw = base64.b64decode(str(d["bitmap"]), validate=True)
    except (KeyError, ValueError) as e:
        raise ValueError(f"cached: dataset {dataset!r}: no valid base64 'bitmap' ({e})") from None
    if len(raw) != (samples + 7) // 8:
        raise ValueError(f"cached: dataset {dataset!r}: a bitmap of {len(raw)} bytes for {samples} samples, expected "
                         f"{(samples + 7) // 8}")
    bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), count=samples, bitorder="little").astype(bool)
    if int(bits.sum()) != d.get("cached"):
        raise ValueError(f"cached: dataset {dataset!r}: the bitmap sets {int(bits.sum())} samples, the answer says "
                         f"{d.get('cached')!r}")
    return bits
