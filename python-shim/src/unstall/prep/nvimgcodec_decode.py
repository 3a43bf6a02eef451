"""The nvImageCodec backend of ``decode(device="mixed")`` (``backend="nvimgcodec"``): NVIDIA nvImageCodec's Python
package reads each sample's JPEG header (its size, without decoding), the sample's window is drawn from that size
as the sidecar draws it, and only the window is decoded (a region-of-interest decode: nvJPEG on CUDA, its hardware
engine where the GPU has one; libjpeg-turbo on the CPU, which the tests use), one batched ``decode`` call per batch.
On CUDA the windows come back in a few stacks of windows of like sizes, each window at its top left, for one
resampling call per stack (``MixedDecode``); on the CPU each on its own.

Loaded only by ``MixedDecode`` when the backend is nvImageCodec: ``import unstall`` imports neither it nor torch."""

from __future__ import annotations

import math
import os
import threading
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

from .draws import Box
from .mixed_parts import Group, image_header, not_decodable, to_device

__all__ = ["import_nvimgcodec", "cuda_backends", "stack_groups", "grown", "STACK_SLACK", "ROI_MARGIN", "RoiDecode"]

STACK_SLACK = 1.5
"""How many times its windows' own pixels a padded stack may hold at most (``stack_groups``)."""

ROI_MARGIN = 2
"""Pixels decoded beyond each side of a region (within the image) and cut off after the decode. nvJPEG before 13.2
may upsample a region's outermost chroma row and column wrongly (nvImageCodec's warning, which then declines the
region on the GPU unless ``enable_roi_fancy_upsampling`` is set): with the margin those pixels are never used, and
every kept pixel has the neighbours a whole-image decode gives it, as libjpeg-turbo's region decode does."""


def import_nvimgcodec() -> Any:
    """``nvidia.nvimgcodec``, or an ImportError that says what to install."""
    try:
        from nvidia import nvimgcodec
    except (ImportError, OSError) as e:
        raise ImportError("decode(device='mixed', backend='nvimgcodec') needs NVIDIA nvImageCodec: pip install "
                          "nvidia-nvimgcodec-cu13 nvidia-nvjpeg (CUDA 12: nvidia-nvimgcodec-cu12 nvidia-nvjpeg-cu12; "
                          f"or pip install 'unstall[nvimgcodec]'): {e}") from e
    return nvimgcodec


def cuda_backends(nv: Any, hw_decoder_load: Optional[float]) -> Optional[List[Any]]:
    """The decoder's backends on CUDA: nvImageCodec's defaults (None), or with ``hw_decoder_load`` as DALI builds
    them: the hardware engine takes that share of a batch, CUDA kernels (GPU Huffman, then host Huffman) the rest,
    the CPU what no GPU backend decodes."""
    if hw_decoder_load is None:
        return None
    return [nv.Backend(nv.BackendKind.HW_GPU_ONLY, load_hint=float(hw_decoder_load)),
            nv.Backend(nv.BackendKind.GPU_ONLY), nv.Backend(nv.BackendKind.HYBRID_CPU_GPU),
            nv.Backend(nv.BackendKind.CPU_ONLY)]


def stack_groups(shapes: Sequence[Tuple[int, int]], slack: float = STACK_SLACK) -> List[List[int]]:
    """The windows of ``shapes`` (``(height, width)`` each) in groups to stack, so that each group's stack, padded to
    its tallest and widest window plus the copied edge row and column, holds at most ``slack`` times its windows'
    own pixels: one stack padded to a batch's largest window would hold the batch size times that window, a
    device-memory blow-up when one large photo (a 4000x3000 crop) shares a batch with small ones. First fit over the
    windows sorted tallest first: a window joins the first group the bound still holds for, else opens one.
    Every index is in exactly one group; a lone window is always a group."""
    if slack < 1:
        raise ValueError(f"stack_groups: slack must be at least 1, got {slack}")
    order = sorted(range(len(shapes)), key=lambda k: (-shapes[k][0], -shapes[k][1], k))
    groups: List[List[int]] = []
    bounds: List[Tuple[int, int, int]] = []  # each group's tallest, widest (edge included) and own pixels
    for k in order:
        h, w = shapes[k][0] + 1, shapes[k][1] + 1
        for g, (tall, wide, own) in enumerate(bounds):
            if max(tall, h) * max(wide, w) * (len(groups[g]) + 1) <= slack * (own + h * w):
                groups[g].append(k)
                bounds[g] = (max(tall, h), max(wide, w), own + h * w)
                break
        else:
            groups.append([k])
            bounds.append((h, w, h * w))
    return groups


def grown(region: Tuple[int, int, int, int], height: int, width: int,
          margin: int = ROI_MARGIN) -> Tuple[int, int, int, int]:
    """``region`` (``(y0, x0, y1, x1)``) with ``margin`` more pixels on each side, within ``height`` x ``width``."""
    y0, x0, y1, x1 = region
    return max(0, y0 - margin), max(0, x0 - margin), min(height, y1 + margin), min(width, x1 + margin)


class RoiDecode:
    """Decodes the windows of a batch's samples on ``device`` (a ``torch.device``). ``ops``: the pipeline's; with a
    ``random_resized_crop`` the window is the crop, which the sidecar resizes on its own (clamped at its edges, as
    a window decoded alone is); else (a resize, a center crop) the sidecar resampled the whole image, so the region
    decoded also holds the pixels next to the window that the resampling reads."""

    def __init__(self, device: Any, ops: Sequence[Mapping[str, Any]]) -> None:
        import torch

        nv = import_nvimgcodec()
        self._nv = nv
        self.device = device
        # Its host threads (Huffman decode of small JPEGs on CUDA, all of it on the CPU): one fewer than the cores
        # this process may run on (nvImageCodec keeps one for the caller), not the machine's: a trainer pinned
        # beside a pinned sidecar stays on its cores.
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        threads = max(1, cores - 1)
        # Chroma upsampled as libjpeg-turbo does by default, as the sidecar and torchvision decode on the CPU; in a
        # region too (ROI_MARGIN cuts off the edge nvJPEG < 13.2 may get wrong): without it nvImageCodec warns once
        # per image and declines the GPU for every region decode, which then runs on this process's CPU threads.
        options = ":fancy_upsampling=1 :enable_roi_fancy_upsampling=1"
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            self._decoder = nv.Decoder(device_id=index, max_num_cpu_threads=threads,
                                       backends=cuda_backends(nv, ops[0].get("hw_decoder_load")), options=options)
        else:
            self._decoder = nv.Decoder(device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY, max_num_cpu_threads=threads,
                                       backends=[nv.Backend(nv.CPU_ONLY)], options=options)
        # RGB whatever the JPEG holds (grayscale, CMYK), no EXIF rotation: as the sidecar and torchvision decode
        self._params = nv.DecodeParams(apply_exif_orientation=False, color_spec=nv.ColorSpec.SRGB,
                                       sample_format=nv.SampleFormat.I_RGB)
        self._lock = threading.Lock()  # one decode call at a time: two threads' calls into one Decoder break it
        self._crop_window = any(o.get("op") == "random_resized_crop" for o in ops)
        self._whole = ops[0].get("roi", True) is False  # decode(roi=False): whole images, the windows resampled

    def __call__(self, payloads: Sequence[Any], ids: Sequence[int], keys: Sequence[str],
                 boxes_of: Callable[[Sequence[Tuple[int, int]]], List[Box]],
                 sizes: Optional[Sequence[Tuple[int, int]]] = None) -> Tuple[List[Group], List[Box]]:
        """The batch's decoded windows, in groups to resample, and its boxes (``boxes_of``: from the samples'
        ``(height, width)``). On CUDA a few groups of windows of like sizes, a padded stack each
        (``stack_groups``: one resampling call per group, the padding bounded); on the CPU a group per window, which
        resamples faster there than a padded stack (benchmarks/bench_mixed_backends.py)."""
        images, rois, boxes = self.windows(payloads, ids, keys, boxes_of, sizes)
        if self.device.type == "cuda":
            return self.stacked(images, rois), boxes
        return [(im.permute(2, 0, 1)[None], [roi], [k]) for k, (im, roi) in enumerate(zip(images, rois))], boxes

    def windows(self, payloads: Sequence[Any], ids: Sequence[int], keys: Sequence[str],
                boxes_of: Callable[[Sequence[Tuple[int, int]]], List[Box]],
                sizes: Optional[Sequence[Tuple[int, int]]] = None
                ) -> Tuple[List[Any], List[Tuple[float, float, float, float]], List[Box]]:
        """Each sample's decoded region (HWC uint8 on the device), its window in that region ``(x0, y0, x1, y1)``
        and its box. ``sizes``: the JPEGs' ``(height, width)`` as their headers declare them (``MixedDecode`` read
        them for its caps); else read here."""
        import torch

        nv = self._nv
        if sizes is None:
            heads = [image_header(data.numpy()) for data in payloads]
            for (kind, _, _), i, key in zip(heads, ids, keys):
                if kind != "jpeg":
                    raise not_decodable(i, key, f"a {kind or 'unknown'} image")
            sizes = [(h, w) for _, w, h in heads]
        for (h, w), i, key in zip(sizes, ids, keys):
            if not (h and w):
                raise not_decodable(i, key, "its header declares no size")
        boxes = boxes_of(sizes)
        regions = [self.region(b, h, w) for b, (h, w) in zip(boxes, sizes)]
        reads = [region if self._whole else grown(region, h, w) for region, (h, w) in zip(regions, sizes)]
        windows = []
        for data, (y0, x0, y1, x1), i, key in zip(payloads, reads, ids, keys):
            try:
                windows.append(nv.CodeStream(data.numpy()).get_sub_code_stream(region=nv.Region(y0, x0, y1, x1)))
            except RuntimeError as e:
                raise not_decodable(i, key, e) from e
        stream = torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0
        with self._lock:
            decoded = self._decoder.decode(windows, params=self._params, cuda_stream=stream)
        for image, i, key in zip(decoded, ids, keys):
            if image is None:
                raise not_decodable(i, key, "nvImageCodec could not decode it")
        rois = [(b.left - x0, b.top - y0, b.left - x0 + b.w, b.top - y0 + b.h)
                for b, (y0, x0, _, _) in zip(boxes, regions)]
        images = [self._tensor(image)[y0 - ry0:y1 - ry0, x0 - rx0:x1 - rx0]
                  for image, (y0, x0, y1, x1), (ry0, rx0, _, _) in zip(decoded, regions, reads)]
        return images, rois, boxes

    def region(self, box: Box, height: int, width: int) -> Tuple[int, int, int, int]:
        """``(y0, x0, y1, x1)``, the pixels decoded for ``box``: the whole image's (``roi=False``), the crop's, or the
        whole-image resampling's
        footprint (bilinear at sample points within half a pixel of the window reads the next pixel)."""
        if self._whole:
            return 0, 0, height, width
        if self._crop_window:
            return (math.floor(box.top), math.floor(box.left), math.ceil(box.top + box.h),
                    math.ceil(box.left + box.w))
        return (max(0, math.floor(box.top - 0.5)), max(0, math.floor(box.left - 0.5)),
                min(height, math.floor(box.top + box.h - 0.5) + 2), min(width, math.floor(box.left + box.w - 0.5) + 2))

    def _tensor(self, image: Any) -> Any:
        import numpy as np
        import torch

        if self.device.type == "cuda":
            return torch.from_dlpack(image)  # ordered after the decode on the current stream
        return torch.from_numpy(np.asarray(image))

    def stacked(self, images: Sequence[Any], rois: Sequence[Tuple[float, float, float, float]]) -> List[Group]:
        """The windows (HWC) and their rois in the groups of ``stack_groups``, a padded stack each."""
        groups = stack_groups([(int(t.shape[0]), int(t.shape[1])) for t in images])
        return [(self.stack([images[k] for k in g]), [rois[k] for k in g], g) for g in groups]

    def stack(self, images: Sequence[Any]) -> Any:
        """The windows in one float NCHW stack, each at its top left, with one more column and row copied from its
        last: bilinear sampling at a window's right and bottom edge reads that pixel, so it reads the edge, as
        resampling the window alone clamps there. Beyond that nothing is read (left uninitialized)."""
        import torch

        hs = [int(t.shape[0]) for t in images]
        ws = [int(t.shape[1]) for t in images]
        stack = torch.empty((len(images), 3, max(hs) + 1, max(ws) + 1), dtype=torch.float32, device=self.device)
        for k, t in enumerate(images):
            stack[k, :, :hs[k], :ws[k]] = t.permute(2, 0, 1)
        idx = torch.arange(len(images), device=self.device)
        h, w = to_device(torch.tensor(hs), self.device), to_device(torch.tensor(ws), self.device)
        stack[idx, :, :, w] = stack[idx, :, :, w - 1]
        stack[idx, :, h, :] = stack[idx, :, h - 1, :]
        return stack
