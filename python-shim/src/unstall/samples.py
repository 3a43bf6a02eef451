"""Loaders for ``unstall.torch.Dataset(loader=...)``: payload -> sample. Each takes any buffer: ``bytes``, or the
read-only ``memoryview`` of the payload that ``Dataset`` passes (in the sidecar's shared memory, or in the
received Flight buffer). ``unstall.torch`` re-exports them."""

from __future__ import annotations

import io
import warnings
from typing import Any, Union

import torch

from .png_rules import PNG_SIGNATURE, png_check, png_data_check

__all__ = ["Buffer", "pil_loader", "tensor_loader", "decode_image"]

Buffer = Union[bytes, bytearray, memoryview]


def pil_loader(data: Buffer) -> Any:
    """Decodes an image file's bytes (any buffer) into an RGB ``PIL.Image`` (like torchvision's
    ``pil_loader``); the image owns its pixels."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB")


def tensor_loader(data: Buffer) -> torch.Tensor:
    """The raw bytes (any buffer) as a 1-D ``uint8`` tensor that owns its memory (one copy)."""
    if len(data) == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def decode_image(data: Buffer) -> torch.Tensor:
    """Decodes a JPEG/PNG/... (any buffer) into a fresh ``uint8`` CHW RGB tensor with
    ``torchvision.io.decode_image``. The encoded bytes are read in place, not copied first. A PNG is checked first
    (``png_rules``: one more inflate of its image data): torchvision's PNG decoder ends the process on a libpng error
    in the image data, where this raises a ValueError saying what is wrong."""
    from torchvision.io import ImageReadMode
    from torchvision.io import decode_image as _decode

    if bytes(data[:8]) == PNG_SIGNATURE:
        why = png_check(data) or png_data_check(data)
        if why is not None:
            raise ValueError(f"decode_image: {why}")

    with warnings.catch_warnings():
        # A read-only buffer: torch warns that the tensor could write to it; the decoder only reads it.
        warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)
        encoded = torch.frombuffer(data, dtype=torch.uint8) if len(data) else torch.empty(0, dtype=torch.uint8)
    return _decode(encoded, mode=ImageReadMode.RGB)
