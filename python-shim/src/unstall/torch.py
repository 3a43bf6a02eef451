"""PyTorch integration: a map-style ``Dataset`` served by the sidecar and a ``DataLoader`` that tells
the sidecar which epoch (and session) each batch belongs to.

The data path, top to bottom: the DataLoader's sampler yields ``EpochIndex(epoch, index, session)``;
torch's fetcher hands a whole batch of them to ``Dataset.__getitems__``; that is ONE request: a FETCH on
the sidecar's local socket when it runs on this host (payloads read in place from its shared memory, no
gRPC anywhere), else a Flight DoGet; each row's payload goes through ``loader`` then ``transform``, its
label (or key) through ``target_transform``.

Each epoch's iterator is torch's wrapped by the loader's observers (``unstall.observers``; by default
``unstall.tracing``'s stall observer: ``loader.stats()``, stall spans, the epoch line) and, in a process run
by ``unstall analyze``, by the analysis (``unstall.analyze.context``), composed in ``DataLoader.__iter__``.

The parts live in modules named by what they do (``sampling``: ``EpochIndex``, ``EpochSampler``; ``dataset``:
``Dataset``; ``mixture``: ``Mixture``, datasets read at fixed proportions; ``loader``: ``DataLoader``; ``sharding``:
``DistributedSampler``, the job-wide order; ``elastic``: ``merge_states``, the ranks' states as one a job on any number
of ranks restores); this module is their public home.
"""

from __future__ import annotations

from torch.utils.data import get_worker_info

from .dataset import TRANSPORTS, Dataset
from .elastic import merge_states
from .loader import DataLoader
from .mixture import Mixture
from .observers import Observer
from .sampling import EpochIndex, EpochSampler
from .samples import decode_image, pil_loader, tensor_loader
from .sharding import DistributedSampler
from .state import epoch_seed
from .tracing import StallObserver

__all__ = [
    "Dataset",
    "DataLoader",
    "Mixture",
    "EpochIndex",
    "EpochSampler",
    "DistributedSampler",
    "merge_states",
    "epoch_seed",
    "get_worker_info",
    "pil_loader",
    "decode_image",
    "tensor_loader",
    "TRANSPORTS",
    "Observer",
    "StallObserver",
]

# The classes are known by their public path: spans and analyses name a loader by its class's module, and
# pickles (spawned workers) find them here.
for _cls in (Dataset, DataLoader, Mixture, EpochIndex, EpochSampler, DistributedSampler):
    _cls.__module__ = __name__
del _cls
