"""The random draws of a sidecar prep pipeline, in Python: which window of a sample ``random_resized_crop`` takes and
whether ``hflip`` flips it, exactly as the sidecar draws them (``ImagePrep.rng``, Java's ``SplittableRandom``,
``SpatialOps.cropParams``), so that a pipeline decoded on the GPU (``decode(device="mixed")``) gives every sample
of every epoch the crop the CPU path would have given it. protocol/fixtures/draws-v1.json pins both sides.

A batch's samples draw together (:func:`sample_boxes`): one generator per sample, advanced as numpy uint64 arrays,
each draw taken by the generators that draw it, so a batch costs a few array operations instead of a Python loop
per sample on the thread that feeds the device. The one-sample forms (:class:`SplittableRandom`, :func:`crop_params`,
:func:`sample_box`) run the same code on a batch of one."""

from __future__ import annotations

import math
from typing import Any, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

__all__ = ["SplittableRandom", "SplittableRandoms", "sample_rng", "sample_rngs", "crop_params", "Box", "crop_size",
           "sample_box", "sample_boxes", "resized_size"]

_U64 = np.uint64
_GOLDEN_GAMMA = _U64(0x9E3779B97F4A7C15)
# 1 to 8 steps of a generator's state
_GAMMAS = np.array([k * 0x9E3779B97F4A7C15 & 0xFFFF_FFFF_FFFF_FFFF for k in range(1, 9)], dtype=_U64)
_ALL = slice(None)
Index = Any  # the generators that draw: an index array or a slice


def _mix64(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
    return z ^ (z >> _U64(31))


def _u64(values: Any) -> np.ndarray:
    """Python ints (any sign, Java longs) or an integer array as their 64-bit two's complement."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        return np.atleast_1d(values).astype(_U64)  # a copy
    try:
        return np.atleast_1d(np.asarray(values, dtype=np.int64)).astype(_U64)
    except OverflowError:  # beyond int64: an unsigned long's bits
        ints = values if isinstance(values, (list, tuple)) else [values]
        return np.array([int(v) & 0xFFFF_FFFF_FFFF_FFFF for v in ints], dtype=_U64)


class SplittableRandoms:
    """One ``java.util.SplittableRandom`` (Java 17) per sample, as far as the sidecar's pipelines use it
    (``nextLong``, ``nextInt``, ``nextInt(bound)``, ``nextDouble``), bit for bit; each draw takes ``at``, the
    generators that draw (an index array; all by default), and advances only those."""

    __slots__ = ("seeds",)

    def __init__(self, seeds: Any) -> None:
        self.seeds = _u64(seeds)

    def __len__(self) -> int:
        return len(self.seeds)

    def _take(self, at: Index, k: int) -> np.ndarray:
        """The states of the next ``k`` draws of each generator ``at`` (``[len, k]``; a SplittableRandom's state
        advances by a constant, so any draw's is at hand), and those generators advanced past them."""
        states = self.seeds[at][:, None] + _GAMMAS[:k]
        if k:
            self.seeds[at] = states[:, -1]
        return states

    def _rewind(self, at: Index, k: Any) -> None:
        """Takes back the last ``k`` draws (one count, or one a generator, at least 1) of the generators ``at``."""
        self.seeds[at] -= _GAMMAS[np.asarray(k) - 1]

    def next_long(self, at: Index = _ALL) -> np.ndarray:
        """The next 64 random bits of each, as uint64."""
        return _mix64(self._take(at, 1)[:, 0])

    def next_doubles(self, at: Index, k: int) -> np.ndarray:
        """The next ``k`` ``nextDouble()`` of each generator ``at``: ``[len, k]``."""
        return (_mix64(self._take(at, k)) >> _U64(11)).astype(np.float64) * 2.0 ** -53

    def next_double(self, at: Index = _ALL) -> np.ndarray:
        return self.next_doubles(at, 1)[:, 0]

    def next_int(self, at: Index = _ALL, bound: Optional[np.ndarray] = None) -> np.ndarray:
        """``nextInt()`` (signed 32-bit ints) or ``nextInt(bound)`` (``bound``: positive int64s, one a generator;
        each in ``[0, bound)``: Java's rejection loop, which draws again only for the generators it rejected), as
        int64."""
        r = _uint32(self._take(at, 1)[:, 0])
        if bound is None:
            return np.where(r >= 1 << 31, r - (1 << 32), r)
        out, again = _bounded(r, bound)
        if again.any():
            idx = np.arange(len(self.seeds))[at]
            pending = np.flatnonzero(again)
            while len(pending):
                out[pending], again = _bounded(_uint32(self._take(idx[pending], 1)[:, 0]), bound[pending])
                pending = pending[again]
        return out

    def next_int_pair(self, at: Index, first: np.ndarray, second: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """``nextInt(first)`` then ``nextInt(second)`` of each generator ``at``, both from one pass over the next
        two states; the few a rejection makes draw more are drawn again one by one."""
        r = _uint32(self._take(at, 2))
        a, again_a = _bounded(r[:, 0], first)
        b, again_b = _bounded(r[:, 1], second)
        if again_a.any() or again_b.any():
            idx = np.arange(len(self.seeds))[at]
            # A rejected draw is followed by the next state's: the first's retries start at the second state, and
            # the second draw follows them; the second's retries follow the two states taken.
            redo = np.flatnonzero(again_a)
            self._rewind(idx[redo], 1)
            a[redo] = self.next_int(idx[redo], first[redo])
            b[redo] = self.next_int(idx[redo], second[redo])
            redo = np.flatnonzero(again_b & ~again_a)
            b[redo] = self.next_int(idx[redo], second[redo])
        return a, b


def _uint32(states: np.ndarray) -> np.ndarray:
    """``nextInt()``'s 32 bits of each state, unsigned, as int64."""
    z = states ^ (states >> _U64(33))
    z *= _U64(0x62A9D9ED799705F5)
    z ^= z >> _U64(28)
    z *= _U64(0xCB24D0A5C88C35B3)
    z >>= _U64(32)
    return z.astype(np.int64)


def _bounded(r: np.ndarray, bound: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``nextInt(bound)``'s answer from the 32 bits ``r``, and where Java's loop rejects it (draws again): a power of
    two takes the low bits; the others ``u % bound``, ``u = r >>> 1``, rejected when ``u + bound - 1 - answer``
    overflows a Java int."""
    m = bound - 1
    pow2 = (bound & m) == 0
    u = r >> 1
    out = np.where(pow2, r & m, u % bound)
    return out, (u + m - out >= 1 << 31) & ~pow2


class SplittableRandom:
    """``java.util.SplittableRandom`` (Java 17) as far as the sidecar's pipelines use it: one generator, the
    batch-of-one form of :class:`SplittableRandoms`."""

    __slots__ = ("batch",)

    def __init__(self, seed: int = 0, batch: Optional[SplittableRandoms] = None) -> None:
        self.batch = batch if batch is not None else SplittableRandoms([seed])

    def next_long(self) -> int:
        """The next 64 random bits, as an unsigned int."""
        return int(self.batch.next_long()[0])

    def next_int(self, bound: Optional[int] = None) -> int:
        """``nextInt()`` (a signed 32-bit int) or ``nextInt(bound)`` (in ``[0, bound)``, Java's rejection loop)."""
        if bound is not None and bound <= 0:
            raise ValueError(f"bound must be positive, got {bound}")
        return int(self.batch.next_int(bound=None if bound is None else np.array([bound], dtype=np.int64))[0])

    def next_double(self) -> float:
        return float(self.batch.next_double()[0])


def sample_rngs(seed: int, epoch: int, sample_ids: Any) -> SplittableRandoms:
    """The sidecar's generators for samples of one epoch (``ImagePrep.rng``): a SplitMix64 hash of the three."""
    h = _mix64(_u64(seed) ^ _GOLDEN_GAMMA)
    h = _mix64(h ^ _u64(epoch))
    return SplittableRandoms(_mix64(h ^ _u64(sample_ids)))


def sample_rng(seed: int, epoch: int, sample_id: int) -> SplittableRandom:
    """The sidecar's generator for one sample of one epoch (``ImagePrep.rng``)."""
    return SplittableRandom(batch=sample_rngs(seed, epoch, [sample_id]))


def _exp(x: np.ndarray) -> np.ndarray:
    """``math.exp`` of each (the C library's, as the sidecar's ``Math.exp`` gives on the fixtures; numpy's own may
    differ in the last bit)."""
    return np.array([math.exp(v) for v in x.ravel().tolist()], dtype=np.float64).reshape(x.shape)


# The crop attempts drawn at once: most windows fit at the first or second (a batch's generators in one pass),
# the draws of an attempt after the one that fits are taken back
_TRIES = 2


def _java_round(x: np.ndarray) -> np.ndarray:
    """``Math.round(double)``: half up."""
    return np.floor(x + 0.5).astype(np.int64)


def _crop_windows(heights: np.ndarray, widths: np.ndarray, scale: Sequence[float], ratio: Sequence[float],
                  rngs: SplittableRandoms) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """torchvision's ``RandomResizedCrop.get_params`` as the sidecar draws it, for every generator of ``rngs``:
    ``(top, left, height, width)`` arrays."""
    n = len(heights)
    top, left, h, w = (np.zeros(n, dtype=np.int64) for _ in range(4))
    area = heights.astype(np.float64) * widths
    log_min, log_max = math.log(ratio[0]), math.log(ratio[1])
    draws = int(scale[0] != scale[1]) + int(log_min != log_max)  # the doubles an attempt draws
    todo = np.arange(n)
    for first in range(0, 10, _TRIES):  # _TRIES attempts at once, the draws of those after a fit taken back
        if not len(todo):
            break
        tries = min(_TRIES, 10 - first)
        u = rngs.next_doubles(todo, draws * tries).reshape(len(todo), tries, draws)
        target = area[todo, None] * (scale[0] if scale[0] == scale[1] else
                                     scale[0] + (scale[1] - scale[0]) * u[:, :, 0])
        aspect = _exp(np.full((len(todo), tries), log_min) if log_min == log_max else
                      log_min + (log_max - log_min) * u[:, :, draws - 1])
        cw, ch = _java_round(np.sqrt(target * aspect)), _java_round(np.sqrt(target / aspect))
        fits = (cw > 0) & (cw <= widths[todo, None]) & (ch > 0) & (ch <= heights[todo, None])
        hit = fits.any(axis=1)
        at = fits.argmax(axis=1)[hit]  # each hit's first fitting attempt
        done = todo[hit]
        if draws and tries > 1:
            later = (tries - 1 - at) * draws
            rngs._rewind(done[later > 0], later[later > 0])
        h[done], w[done] = ch[hit, at], cw[hit, at]
        top[done], left[done] = rngs.next_int_pair(done, heights[done] - h[done] + 1, widths[done] - w[done] + 1)
        todo = todo[~hit]
    for k in todo.tolist():  # ten misses (rare): the central crop
        height, width = int(heights[k]), int(widths[k])
        in_ratio = width / height
        if in_ratio < ratio[0]:
            cw_k, ch_k = width, math.floor(width / ratio[0] + 0.5)
        elif in_ratio > ratio[1]:
            ch_k, cw_k = height, math.floor(height * ratio[1] + 0.5)
        else:
            cw_k, ch_k = width, height
        h[k], w[k] = max(1, min(ch_k, height)), max(1, min(cw_k, width))
        top[k], left[k] = (height - h[k]) // 2, (width - w[k]) // 2
    return top, left, h, w


def crop_params(height: int, width: int, scale: Sequence[float], ratio: Sequence[float],
                rng: SplittableRandom) -> Tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` as the sidecar draws it: ``(top, left, height, width)``."""
    top, left, h, w = _crop_windows(np.array([height]), np.array([width]), scale, ratio, rng.batch)
    return int(top[0]), int(left[0]), int(h[0]), int(w[0])


def resized_size(size: Any, h: int, w: int) -> Tuple[int, int]:
    """The size ``resize`` gives an ``h`` x ``w`` image (``SpatialOps.resizedSize``)."""
    rh, rw = _resized(size, np.array([h]), np.array([w]))
    return int(rh[0]), int(rw[0])


def _resized(size: Any, h: np.ndarray, w: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    if isinstance(size, int):
        return np.where(h <= w, size, size * h // w), np.where(h <= w, size * w // h, size)
    return np.full_like(h, int(size[0])), np.full_like(w, int(size[1]))


class Box(NamedTuple):
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


def sample_boxes(ops: Sequence[Mapping[str, Any]], heights: Any, widths: Any, rngs: SplittableRandoms) -> List[Box]:
    """The window, size and flip the pipeline's ops give each ``heights[i]`` x ``widths[i]`` image, drawing from
    ``rngs``'s i-th generator in the order the sidecar does. Supports what ``decode(device="mixed")`` runs:
    ``resize``, ``random_resized_crop``, ``center_crop`` (within the image) and ``hflip``, each at most once, plus
    ``normalize``; a ``resize`` followed by a crop is folded into one resampling of the original pixels (the same
    sample points)."""
    height, width = np.asarray(heights, dtype=np.int64), np.asarray(widths, dtype=np.int64)
    n = len(height)
    top, left = np.zeros(n), np.zeros(n)
    h, w = height.astype(np.float64), width.astype(np.float64)
    cur_h, cur_w = height, width  # each image's size after the ops so far
    flip = np.zeros(n, dtype=bool)
    for op in ops:
        name = op.get("op")
        if name == "decode" or name == "normalize":
            continue
        if name == "resize":
            cur_h, cur_w = _resized(op["size"], cur_h, cur_w)
        elif name == "random_resized_crop":
            if np.any((cur_h != height) | (cur_w != width)):
                raise ValueError("decode(device='mixed') runs random_resized_crop on the decoded image only, not "
                                 "after a resize")
            ct, cl, ch, cw = _crop_windows(height, width, op.get("scale", (0.08, 1.0)),
                                           op.get("ratio", (3 / 4, 4 / 3)), rngs)
            top, left, h, w = ct.astype(np.float64), cl.astype(np.float64), ch.astype(np.float64), cw.astype(np.float64)
            oh, ow = crop_size(op["size"])
            cur_h, cur_w = np.full(n, oh, dtype=np.int64), np.full(n, ow, dtype=np.int64)
        elif name == "center_crop":
            oh, ow = crop_size(op["size"])
            small = np.flatnonzero((oh > cur_h) | (ow > cur_w))
            if len(small):
                k = small[0]
                raise ValueError(f"decode(device='mixed'): center_crop {oh}x{ow} is larger than the "
                                 f"{cur_h[k]}x{cur_w[k]} image (the CPU path pads; the GPU path does not)")
            ct, cl = np.round((cur_h - oh) / 2.0), np.round((cur_w - ow) / 2.0)  # half to even, as the sidecar's rint
            sy, sx = h / cur_h, w / cur_w  # the current image's pixels in the original's
            top, left, h, w = top + ct * sy, left + cl * sx, oh * sy, ow * sx
            cur_h, cur_w = np.full(n, oh, dtype=np.int64), np.full(n, ow, dtype=np.int64)
        elif name == "hflip":
            flip = rngs.next_double() < float(op.get("p", 0.5))
        else:
            raise ValueError(f"decode(device='mixed') cannot run the op {name!r} on the GPU; supported: resize, "
                             "random_resized_crop, center_crop, hflip, normalize")
    return [Box(*row) for row in zip(top.tolist(), left.tolist(), h.tolist(), w.tolist(), cur_h.tolist(),
                                     cur_w.tolist(), flip.tolist())]


def sample_box(ops: Sequence[Mapping[str, Any]], height: int, width: int, rng: SplittableRandom) -> Box:
    """:func:`sample_boxes` of one image, drawing from ``rng``."""
    return sample_boxes(ops, [height], [width], rng.batch)[0]
