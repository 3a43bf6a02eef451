"""Prep pipelines: plain JSON documents of ops (protocol/README.md, "Prep pipelines") that the sidecar runs
on each sample. Pure builders: no I/O, no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

from .draws import crop_size

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "ON_ERROR", "DTYPES", "DECODE_BACKENDS", "Pipeline", "decode",
           "check_decode_backend", "random_resized_crop", "resize", "center_crop", "hflip", "normalize", "imagenet_train",
           "imagenet_eval", "with_on_error"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

ON_ERROR = ("raise", "skip")

DECODE_BACKENDS = ("auto", "nvimgcodec", "torchvision")


def decode(
    *,
    device: Optional[str] = None,
    cpu_load: Union[float, str, None] = None,
    backend: Optional[str] = None,
    roi: Optional[bool] = None,
    hw_decoder_load: Optional[float] = None,
    formats: Optional[Sequence[str]] = None,
    max_pixels: Optional[int] = None,
    max_aspect_ratio: Optional[float] = None,
    on_error: Optional[str] = None,
) -> dict[str, Any]:
    """Image bytes to an RGB image (must be the first op).

    The sidecar reads each header before decoding and refuses what breaks these rules (docs/ARCHITECTURE.md,
    "Hardened decoding"): ``formats`` the pipeline accepts, by magic bytes (default ``("jpeg", "png")``;
    ``"webp"`` too), ``max_pixels`` (default: the sidecar's ``--max-decode-pixels``, 89,478,485 like PIL's
    ``Image.MAX_IMAGE_PIXELS``), ``max_aspect_ratio`` (longer side / shorter side; default the sidecar's
    ``--max-decode-aspect-ratio``, 100). ``on_error``: ``"raise"`` (default; the batch fails with an error
    naming the sample) or ``"skip"`` (the sample is left out of its batch and counted).

    ``device``: ``"cpu"`` (default: the sidecar decodes and runs every op) or ``"mixed"``, DALI's name: the
    sidecar serves the stored bytes and ``PrepLoader(device=...)`` decodes JPEGs on its device (nvJPEG on CUDA,
    through ``backend``; the other ``formats`` on the host), each sample's crop and flip drawn exactly as the
    sidecar would (``unstall.prep.draws``);
    ``cpu_load`` (with ``"mixed"``): the share of each batch the sidecar's CPUs prepare all the same (0, the
    default: none), or ``"auto"``: tuned online, the sidecar taking as much as it keeps up with while the
    device decodes the rest. ``backend`` (with ``"mixed"``): the device's decoder: ``"nvimgcodec"`` (NVIDIA
    nvImageCodec: only each sample's crop window is decoded), ``"torchvision"`` (``torchvision.io.decode_jpeg``:
    whole images) or ``"auto"`` (the default: torchvision on CUDA, the faster there as measured; elsewhere
    nvImageCodec where it imports, else torchvision); ``roi`` (with
    ``"mixed"``, nvImageCodec's): ``True`` (the default) decodes only each sample's window, ``False`` whole images
    (as DALI's ``decoders.image`` against ``decoders.image_random_crop``: where a GPU's hardware decoder outruns
    its region decode); ``hw_decoder_load`` (with ``"mixed"``, nvImageCodec's; DALI's name): the share of each
    batch's JPEGs given to the GPU's hardware JPEG engine (A100, H100 and later), the rest decoded by CUDA kernels;
    unset, nvImageCodec's default (the engine takes every JPEG it supports). docs/PREP.md, "Decoding on the GPU".
    """
    op: dict[str, Any] = {"op": "decode"}
    if device is not None:
        if device not in ("cpu", "mixed"):
            raise ValueError(f"decode device must be 'cpu' (the sidecar) or 'mixed' (JPEG decoded on the loader's "
                             f"device, as DALI's device='mixed'), got {device!r}")
        if device == "mixed":
            op["device"] = device
    if cpu_load is not None:
        if device != "mixed":
            raise ValueError("cpu_load splits a decode(device='mixed') between the sidecar's CPUs and the device; "
                             f"this decode's device is {device!r}")
        if not (cpu_load == "auto" or (isinstance(cpu_load, (int, float)) and 0 <= cpu_load <= 1)):
            raise ValueError(f"cpu_load must be a number in [0, 1] or 'auto', got {cpu_load!r}")
        op["cpu_load"] = cpu_load
    if backend is not None:
        if device != "mixed":
            raise ValueError("backend picks the device's decoder of a decode(device='mixed'); this decode's device "
                             f"is {device!r}")
        op["backend"] = check_decode_backend(backend)
    if roi is not None:
        if device != "mixed" or not isinstance(roi, bool):
            raise ValueError(f"roi (True or False) picks whether a decode(device='mixed') decodes only each window; "
                             f"got roi={roi!r} for a decode on {device or 'cpu'!r}")
        op["roi"] = roi
    if hw_decoder_load is not None:
        if device != "mixed" or isinstance(hw_decoder_load, bool) or not isinstance(hw_decoder_load, (int, float)) \
                or not 0 <= hw_decoder_load <= 1:
            raise ValueError(f"hw_decoder_load (a number in [0, 1]) is the share of a decode(device='mixed')'s JPEGs "
                             f"given to the GPU's hardware decoder; got hw_decoder_load={hw_decoder_load!r} for a "
                             f"decode on {device or 'cpu'!r}")
        op["hw_decoder_load"] = float(hw_decoder_load)
    if formats is not None:
        op["formats"] = [str(f) for f in formats]
    if max_pixels is not None:
        op["max_pixels"] = int(max_pixels)
    if max_aspect_ratio is not None:
        op["max_aspect_ratio"] = float(max_aspect_ratio)
    if on_error is not None:
        op["on_error"] = _check_on_error(on_error)
    return op


def check_decode_backend(backend: Any) -> str:
    """``backend`` of a ``decode(device="mixed")``, checked: one of :data:`DECODE_BACKENDS`."""
    if backend not in DECODE_BACKENDS:
        raise ValueError(f"decode backend must be one of {DECODE_BACKENDS} (the device's JPEG decoder), got "
                         f"{backend!r}")
    return str(backend)


def _check_on_error(on_error: str) -> str:
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    return on_error


def random_resized_crop(
    size: Union[int, Sequence[int]],
    scale: Tuple[float, float] = (0.08, 1.0),
    ratio: Tuple[float, float] = (3 / 4, 4 / 3),
) -> dict[str, Any]:
    """torchvision's ``RandomResizedCrop`` (same parameter sampling)."""
    return {"op": "random_resized_crop", "size": _size(size), "scale": list(scale), "ratio": list(ratio)}


def resize(size: Union[int, Sequence[int]]) -> dict[str, Any]:
    """One int: the shorter side becomes ``size`` (aspect kept); ``[h, w]``: exactly that."""
    return {"op": "resize", "size": size if isinstance(size, int) else list(size)}


def center_crop(size: Union[int, Sequence[int]]) -> dict[str, Any]:
    return {"op": "center_crop", "size": _size(size)}


def hflip(p: float = 0.5) -> dict[str, Any]:
    return {"op": "hflip", "p": float(p)}


def normalize(mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> dict[str, Any]:
    """``(x / 255 - mean) / std`` per RGB channel (float outputs: float32, float16, bfloat16)."""
    return {"op": "normalize", "mean": [float(m) for m in mean], "std": [float(s) for s in std]}


def _size(size: Union[int, Sequence[int]]) -> list[int]:
    return list(crop_size(size))


DTYPES = ("float32", "uint8", "float16", "bfloat16")


@dataclass(frozen=True)
class Pipeline:
    """A declarative prep pipeline; the sidecar validates it and names the op and field at fault."""

    ops: Tuple[Mapping[str, Any], ...]
    layout: str = "NCHW"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", tuple(dict(o) for o in self.ops))
        if self.layout not in ("NCHW", "NHWC"):
            raise ValueError(f"layout must be 'NCHW' or 'NHWC', got {self.layout!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")

    def to_json(self) -> dict[str, Any]:
        return {"ops": [dict(o) for o in self.ops], "layout": self.layout, "dtype": self.dtype}


def imagenet_train(size: int = 224, *, layout: str = "NCHW", dtype: str = "float32",
                   on_error: Optional[str] = None, decode_device: Optional[str] = None,
                   decode_backend: Optional[str] = None) -> Pipeline:
    """The common training recipe: decode (``decode_device``, ``decode_backend``: see :func:`decode`'s ``device``
    and ``backend``), random-resized-crop, flip, normalize."""
    ops = [decode(on_error=on_error, device=decode_device, backend=decode_backend), random_resized_crop(size),
           hflip()]
    if dtype != "uint8":
        ops.append(normalize())
    return Pipeline(tuple(ops), layout=layout, dtype=dtype)


def imagenet_eval(size: int = 224, resize_to: int = 256, *, layout: str = "NCHW",
                  on_error: Optional[str] = None) -> Pipeline:
    """The evaluation recipe: decode, resize the shorter side, center-crop, normalize."""
    return Pipeline((decode(on_error=on_error), resize(resize_to), center_crop(size), normalize()), layout=layout)


def with_on_error(pipeline: Union[Pipeline, Mapping[str, Any], None], on_error: str) -> dict[str, Any]:
    """The pipeline's JSON with its decode op's ``on_error`` set (``join(..., on_error=)`` uses it)."""
    _check_on_error(on_error)
    doc = pipeline.to_json() if isinstance(pipeline, Pipeline) else dict(pipeline) if pipeline is not None else None
    ops = doc.get("ops") if doc is not None else None
    if not isinstance(ops, (list, tuple)) or not ops or not isinstance(ops[0], Mapping) or ops[0].get("op") != "decode":
        raise ValueError("on_error applies to a sidecar pipeline's decode op (its first); this pipeline has none: "
                         f"{pipeline!r}")
    first = dict(ops[0])
    if first.get("on_error", on_error) != on_error:
        raise ValueError(f"on_error={on_error!r} contradicts the pipeline's decode op, which says "
                         f"{first['on_error']!r}")
    first["on_error"] = on_error
    return dict(doc or {}, ops=[first, *[dict(o) for o in ops[1:]]])
