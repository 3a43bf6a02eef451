"""unstall: feed unchanged PyTorch loops from the unstall sidecar: over its local socket and shared memory
on the same host, over Arrow Flight otherwise.

``import unstall`` needs only pyarrow, py4j and numpy; the PyTorch parts (``Dataset``, ``DataLoader``,
the loaders) import torch on first use, from ``unstall.torch``.
"""

from __future__ import annotations

from typing import Any

from .client import FlightClient
from .local import LocalClient
from .errors import (
    AuthenticationError,
    DataError,
    DataFileNotFoundError,
    DatasetNotFoundError,
    InvalidRequestError,
    PermissionDeniedError,
    ProtocolMismatchError,
    ResourceExhaustedError,
    SessionNotFoundError,
    SidecarError,
    SidecarInternalError,
    SidecarStartError,
    SidecarUnavailableError,
)
from .protocol import PROTOCOL_VERSION, DatasetInfo, IssuedToken, SampleBatch, Stats, TenantToken
from .sidecar import Sidecar, default_sidecar

__version__ = "0.1.0"

_TORCH_NAMES = ("Dataset", "DataLoader", "EpochIndex", "EpochSampler", "pil_loader", "decode_image", "tensor_loader")

__all__ = [
    "__version__",
    "PROTOCOL_VERSION",
    "Sidecar",
    "default_sidecar",
    "FlightClient",
    "LocalClient",
    "DatasetInfo",
    "SampleBatch",
    "Stats",
    "TenantToken",
    "IssuedToken",
    "SidecarError",
    "SidecarStartError",
    "SidecarUnavailableError",
    "AuthenticationError",
    "PermissionDeniedError",
    "InvalidRequestError",
    "DatasetNotFoundError",
    "SessionNotFoundError",
    "DataFileNotFoundError",
    "DataError",
    "SidecarInternalError",
    "ResourceExhaustedError",
    "ProtocolMismatchError",
    *_TORCH_NAMES,
]


def __getattr__(name: str) -> Any:
    if name in _TORCH_NAMES:
        from . import torch as _torch  # imports torch itself only now

        return getattr(_torch, name)
    raise AttributeError(f"module 'unstall' has no attribute {name!r}")
