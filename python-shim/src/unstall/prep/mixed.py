"""``decode(device="mixed")`` (DALI's name: encoded bytes in host memory, images out on the device): a prep
pipeline's JPEG decode, crop, resize, flip and normalize run on the trainer's device from the raw batches of a prep
group, with every sample's window and flip drawn as the sidecar would draw them (``draws``).

Two decode backends (``decode(backend=...)``): nvImageCodec's (``nvimgcodec_decode``: only each sample's window is
decoded, nvJPEG on CUDA) or torchvision's (``torchvision.io.decode_jpeg``: whole images, nvJPEG, batched, on CUDA);
both run on the CPU with libjpeg-turbo, which the tests use. The windows are resampled with
``torchvision.ops.roi_align`` (adaptive sampling: an area average when shrinking, bilinear when enlarging, on the
same sample points as the CPU path's resize; one call per stack of decoded images), rounded to integers as the CPU
path's uint8 intermediate is, then flipped, normalized and cast on the device."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .draws import Box, sample_box, sample_boxes, sample_rng, sample_rngs
from .jpeg_rules import JpegCheck, jpeg_check, with_standard_tables
from .mixed_parts import Group, describe_image, image_header, not_an_image, not_decodable, to_device
from .pipeline import check_decode_backend
from ..png_rules import png_check, png_data_check
from ..protocol import VouchedHeader

__all__ = ["MIXED", "decode_device", "resolve_backend", "MixedDecode", "payload_tensors"]

MIXED = "mixed"
# the sidecar's --max-decode-pixels and --max-decode-aspect-ratio defaults (PIL's cap), for a sidecar whose join
# answer has no "decode_limits"
_MAX_PIXELS = 89_478_485
_MAX_ASPECT_RATIO = 100.0
_DEVICE_ONLY = ("device", "cpu_load", "backend", "roi", "hw_decoder_load")  # decode keys the sidecar never sees
# timing(n, work): runs work(), the device's part of a batch that grows with its n encoded samples, and times it
Timing = Callable[[int, Callable[[], Any]], Any]


def _refused(sample_id: int, key: str, why: str) -> ValueError:
    """The error of a sample the device path refuses before any decoder sees it, naming it."""
    return ValueError(f"decode(device='mixed'): sample {sample_id} ({key}): {why}")


def decode_device(spec: Any) -> str:
    """Where a pipeline (``Pipeline`` or its JSON) decodes: ``"cpu"`` (the sidecar) or ``"mixed"`` (the device)."""
    doc = spec.to_json() if hasattr(spec, "to_json") else spec
    ops = doc.get("ops") if isinstance(doc, Mapping) else None
    if not ops or not isinstance(ops[0], Mapping) or ops[0].get("op") != "decode":
        return "cpu"
    device = str(ops[0].get("device", "cpu"))
    if device not in ("cpu", MIXED):
        raise ValueError(f"decode device must be 'cpu' (the sidecar) or 'mixed' (the trainer's device), got {device!r}")
    return device


def resolve_backend(backend: Any, device_type: str = "cpu", nvimgcodec_options: bool = False) -> str:
    """The decoder a ``decode(device="mixed", backend=...)`` runs on a device of ``device_type``: ``"nvimgcodec"`` or
    ``"torchvision"``. ``"auto"``: on CUDA torchvision's batched nvJPEG decode of whole images, which decoded 1.86x
    the images of nvImageCodec's region decode on an H200 (docs/PREP.md "The decode backend"), unless the decode op
    sets nvImageCodec's own options (``nvimgcodec_options``: ``hw_decoder_load``, ``roi``); elsewhere nvImageCodec
    where it imports (libjpeg-turbo's region decode), else torchvision. nvImageCodec named but missing raises an
    ImportError that says what to install."""
    backend = check_decode_backend(backend)
    if backend == "torchvision" or (backend == "auto" and device_type == "cuda" and not nvimgcodec_options):
        return "torchvision"
    from .nvimgcodec_decode import import_nvimgcodec

    try:
        import_nvimgcodec()
    except ImportError:
        if backend == "nvimgcodec":
            raise
        return "torchvision"
    return "nvimgcodec"


class MixedDecode:
    """Turns raw batches (a prep group's stored bytes) into the pipeline's images on ``device``.

    ``ops``: the pipeline's ops (``decode(device="mixed")`` first); ``dtype``: ``"uint8"`` or a float type (with a
    ``normalize`` op, normalized); ``memory_format``: ``torch.channels_last`` or ``torch.contiguous_format`` (NCHW
    images), else the pipeline's ``layout``. ``__call__(payloads, ids, epoch, seed)`` (``payloads``: uint8 tensors
    in host memory, as :func:`payload_tensors` gives them; ``seed``: the group's) returns the images of one batch; a
    sample whose bytes do not decode raises an error naming its id and key. The caps on a sample's declared size are
    the decode op's, else the sidecar's (:meth:`set_limits`). ``headers`` (the batch's, as
    :class:`unstall.protocol.PayloadBatch` has them; optional) spare the host the JPEG rules on the rows the sidecar
    vouches for."""

    def __init__(self, ops: Sequence[Mapping[str, Any]], dtype: str, layout: str, device: Any,
                 memory_format: Any = None) -> None:
        import torch

        self.ops = [dict(o) for o in ops]
        first = self.ops[0] if self.ops else {}
        if first.get("op") != "decode" or first.get("device") != MIXED:
            raise ValueError("MixedDecode runs pipelines whose first op is decode(device='mixed')")
        if first.get("on_error", "raise") != "raise":
            raise ValueError("decode(device='mixed') supports on_error='raise' only: a batch is decoded whole on "
                             "the device")
        sample_box(self.ops, 64, 64, sample_rng(0, 0, 0))  # refuses ops the device path cannot run, now
        asked = check_decode_backend(first.get("backend", "auto"))
        self.device = torch.device(device)
        self.backend = resolve_backend(asked, self.device.type, "hw_decoder_load" in first or "roi" in first)
        self.cpu_load: Any = first.get("cpu_load", 0) or 0
        self.dtype = dtype
        self.layout = layout
        self.memory_format = memory_format
        self._limits: Tuple[int, float] = (_MAX_PIXELS, _MAX_ASPECT_RATIO)
        self._roi: Any = None
        if self.backend == "nvimgcodec":
            from .nvimgcodec_decode import RoiDecode

            try:
                self._roi = RoiDecode(self.device, self.ops)
            except RuntimeError as e:  # e.g. a driver older than the CUDA its wheel was built for
                if asked == "nvimgcodec":
                    raise RuntimeError(f"decode(device='mixed', backend='nvimgcodec'): nvImageCodec's decoder does "
                                       f"not start on {self.device}: {e}") from e
                warnings.warn(f"unstall: decode(device='mixed', backend='auto'): nvImageCodec's decoder does not start "
                              f"on {self.device} ({e}); torchvision's decodes instead", RuntimeWarning, stacklevel=2)
                self.backend = "torchvision"
        if self.backend == "torchvision" and asked == "torchvision" and "hw_decoder_load" in first:
            raise ValueError("decode(device='mixed', backend='torchvision'): hw_decoder_load applies to nvImageCodec's "
                             "decoder only (torchvision's batched decode_jpeg picks the hardware engine itself)")
        first["backend"] = self.backend  # what runs: part of the decode-share scope
        norm = next((o for o in self.ops if o.get("op") == "normalize"), None)
        self._norm: Optional[Tuple[Any, Any]] = None
        if dtype != "uint8" and norm is not None:
            mean = torch.tensor(norm.get("mean", (0.485, 0.456, 0.406)), device=self.device).view(1, 3, 1, 1)
            std = torch.tensor(norm.get("std", (0.229, 0.224, 0.225)), device=self.device).view(1, 3, 1, 1)
            self._norm = (mean * 255, std * 255)

    def set_limits(self, decode_limits: Optional[Mapping[str, Any]]) -> None:
        """The sidecar's caps for a decode op that sets none (its ``prep.join`` answer's ``decode_limits``:
        ``max_pixels``, ``max_aspect_ratio``, from ``--max-decode-pixels`` and ``--max-decode-aspect-ratio``), so
        that the device refuses a sample exactly when the sidecar's CPUs do; None (an older sidecar): its
        defaults."""
        given = decode_limits or {}
        self._limits = (int(given.get("max_pixels", _MAX_PIXELS)),
                        float(given.get("max_aspect_ratio", _MAX_ASPECT_RATIO)))

    def sidecar_pipeline(self) -> Optional[dict[str, Any]]:
        """What a hybrid group's sidecar runs on its share of each batch (the same ops, uint8 NHWC: the device
        normalizes), or None when the device decodes every sample (a raw group)."""
        if self.cpu_load == 0:
            return None
        decode = {k: v for k, v in self.ops[0].items() if k not in _DEVICE_ONLY}
        rest = [o for o in self.ops[1:] if o.get("op") != "normalize"]
        return {"ops": [decode, *rest], "dtype": "uint8", "layout": "NHWC"}

    def boxes(self, sizes: Sequence[Tuple[int, int]], ids: Sequence[int], epoch: int, seed: int) -> List[Box]:
        """Each sample's window, output size and flip, from its decoded ``(height, width)``."""
        return sample_boxes(self.ops, [h for h, _ in sizes], [w for _, w in sizes], sample_rngs(seed, epoch, ids))

    def __call__(self, payloads: Sequence[Any], ids: Sequence[int], epoch: int, seed: int,
                 keys: Optional[Sequence[str]] = None, prepared: Optional[Sequence[bool]] = None,
                 timing: Optional[Timing] = None, headers: Optional[np.ndarray] = None) -> Any:
        """The batch on the device: its encoded samples decoded, cropped, resized and flipped here, the samples the
        sidecar ``prepared`` (uint8 HWC) copied in, then all normalized. ``timing(n, work)`` runs ``work``, the part
        that grows with the ``n`` encoded samples (checks, decode, resampling, flips), and times it for the hybrid's
        split (``MemberRates.timed``): what the batch costs whatever its split (the output, the copies, the
        normalization) is not counted to the device's samples. ``headers``: each row's packed
        :class:`~unstall.protocol.VouchedHeader`, -1 where the sidecar vouches for none (None: for no row)."""
        import torch

        data = list(payloads)
        n = len(data)
        on_cpu = [k for k in range(n) if prepared is not None and prepared[k]]  # pixels the sidecar prepared
        encoded = [k for k in range(n) if prepared is None or not prepared[k]]
        names = keys if keys is not None else [""] * n
        vouched = None if headers is None else np.asarray(headers, dtype=np.int64)[encoded]
        if self.device.type == "cuda" and encoded:
            # nvJPEG's hardware engine writes its outputs before the work queued on the caller's stream ran, into
            # blocks the caching allocator hands out as soon as they are freed on that stream
            # (pytorch/vision#9606, meta-pytorch/torchcodec#1634): that work is done first.
            torch.cuda.current_stream(self.device).synchronize()

        def encoded_part() -> Tuple[Any, List[Box]]:
            groups, boxes = self._decode([data[k] for k in encoded], [ids[k] for k in encoded],
                                         [names[k] for k in encoded], vouched, epoch, seed) if encoded else ([], [])
            oh, ow = self.out_size(boxes)
            out = torch.empty((n, 3, oh, ow), dtype=torch.float32, device=self.device)
            for stack, rois, members in groups:
                out[[encoded[j] for j in members]] = self._resample(stack, rois, oh, ow)
            flips = [encoded[j] for j, b in enumerate(boxes) if b.flip]
            if flips:
                idx = to_device(torch.tensor(flips), self.device)
                out[idx] = out[idx].flip(-1)
            return out, boxes

        out, boxes = timing(len(encoded), encoded_part) if timing is not None and encoded else encoded_part()
        if on_cpu:
            oh, ow = out.shape[2], out.shape[3]
            px = torch.stack([data[k] for k in on_cpu]).view(len(on_cpu), oh, ow, 3)
            out[on_cpu] = to_device(px, self.device).permute(0, 3, 1, 2).float()
        if self.dtype == "uint8":
            result = out.to(torch.uint8)
        else:
            if self._norm is not None:
                out.sub_(self._norm[0]).div_(self._norm[1])
            else:
                out.div_(255)
            result = out.to(getattr(torch, self.dtype))
        if self.memory_format is not None:
            return result.contiguous(memory_format=self.memory_format)
        return result.permute(0, 2, 3, 1).contiguous() if self.layout == "NHWC" else result

    def _decode(self, payloads: List[Any], ids: List[int], keys: List[str], vouched: Optional[np.ndarray],
                epoch: int, seed: int) -> Tuple[List[Group], List[Box]]:
        """The encoded samples' decoded pixels, in stacks to resample, and their boxes: JPEGs on the device, the
        other formats the pipeline decodes (PNG; WebP when its ``formats`` name it) on the host, as DALI's mixed
        decoder does with what nvJPEG does not decode."""
        heads = self.heads(payloads, ids, keys, vouched)
        payloads = [data for _, _, data in heads]
        jpeg = [j for j, (kind, _, _) in enumerate(heads) if kind == "jpeg"]
        rest = [j for j, (kind, _, _) in enumerate(heads) if kind != "jpeg"]
        groups: List[Group] = []
        boxes: List[Any] = [None] * len(payloads)
        sizes = [heads[j][1] for j in jpeg]  # the device path draws its windows from them: headers read once
        for part, decode in ((jpeg, lambda p, i, k: self._device_decode(p, i, k, epoch, seed, sizes)),
                             (rest, lambda p, i, k: self._host_decode(p, i, k, epoch, seed))):
            if part:
                part_groups, part_boxes = decode([payloads[j] for j in part], [ids[j] for j in part],
                                                 [keys[j] for j in part])
                for j, box in zip(part, part_boxes):
                    boxes[j] = box
                groups += [(stack, rois, [part[m] for m in members]) for stack, rois, members in part_groups]
        return groups, boxes

    def _device_decode(self, payloads: List[Any], ids: List[int], keys: List[str], epoch: int, seed: int,
                       sizes: List[Tuple[int, int]]) -> Tuple[List[Group], List[Box]]:
        if self._roi is not None:
            return self._roi(payloads, ids, keys, lambda s: self.boxes(s, ids, epoch, seed), sizes)
        from torchvision.io import ImageReadMode, decode_jpeg

        try:
            images = decode_jpeg(payloads, mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError:
            images = [self._decode_one(p, i, k) for p, i, k in zip(payloads, ids, keys)]  # names the one that fails
        return self._by_size(images, ids, epoch, seed)

    def heads(self, payloads: Sequence[Any], ids: Sequence[int], keys: Sequence[str],
              vouched: Optional[np.ndarray] = None) -> List[Tuple[str, Tuple[int, int], Any]]:
        """Each sample's ``_check``: format, ``(height, width)`` and the bytes to decode, or the first refusal.
        ``vouched``: the rows' packed :class:`~unstall.protocol.VouchedHeader` (-1: none). When the sidecar vouched
        for every row and every one passes the formats and caps and needs no standard tables, the batch is checked
        in a few array operations (what ``_check`` would find row by row); else row by row, so that every refusal
        keeps its words and its order."""
        fast = self._vouched_batch(payloads, vouched)
        if fast is not None:
            return fast
        unpacked = [None] * len(payloads) if vouched is None else [VouchedHeader.unpack(int(v)) for v in vouched]
        return [self._check(p, i, k, v) for p, i, k, v in zip(payloads, ids, keys, unpacked)]

    def _vouched_batch(self, payloads: Sequence[Any], vouched: Optional[np.ndarray]
                       ) -> Optional[List[Tuple[str, Tuple[int, int], Any]]]:
        """``heads`` of a batch whose every row the sidecar vouched for and passes as it is, else None."""
        op = self.ops[0]
        if vouched is None or len(vouched) != len(payloads) or not len(vouched) or "jpeg" not in [
                str(f) for f in op.get("formats", ("jpeg", "png"))]:
            return None
        w, h, standard_tables, _ = VouchedHeader.unpack_all(vouched)
        if (np.asarray(vouched) < 0).any() or standard_tables.any():  # none, or a Motion-JPEG frame's tables to copy in
            return None
        cap, ratio = int(op.get("max_pixels", self._limits[0])), float(op.get("max_aspect_ratio", self._limits[1]))
        short, long = np.minimum(w, h), np.maximum(w, h)
        if (w * h > cap).any() or ((short > 0) & (long / np.maximum(short, 1) > ratio)).any():
            return None  # row by row, for the refusal's words
        return [("jpeg", (hh, ww), data) for hh, ww, data in zip(h.tolist(), w.tolist(), payloads)]

    def _check(self, data: Any, sample_id: int, key: str, vouched: Optional[VouchedHeader] = None
               ) -> Tuple[str, Tuple[int, int], Any]:
        """A sample's format, ``(height, width)`` and the bytes to decode, once its header passed the pipeline's rules
        as the sidecar's ``ImagePrep.check`` applies them (``formats``; a JPEG's structure, ``jpeg_rules``, a PNG's,
        ``png_rules``; ``max_pixels`` and ``max_aspect_ratio``, the op's or the sidecar's; then what libjpeg refuses
        in a JPEG's header, which the sidecar's decoder reports after the caps), with its messages: a
        decompression bomb is refused before any decoder allocates for it, a truncated JPEG whichever decoder would
        have decoded its top rows, a truncated PNG in the sidecar's words, not the host decoder's, and a PNG whose
        image data libpng refuses (``png_data_check``) before the host decoder ends the process on it. The bytes are
        ``data`` but for a Motion-JPEG frame: a copy with the standard Huffman tables it relies on, which the sidecar
        decodes too, whichever decoder runs. A JPEG the sidecar ``vouched`` for passed its structure rules and
        libjpeg's there: its header gives the size and the standard tables, and only ``formats`` and the caps are
        applied here."""
        op = self.ops[0]
        formats = [str(f) for f in op.get("formats", ("jpeg", "png"))]
        view = data.numpy()
        kind, w, h = ("jpeg", vouched.width, vouched.height) if vouched is not None else image_header(view)
        if kind is None or kind not in formats:  # ImagePrep.check's words
            what = describe_image(view)
            names = ", ".join(f for f in ("jpeg", "png", "webp") if f in formats)
            raise _refused(sample_id, key, not_an_image(view) if what is None else
                           f"{what}, not one of the formats the pipeline decodes: {names} (decode \"formats\")")
        if vouched is not None:
            check: Optional[JpegCheck] = JpegCheck(None, vouched.standard_tables, vouched.first_scan)
        else:
            check = jpeg_check(view) if kind == "jpeg" else None
        problem = check.problem if check is not None else png_check(view) if kind == "png" else None
        # libjpeg's refusals come after the caps, as the sidecar's decoder meets them after its header check
        if problem is not None and not problem.startswith("libjpeg: "):
            raise _refused(sample_id, key, problem)
        cap, ratio = int(op.get("max_pixels", self._limits[0])), float(op.get("max_aspect_ratio", self._limits[1]))
        if w * h > cap:
            raise _refused(sample_id, key, f"decompression bomb? the {kind} header declares {w}x{h} pixels ({w * h}), "
                           f"above the cap of {cap} (--max-decode-pixels / decode max_pixels)")
        if min(w, h) > 0 and max(w, h) / min(w, h) > ratio:
            raise _refused(sample_id, key, f"the {kind} header declares {w}x{h} pixels, an aspect ratio of "
                           f"{max(w, h) / min(w, h):.1f}, above the cap of {ratio:g} "
                           "(--max-decode-aspect-ratio / decode max_aspect_ratio)")
        problem = png_data_check(view) if kind == "png" else problem
        if problem is not None:
            raise _refused(sample_id, key, problem)
        if check is not None and check.standard_tables:
            import torch

            data = torch.frombuffer(with_standard_tables(view, check), dtype=torch.uint8)
        return kind, (h, w), data

    def _host_decode(self, payloads: List[Any], ids: List[int], keys: List[str], epoch: int, seed: int
                     ) -> Tuple[List[Group], List[Box]]:
        from torchvision.io import ImageReadMode, decode_image

        images = []
        for data, i, key in zip(payloads, ids, keys):
            try:
                images.append(to_device(_eight_bit(decode_image(data, mode=ImageReadMode.RGB)), self.device))
            except RuntimeError as e:
                raise not_decodable(i, key, e) from e
        return self._by_size(images, ids, epoch, seed)

    def _by_size(self, images: List[Any], ids: List[int], epoch: int, seed: int) -> Tuple[List[Group], List[Box]]:
        """Whole decoded images (CHW) in one stack per size, with their windows, and their boxes."""
        import torch

        boxes = self.boxes([(int(im.shape[1]), int(im.shape[2])) for im in images], ids, epoch, seed)
        by_size: Dict[Tuple[int, int], List[int]] = {}
        for j, im in enumerate(images):
            by_size.setdefault((int(im.shape[1]), int(im.shape[2])), []).append(j)
        windows = [(b.left, b.top, b.left + b.w, b.top + b.h) for b in boxes]
        return [(torch.stack([images[j] for j in members]), [windows[j] for j in members], members)
                for members in by_size.values()], boxes

    def _resample(self, stack: Any, rois: Sequence[Tuple[float, float, float, float]], oh: int, ow: int) -> Any:
        """Each image's window resampled to ``oh`` x ``ow``, rounded as the CPU path's uint8 intermediate is."""
        import torch
        from torchvision.ops import roi_align

        boxes = to_device(torch.tensor([[r, *roi] for r, roi in enumerate(rois)], dtype=torch.float32), self.device)
        return roi_align(stack.float(), boxes, output_size=(oh, ow), spatial_scale=1.0, sampling_ratio=-1,
                         aligned=True).round_().clamp_(0, 255)

    def out_size(self, boxes: Sequence[Box]) -> Tuple[int, int]:
        """The one output size of a batch: from its boxes, or, when the sidecar prepared every sample, the ops'."""
        sizes = {(b.out_h, b.out_w) for b in boxes}
        if not sizes:
            box = sample_box(self.ops, 1 << 16, 1 << 16, sample_rng(0, 0, 0))  # fixed-size outputs only
            sizes = {(box.out_h, box.out_w)}
        if len(sizes) != 1:
            raise ValueError(f"decode(device='mixed'): a batch's images must come out one size, got {sorted(sizes)}")
        return sizes.pop()

    def _decode_one(self, data: Any, sample_id: int, key: str) -> Any:
        from torchvision.io import ImageReadMode, decode_jpeg

        try:
            return decode_jpeg(data, mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError as e:
            raise not_decodable(sample_id, key, e) from e


def _eight_bit(image: Any) -> Any:
    """A decoded image's samples as 8-bit: a 16-bit PNG's (torchvision's uint16) by their high byte, as the sidecar's
    decoder (OpenCV's ``IMREAD_COLOR``, libpng's ``png_set_strip_16``) gives them."""
    import torch

    if image.dtype == torch.uint8:
        return image
    return (image.to(torch.int32) >> 8).to(torch.uint8)


def payload_tensors(data: np.ndarray, offsets: np.ndarray) -> List[Any]:
    """Rows ``data[offsets[i]:offsets[i + 1]]`` as uint8 tensors over ``data`` (no copy): a
    :class:`unstall.protocol.PayloadBatch`'s, over a Flight buffer or a shared-memory slot, which the tensors keep
    alive."""
    import torch

    if data.size == 0:
        return [torch.empty(0, dtype=torch.uint8) for _ in range(len(offsets) - 1)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "not writable": read only, by decode_jpeg
        t = torch.from_numpy(data)
    return [t[int(a):int(b)] for a, b in zip(offsets[:-1], offsets[1:])]
