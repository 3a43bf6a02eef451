"""The random draws of a sidecar prep pipeline, in Python: which window of a sample ``random_resized_crop`` takes and
whether ``hflip`` flips it, exactly as the sidecar draws them (``ImagePrep.rng``, Java's ``SplittableRandom``,
``SpatialOps.cropParams``), so that a pipeline decoded on the GPU (``decode(device="mixed")``) gives every sample
of every epoch the crop the CPU path would have given it. protocol/fixtures/draws-v1.json pins both sides."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Tuple

__all__ = ["SplittableRandom", "sample_rng", "crop_params", "Box", "crop_size", "sample_box", "resized_size"]

_MASK = (1 << 64) - 1
_GOLDEN_GAMMA = 0x9E3779B97F4A7C15


def _mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _signed32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


class SplittableRandom:
    """``java.util.SplittableRandom`` (Java 17) as far as the sidecar's pipelines use it: ``nextLong``,
    ``nextInt``, ``nextInt(bound)`` and ``nextDouble``, bit for bit."""

    __slots__ = ("_seed",)

    def __init__(self, seed: int) -> None:
        self._seed = seed & _MASK

    def _next_seed(self) -> int:
        self._seed = (self._seed + _GOLDEN_GAMMA) & _MASK
        return self._seed

    def next_long(self) -> int:
        """The next 64 random bits, as an unsigned int."""
        return _mix64(self._next_seed())

    def next_int(self, bound: Optional[int] = None) -> int:
        """``nextInt()`` (a signed 32-bit int) or ``nextInt(bound)`` (in ``[0, bound)``, Java's rejection loop)."""
        z = self._next_seed()
        z = ((z ^ (z >> 33)) * 0x62A9D9ED799705F5) & _MASK
        r = _signed32((((z ^ (z >> 28)) * 0xCB24D0A5C88C35B3) & _MASK) >> 32)
        if bound is None:
            return r
        if bound <= 0:
            raise ValueError(f"bound must be positive, got {bound}")
        m = bound - 1
        if bound & m == 0:
            return r & m
        u = (r & 0xFFFFFFFF) >> 1
        while True:
            r = u % bound
            if _signed32(u + m - r) >= 0:
                return r
            u = (self.next_int() & 0xFFFFFFFF) >> 1

    def next_double(self) -> float:
        return (self.next_long() >> 11) * 2.0 ** -53


def sample_rng(seed: int, epoch: int, sample_id: int) -> SplittableRandom:
    """The sidecar's generator for one sample of one epoch (``ImagePrep.rng``): a SplitMix64 hash of the three."""
    h = _mix64((seed ^ _GOLDEN_GAMMA) & _MASK)
    h = _mix64(h ^ (epoch & _MASK))
    h = _mix64(h ^ (sample_id & _MASK))
    return SplittableRandom(h)


def _uniform(rng: SplittableRandom, lo: float, hi: float) -> float:
    return lo if lo == hi else lo + (hi - lo) * rng.next_double()


def _java_round(x: float) -> int:
    """``Math.round(double)``: half up."""
    return math.floor(x + 0.5)


def crop_params(height: int, width: int, scale: Sequence[float], ratio: Sequence[float],
                rng: SplittableRandom) -> Tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` as the sidecar draws it: ``(top, left, height, width)``."""
    area = float(height) * width
    log_min, log_max = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * _uniform(rng, scale[0], scale[1])
        aspect = math.exp(_uniform(rng, log_min, log_max))
        w = _java_round(math.sqrt(target * aspect))
        h = _java_round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = rng.next_int(height - h + 1)
            left = rng.next_int(width - w + 1)
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w = width
        h = _java_round(w / ratio[0])
    elif in_ratio > ratio[1]:
        h = height
        w = _java_round(h * ratio[1])
    else:
        w, h = width, height
    h = max(1, min(h, height))
    w = max(1, min(w, width))
    return (height - h) // 2, (width - w) // 2, h, w


def resized_size(size: Any, h: int, w: int) -> Tuple[int, int]:
    """The size ``resize`` gives an ``h`` x ``w`` image (``SpatialOps.resizedSize``)."""
    if isinstance(size, int):
        return (size, size * w // h) if h <= w else (size * h // w, size)
    return int(size[0]), int(size[1])


@dataclass(frozen=True)
class Box:
    """What one sample's spatial ops take from its decoded ``height`` x ``width`` image: the window
    ``(top, left, h, w)`` in its pixels (fractional where a resize came first), the output ``out_h`` x ``out_w``
    it is resampled to, and whether it is then flipped."""

    top: float
    left: float
    h: float
    w: float
    out_h: int
    out_w: int
    flip: bool


def crop_size(size: Any) -> Tuple[int, int]:
    """A crop's ``size``: one int (a square) or ``(height, width)``, as the sidecar's pipeline takes it."""
    if isinstance(size, int):
        return size, size
    s = [int(v) for v in size]
    if len(s) != 2:
        raise ValueError(f"size must be an int or (height, width), got {size!r}")
    return s[0], s[1]


def sample_box(ops: Sequence[Mapping[str, Any]], height: int, width: int, rng: SplittableRandom) -> Box:
    """The window, size and flip the pipeline's ops give one ``height`` x ``width`` image, drawing from ``rng`` in
    the order the sidecar does. Supports what ``decode(device="mixed")`` runs: ``resize``, ``random_resized_crop``,
    ``center_crop`` (within the image) and ``hflip``, each at most once, plus ``normalize``; a ``resize`` followed
    by a crop is folded into one resampling of the original pixels (the same sample points)."""
    top, left, h, w = 0.0, 0.0, float(height), float(width)
    cur_h, cur_w = height, width  # the image's size after the ops so far
    flip = False
    for op in ops:
        name = op.get("op")
        if name == "decode" or name == "normalize":
            continue
        if name == "resize":
            cur_h, cur_w = resized_size(op["size"], cur_h, cur_w)
        elif name == "random_resized_crop":
            if (cur_h, cur_w) != (height, width):
                raise ValueError("decode(device='mixed') runs random_resized_crop on the decoded image only, not "
                                 "after a resize")
            ct, cl, ch, cw = crop_params(height, width, op.get("scale", (0.08, 1.0)),
                                         op.get("ratio", (3 / 4, 4 / 3)), rng)
            top, left, h, w = float(ct), float(cl), float(ch), float(cw)
            cur_h, cur_w = crop_size(op["size"])
        elif name == "center_crop":
            oh, ow = crop_size(op["size"])
            if oh > cur_h or ow > cur_w:
                raise ValueError(f"decode(device='mixed'): center_crop {oh}x{ow} is larger than the {cur_h}x{cur_w} "
                                 "image (the CPU path pads; the GPU path does not)")
            ct, cl = round((cur_h - oh) / 2.0), round((cur_w - ow) / 2.0)  # Python round, as the sidecar's rint
            sy, sx = h / cur_h, w / cur_w  # the current image's pixels in the original's
            top, left, h, w = top + ct * sy, left + cl * sx, oh * sy, ow * sx
            cur_h, cur_w = oh, ow
        elif name == "hflip":
            flip = rng.next_double() < float(op.get("p", 0.5))
        else:
            raise ValueError(f"decode(device='mixed') cannot run the op {name!r} on the GPU; supported: resize, "
                             "random_resized_crop, center_crop, hflip, normalize")
    return Box(top, left, h, w, cur_h, cur_w, flip)
