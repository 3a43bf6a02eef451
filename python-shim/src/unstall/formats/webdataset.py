"""``webdataset``: tar shards whose members sharing a key form a sample. A sample's payload is its members as
they lie in the shard (tar headers included); this splits them, by webdataset's own rules, into what
``webdataset.WebDataset(urls)`` yields: a dict ``{"__key__", "__url__", ext: bytes, ...}``; or, with the
``payload`` option (webdataset's ``to_tuple``), the payload member's bytes (a tuple of them for several
fields), paired with the label when the ``label`` option names the member holding it."""

from __future__ import annotations

import re
import tarfile
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from ..protocol import DatasetInfo

__all__ = ["WebDatasetDecoder", "members"]

_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext
_META = re.compile(r"__[^/]*__($|/)")  # webdataset's skip_meta
_BLOCK = 512


def members(payload: memoryview) -> Iterator[Tuple[str, memoryview]]:
    """``(name, data)`` of each regular member of a run of tar members (headers checked by ``tarfile``'s
    own header parser; pax ``path``/``size`` records and GNU long names applied)."""
    pos, end = 0, len(payload)
    name: Optional[str] = None
    size: Optional[int] = None
    while pos + _BLOCK <= end:
        block = bytes(payload[pos:pos + _BLOCK])
        if not any(block):
            return
        info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        special = info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
        n = info.size if special or size is None else size
        data = payload[pos + _BLOCK:pos + _BLOCK + n]
        pos += _BLOCK + -(-n // _BLOCK) * _BLOCK
        if info.type == tarfile.XHDTYPE:
            for record in _pax(bytes(data)):
                key, _, value = record.partition("=")
                if key == "path":
                    name = value
                elif key == "size":
                    size = int(value)
        elif info.type == tarfile.GNUTYPE_LONGNAME:
            name = bytes(data).rstrip(b"\0").decode("utf-8", "surrogateescape")
        elif not special:
            if info.isreg():
                yield (name if name is not None else info.name), data
            name, size = None, None


def _pax(data: bytes) -> Iterator[str]:
    i = 0
    while i < len(data):
        length = int(data[i:data.index(b" ", i)])
        yield data[data.index(b" ", i) + 1:i + length - 1].decode("utf-8", "surrogateescape")
        i += length


class WebDatasetDecoder:
    """Splits each sample into its members and yields what webdataset does (see the module)."""

    def __init__(self, info: DatasetInfo) -> None:
        layout = info.layout or {}
        payload = layout.get("payload")
        self.fields: Optional[List[Tuple[str, ...]]] = (
            [tuple(str(e) for e in f) for f in payload] if payload is not None else None)
        self.label: Optional[str] = layout.get("label")
        self.labelled = self.label is not None
        self.root = info.uri.rstrip("/")

    def decode(self, payloads: Sequence[memoryview], labels: Sequence[Optional[int]],
               keys: Sequence[str]) -> List[Any]:
        out: List[Any] = []
        for payload, label, key in zip(payloads, labels, keys):
            sample = self._sample(payload, key)
            out.append((sample, label) if self.labelled else sample)
        return out

    def _sample(self, payload: memoryview, key: str) -> Any:
        parts: Dict[str, memoryview] = {}
        sample_key = None
        for name, data in members(payload):
            m = _KEY.match(name)
            if m is None or _META.match(name):
                continue
            sample_key = m.group(1)
            parts[m.group(2).lower()] = data
        if self.fields is None:
            shard = key.rpartition("@")[0]
            url = self.root if self.root.endswith("/" + shard) else f"{self.root}/{shard}"  # a root that is one shard
            sample: Dict[str, Any] = {"__key__": sample_key, "__url__": url}
            sample.update((ext, bytes(data)) for ext, data in parts.items())
            return sample
        values = []
        for alternatives in self.fields:
            found: Optional[memoryview] = next((parts[e] for e in alternatives if e in parts), None)
            if found is None:  # the sidecar checked every sample while indexing: the shard changed since
                raise ValueError(f"webdataset sample {key}: none of .{' or .'.join(alternatives)} in its members")
            values.append(bytes(found))
        return values[0] if len(values) == 1 else tuple(values)
