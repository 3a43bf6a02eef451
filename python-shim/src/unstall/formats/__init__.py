"""Decoders of the formats whose samples are more than one file's bytes: what ``unstall.torch.Dataset`` yields
for them, as users of the format's own Python reader expect it.

A decoder is made once per dataset from its description (``DatasetInfo.layout``: what the sidecar learned
while indexing: an array's dtype and row shape, a CSV's columns and types, the payload and label a tar
shard's samples are read for), travels to the DataLoader workers with the dataset (it is picklable), and turns
a batch's payloads (read-only views, in place) into samples that own their memory. ``imagefolder`` and
``tfrecord`` have none: their sample is the payload, through the dataset's ``loader``.

Adding a format: a module here with a class taking the ``DatasetInfo`` and implementing ``Decoder``, and
one line in ``DECODERS`` (the sidecar's ``Format`` of the same name makes the layout; docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence

from ..protocol import DatasetInfo
from . import csv, npy, parquet, webdataset

__all__ = ["Decoder", "DECODERS", "FORMATS", "decoder_for"]


class Decoder(Protocol):
    """Turns a batch's payloads into samples. ``labelled``: each item is ``(sample, target)``, the target
    being the sample's label; otherwise each item is the sample alone."""

    labelled: bool

    def decode(self, payloads: Sequence[memoryview], labels: Sequence[Optional[int]],
               keys: Sequence[str]) -> List[Any]: ...


DECODERS: Dict[str, Callable[[DatasetInfo], Decoder]] = {
    "webdataset": webdataset.WebDatasetDecoder,
    "npy": npy.NpyDecoder,
    "npz": npy.NpyDecoder,
    "csv": csv.CsvDecoder,
    "parquet": parquet.ParquetDecoder,
    "hdf5": npy.NpyDecoder,  # an HDF5 row is an array row too: the layout's dtype and shape
}

# Every format the sidecar reads: those whose sample is the payload, and those decoded here.
FORMATS = ("imagefolder", "tfrecord", *DECODERS)


def decoder_for(info: DatasetInfo) -> Optional[Decoder]:
    """The decoder of ``info``'s format, or None when its samples are the payloads themselves."""
    make = DECODERS.get(info.format)
    return make(info) if make is not None else None
