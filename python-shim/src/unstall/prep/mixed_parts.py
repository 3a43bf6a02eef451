"""What ``decode(device="mixed")``'s decode backends share with ``MixedDecode`` (``mixed``, ``nvimgcodec_decode``):
the shape of the decoded pixels they hand back, the error that names a sample that does not decode, and the copy
of small host tensors onto the device. No torch import at module level."""

from __future__ import annotations

from typing import Any, List, Tuple

__all__ = ["Group", "not_decodable", "to_device"]

# Decoded images of a batch resampled in one call: an NCHW stack, each sample's window (x0, y0, x1, y1) in its image
# of the stack (the k-th window in the k-th image), and the samples' positions among the batch's encoded ones.
Group = Tuple[Any, List[Tuple[float, float, float, float]], List[int]]


def not_decodable(sample_id: int, key: str, why: Any) -> ValueError:
    """The error of a sample whose bytes the device path does not decode, naming it."""
    return ValueError(f"decode(device='mixed'): sample {sample_id} ({key}) is not a JPEG the device decodes: {why}")


def to_device(t: Any, device: Any) -> Any:
    """A small host tensor onto ``device`` without blocking this thread on the stream's earlier work."""
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)
