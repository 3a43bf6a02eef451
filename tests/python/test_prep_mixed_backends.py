"""``decode(device="mixed", backend=...)``: nvImageCodec's region decode (only each sample's window) against
torchvision's whole-image decode and the sidecar's CPU path: the same samples, windows and flips, pixels within the
bound of docs/PREP.md; errors that name the sample; the backend option checked, resolved (``"auto"``) before the
decode-share scope is worked out, and kept from the sidecar. The decoders are real (libjpeg-turbo inside
nvImageCodec and torchvision on the CPU; nvJPEG where a GPU is)."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import test_prep_mixed
from test_prep_mixed import BACKENDS, NEEDS_NVIMGCODEC, _compare, _devices, _epochs
from test_prep_native import _images
from test_prep_support import PrepEnv

from unstall import prep  # noqa: E402  (after test_prep_support put this checkout's shim first)
from unstall.prep.decode_share import share_scope  # noqa: E402
from unstall.prep.mixed import MixedDecode, resolve_backend  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TRAIN = prep.imagenet_train(48, dtype="uint8", layout="NHWC", decode_device="mixed")
EVAL = (prep.resize(56), prep.center_crop(48))
mixed_env = test_prep_mixed.env  # the fixture: a sidecar serving test_prep_mixed's JPEGs, one for this module


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """test_prep_mixed's JPEGs (the sidecar's dataset there), for the tests that decode without a sidecar."""
    return _images(tmp_path_factory.mktemp("jpegs"))


def _mixed(backend: str, ops: Any = TRAIN.ops, device: str = "cpu") -> MixedDecode:
    ops = [dict(o) for o in ops]
    ops[0]["backend"] = backend
    return MixedDecode(ops, "uint8", "NHWC", device)


def _payloads(paths: list[Path]) -> list[Any]:
    import torch

    return [torch.frombuffer(bytearray(p.read_bytes()), dtype=torch.uint8) for p in paths]


@NEEDS_NVIMGCODEC
def test_the_backends_draw_the_same_windows_and_nvimgcodec_decodes_only_them(jpegs: list[Path]) -> None:
    """Each sample's box (window, size, flip) is the same from both backends for every (epoch, id); nvImageCodec's
    decoded region is the window itself for a random crop (the sidecar crops, then resizes), and for a resize +
    center crop the window and the pixels next to it that resampling the whole image reads."""
    paths = jpegs
    payloads, ids, keys = _payloads(paths), list(range(len(paths))), [p.name for p in paths]
    for ops in (TRAIN.ops, (prep.decode(device="mixed"), *EVAL)):
        nv = _mixed("nvimgcodec", ops)
        for epoch in (0, 1):
            images, rois, boxes = nv._roi.windows(payloads, ids, keys, lambda s, nv=nv, epoch=epoch: nv.boxes(s, ids, epoch, 7))
            whole = [_decoded_size(p) for p in payloads]
            assert boxes == _mixed("torchvision", ops).boxes(whole, ids, epoch, 7)
            for im, (x0, y0, x1, y1), b, (h, w) in zip(images, rois, boxes, whole):
                if ops is TRAIN.ops:
                    assert (x0, y0, x1 - x0, y1 - y0) == (0, 0, b.w, b.h) and tuple(im.shape) == (b.h, b.w, 3)
                else:
                    assert 0 <= x0 <= 1.5 and 0 <= y0 <= 1.5, (x0, y0)
                    assert x1 <= im.shape[1] and y1 <= im.shape[0] and im.shape[0] * im.shape[1] < h * w


def _decoded_size(payload: Any) -> tuple[int, int]:
    from torchvision.io import decode_jpeg

    im = decode_jpeg(payload)
    return int(im.shape[1]), int(im.shape[2])


@NEEDS_NVIMGCODEC
def test_a_resize_and_center_crop_is_torchvisions_pixels_bit_for_bit(jpegs: list[Path]) -> None:
    """On the CPU both backends decode with libjpeg-turbo; the region nvImageCodec decodes holds every pixel the
    resampling reads, so the two give the same bytes (4:2:0, 4:4:4 and grayscale JPEGs, out as RGB)."""
    paths = jpegs
    payloads, ids = _payloads(paths), list(range(len(paths)))
    ops = (prep.decode(device="mixed"), *EVAL)
    a = _mixed("nvimgcodec", ops)(payloads, ids, 0, 7).numpy()
    b = _mixed("torchvision", ops)(payloads, ids, 0, 7).numpy()
    assert a.shape == (len(paths), 48, 48, 3)
    np.testing.assert_array_equal(a, b)


@NEEDS_NVIMGCODEC
def test_roi_false_decodes_whole_images_and_gives_torchvisions_pixels(jpegs: list[Path]) -> None:
    """``decode(roi=False)``: nvImageCodec decodes whole images and resamples each window from them, as the
    torchvision backend does; on the CPU (libjpeg-turbo in both) the same bytes. The option is part of the share
    scope and kept from the sidecar."""
    payloads, ids, keys = _payloads(jpegs), list(range(len(jpegs))), [p.name for p in jpegs]
    ops = [dict(o) for o in TRAIN.ops]
    ops[0]["roi"] = False
    whole = _mixed("nvimgcodec", ops)
    images, rois, boxes = whole._roi.windows(payloads, ids, keys, lambda s: whole.boxes(s, ids, 0, 7))
    for im, (x0, y0, x1, y1), b, p in zip(images, rois, boxes, payloads):
        assert tuple(im.shape[:2]) == _decoded_size(p) and (x0, y0, x1 - x0, y1 - y0) == (b.left, b.top, b.w, b.h)
    np.testing.assert_array_equal(whole(payloads, ids, 0, 7).numpy(),
                                  _mixed("torchvision", TRAIN.ops)(payloads, ids, 0, 7).numpy())
    assert share_scope("group", 7, whole.ops) != share_scope("group", 7, _mixed("nvimgcodec").ops)
    ops[0]["cpu_load"] = 0.5
    sidecar = MixedDecode(ops, "uint8", "NHWC", "cpu").sidecar_pipeline()
    assert sidecar is not None and sidecar["ops"][0] == {"op": "decode"}
    assert prep.decode(device="mixed", roi=False) == {"op": "decode", "device": "mixed", "roi": False}
    with pytest.raises(ValueError, match="roi \\(True or False\\) picks .* got roi='no'"):
        prep.decode(device="mixed", roi="no")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="got roi=False for a decode on 'cpu'"):
        prep.decode(roi=False)


@NEEDS_NVIMGCODEC
def test_cmyk_and_grayscale_jpegs_come_out_rgb_as_torchvision_decodes_them(tmp_path: Path) -> None:
    import torch
    from PIL import Image

    rng = np.random.default_rng(4)
    px = rng.integers(0, 255, (90, 120, 3), dtype=np.uint8)
    blobs = []
    for mode in ("CMYK", "L", "RGB"):
        buf = io.BytesIO()
        Image.fromarray(px).convert(mode).save(buf, "JPEG", quality=90)
        blobs.append(torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8))
    ops = (prep.decode(device="mixed"), *EVAL)
    a = _mixed("nvimgcodec", ops)(blobs, [0, 1, 2], 0, 7).numpy()
    np.testing.assert_array_equal(a, _mixed("torchvision", ops)(blobs, [0, 1, 2], 0, 7).numpy())
    assert a.shape == (3, 48, 48, 3) and (a[1, ..., 0] == a[1, ..., 1]).all()  # grayscale: R = G = B


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    "cuda" not in _devices(), reason="needs a CUDA GPU (nvJPEG through nvImageCodec)"))])
@NEEDS_NVIMGCODEC
def test_nvimgcodec_serves_the_cpu_paths_samples_as_torchvision_does(mixed_env: tuple[PrepEnv, list[Path]],
                                                                     device: str) -> None:
    """Through a real sidecar, 2 epochs: the same ids and labels in the same order from the CPU path and both
    backends, each backend within the pixel bound of the CPU path (benchmarks/probe_mixed_pixels.py measures how
    far)."""
    e, _ = mixed_env
    cpu = _epochs(e, prep.imagenet_train(48, dtype="uint8", layout="NHWC"))
    got = {b: _epochs(e, prep.imagenet_train(48, dtype="uint8", layout="NHWC", decode_device="mixed",
                                             decode_backend=b), device) for b in ("torchvision", "nvimgcodec")}
    for mixed in got.values():
        _compare(cpu, mixed)
    assert [[(i, label) for i, _, label in ep] for ep in got["nvimgcodec"]] == \
        [[(i, label) for i, _, label in ep] for ep in got["torchvision"]]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    "cuda" not in _devices(), reason="needs a CUDA GPU (nvJPEG's hardware engine and CUDA decoder)"))])
@NEEDS_NVIMGCODEC
def test_hw_decoder_load_splits_the_jpegs_and_keeps_the_cpu_paths_samples(mixed_env: tuple[PrepEnv, list[Path]],
                                                                          device: str) -> None:
    """``hw_decoder_load=0.5`` (DALI's option): on CUDA half of each batch's JPEGs to the hardware engine where the
    GPU has one, the rest to CUDA kernels; every sample still within the pixel bound of the CPU path, in its
    order. On the CPU the one CPU decoder takes every JPEG."""
    e, _ = mixed_env
    cpu = _epochs(e, prep.imagenet_train(48, dtype="uint8", layout="NHWC"))
    pipe = prep.Pipeline((prep.decode(device="mixed", backend="nvimgcodec", hw_decoder_load=0.5),
                          prep.random_resized_crop(48), prep.hflip()), layout="NHWC", dtype="uint8")
    _compare(cpu, _epochs(e, pipe, device))


def test_hw_decoder_load_is_checked_and_named() -> None:
    assert prep.decode(device="mixed", hw_decoder_load=1) == {"op": "decode", "device": "mixed",
                                                              "hw_decoder_load": 1.0}
    for bad, on in ((1.5, "mixed"), (-0.1, "mixed"), (True, "mixed"), ("0.5", "mixed"), (0.5, None)):
        with pytest.raises(ValueError, match=rf"hw_decoder_load \(a number in \[0, 1\]\).*got "
                                             rf"hw_decoder_load={bad!r} for a decode on '{on or 'cpu'}'"):
            prep.decode(device=on, hw_decoder_load=bad)  # type: ignore[arg-type]
    ops = [dict(o) for o in TRAIN.ops]
    ops[0].update(backend="torchvision", hw_decoder_load=0.5)
    with pytest.raises(ValueError, match="hw_decoder_load applies to nvImageCodec's decoder only"):
        MixedDecode(ops, "uint8", "NHWC", "cpu")


@pytest.mark.parametrize("backend", BACKENDS)
def test_pngs_are_decoded_on_the_host_beside_the_device_jpegs(mixed_env: tuple[PrepEnv, list[Path]],
                                                              backend: str) -> None:
    """A dataset of JPEGs and PNGs (one PNG named .jpg, as ImageNet has): the PNGs are decoded on the host and
    resampled on the device with the JPEGs, every sample served with the CPU path's ids and labels and within the
    pixel bound of its pixels (a PNG's decode is lossless: only the resampling differs)."""
    from PIL import Image

    e, paths = mixed_env
    root = e.tmp / f"jpegs-pngs-{backend}"
    for k, p in enumerate(paths):
        target = root / p.relative_to(p.parents[1])
        target.parent.mkdir(parents=True, exist_ok=True)
        if k % 3:
            target.write_bytes(p.read_bytes())
        else:  # a PNG; the first keeps its .jpg name
            Image.open(p).convert("RGB").save(target if k == 0 else target.with_suffix(".png"), "PNG")
    e.sidecar.register_dataset(root.name, root)
    cpu = _epochs(e, prep.imagenet_train(48, dtype="uint8", layout="NHWC"), dataset=root.name)
    mixed = _epochs(e, prep.imagenet_train(48, dtype="uint8", layout="NHWC", decode_device="mixed",
                                           decode_backend=backend), "cpu", dataset=root.name)
    assert sorted(i for i, _, _ in mixed[0]) == list(range(len(paths)))
    _compare(cpu, mixed)


def test_image_headers_are_read_as_pil_reads_the_sizes() -> None:
    """JPEG (a frame header after an EXIF segment too), PNG, lossy and lossless WebP: the size from the header
    alone; a cut header gives sizes 0, something else no format."""
    from PIL import Image

    from unstall.prep.mixed_parts import image_header

    px = np.zeros((37, 91, 3), dtype=np.uint8)
    cases = []
    for fmt, kw in (("JPEG", {}), ("JPEG", {"exif": Image.Exif()}), ("PNG", {}), ("WEBP", {}),
                    ("WEBP", {"lossless": True})):
        buf = io.BytesIO()
        image = Image.fromarray(px)
        if "exif" in kw:
            kw["exif"][0x010F] = "x" * 3000  # a large APP1 before the frame header
        image.save(buf, fmt, **kw)
        cases.append(buf.getvalue())
    for data, kind in zip(cases, ("jpeg", "jpeg", "png", "webp", "webp")):
        assert image_header(data) == (kind, 91, 37)
    assert image_header(cases[0][:8]) == ("jpeg", 0, 0) and image_header(b"BM not an image") == (None, 0, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_decode_caps_refuse_a_bomb_before_any_decoder_allocates(backend: str) -> None:
    """As the sidecar's hardened decode: a JPEG whose header declares more than ``max_pixels`` pixels, or an image
    wider than ``max_aspect_ratio`` times its height, fails its batch with an error naming the sample and the cap."""
    import torch
    from PIL import Image

    from unstall.prep.mixed_parts import image_header

    small, wide = io.BytesIO(), io.BytesIO()
    Image.fromarray(np.zeros((16, 16, 3), dtype=np.uint8)).save(small, "JPEG")
    Image.fromarray(np.zeros((2, 300, 3), dtype=np.uint8)).save(wide, "PNG")
    bomb = bytearray(small.getvalue())
    sof = next(i for i in range(2, len(bomb) - 1) if bomb[i] == 0xFF and bomb[i + 1] == 0xC0)
    bomb[sof + 5:sof + 9] = (20000).to_bytes(2, "big") * 2  # 20000x20000 declared, 400 MP
    assert image_header(bytes(bomb)) == ("jpeg", 20000, 20000)
    m = _mixed(backend)
    ok = torch.frombuffer(bytearray(small.getvalue()), dtype=torch.uint8)
    for key, data, why in (("bomb.jpg", bomb, "decompression bomb\\? the jpeg header declares 20000x20000 pixels "
                                               "\\(400000000\\), above the cap of 89478485 "
                                               "\\(--max-decode-pixels / decode max_pixels\\)"),
                           ("wide.png", wide.getvalue(), "the png header declares 300x2 pixels, an aspect ratio of "
                                                         "150.0, above the cap of 100 "
                                                         "\\(--max-decode-aspect-ratio / decode max_aspect_ratio\\)")):
        with pytest.raises(ValueError, match=rf"sample 11 \({key}\): {why}"):
            m([ok, torch.frombuffer(bytearray(data), dtype=torch.uint8)], [10, 11], 0, 7, ["ok.jpg", key])


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_sidecars_caps_apply_where_the_decode_op_sets_none(backend: str) -> None:
    """The caps the sidecar's join answer carries (``decode_limits``: its ``--max-decode-pixels`` and
    ``--max-decode-aspect-ratio``) refuse what the sidecar's CPU path refuses; the op's own caps take precedence, and
    without the sidecar's (an older sidecar) its defaults apply."""
    import torch
    from PIL import Image

    square, wide = io.BytesIO(), io.BytesIO()
    Image.fromarray(np.zeros((16, 16, 3), dtype=np.uint8)).save(square, "JPEG")
    Image.fromarray(np.zeros((16, 30, 3), dtype=np.uint8)).save(wide, "PNG")
    blobs = [torch.frombuffer(bytearray(b.getvalue()), dtype=torch.uint8) for b in (square, wide)]
    m = _mixed(backend)
    m.set_limits({"max_pixels": 200, "max_aspect_ratio": 2.0})
    with pytest.raises(ValueError, match=r"sample 4 \(a\.jpg\): decompression bomb\? the jpeg header declares 16x16 "
                                         r"pixels \(256\), above the cap of 200 \(--max-decode-pixels / decode max_pixels\)"):
        m(blobs, [4, 5], 0, 7, ["a.jpg", "b.png"])
    m.set_limits({"max_pixels": 1000, "max_aspect_ratio": 1.5})
    with pytest.raises(ValueError, match=r"sample 5 \(b\.png\): the png header declares 30x16 pixels, an aspect ratio "
                                         r"of 1\.9, above the cap of 1\.5 \(--max-decode-aspect-ratio / decode "
                                         r"max_aspect_ratio\)"):
        m(blobs, [4, 5], 0, 7, ["a.jpg", "b.png"])
    m.set_limits(None)
    assert tuple(m(blobs, [4, 5], 0, 7, ["a.jpg", "b.png"]).shape) == (2, 48, 48, 3)
    ops = [dict(o) for o in TRAIN.ops]
    ops[0].update(max_pixels=1000, max_aspect_ratio=2.0)
    own = _mixed(backend, ops)
    own.set_limits({"max_pixels": 200, "max_aspect_ratio": 1.5})
    assert tuple(own(blobs, [4, 5], 0, 7, ["a.jpg", "b.png"]).shape) == (2, 48, 48, 3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sample_that_does_not_decode_is_named(tmp_path: Path, backend: str) -> None:
    import torch

    good = io.BytesIO()
    from PIL import Image

    Image.fromarray(np.zeros((40, 60, 3), dtype=np.uint8)).save(good, "JPEG")
    webp, bmp = io.BytesIO(), io.BytesIO()
    Image.fromarray(np.zeros((40, 60, 3), dtype=np.uint8)).save(webp, "WEBP")
    Image.fromarray(np.zeros((40, 60, 3), dtype=np.uint8)).save(bmp, "BMP")
    cases = {"junk.jpg": (b"\xff\xd8\xff\xe0 not a jpeg at all", ": truncated JPEG: the 0xFFE0 segment at byte 2 needs "
                          "8302 bytes, the file ends at byte 22"),  # the sidecar's structure rules, its words
             "cut.jpg": (good.getvalue()[:200], ": truncated JPEG: "),
             "image.webp": (webp.getvalue(), ": a WebP file \\(first bytes 52 49 46 46 .*\\), not one of the formats the "
                                             "pipeline decodes: jpeg, png \\(decode \"formats\"\\)"),
             "image.bmp": (bmp.getvalue(), ": a BMP file \\(first bytes 42 4d .*\\), not one of the formats the pipeline "
                                           "decodes: jpeg, png"),
             "notes.jpg": (b"hello, not an image", ": not an image: no image format starts with the bytes 68 65 6c 6c 6f 2c "
                                                   "20 6e \\(19 bytes in all\\)"),
             "empty.jpg": (b"", ": an empty file \\(0 bytes\\)")}  # the sidecar's words (ImageHeaderTest)
    m = _mixed(backend)
    for key, (data, why) in cases.items():
        blobs = [torch.frombuffer(bytearray(good.getvalue()), dtype=torch.uint8),
                 torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)]
        with pytest.raises(ValueError, match=rf"sample 11 \({key}\){why}"):
            m(blobs, [10, 11], 0, 7, ["ok.jpg", key])


def test_the_backend_option_is_checked_and_named() -> None:
    with pytest.raises(ValueError, match=r"decode backend must be one of \('auto', 'nvimgcodec', 'torchvision'\).*"
                                         "'nvjpeg'"):
        prep.decode(device="mixed", backend="nvjpeg")
    with pytest.raises(ValueError, match="backend picks the device's decoder of a decode\\(device='mixed'\\)"):
        prep.decode(backend="torchvision")
    with pytest.raises(ValueError, match="decode backend must be one of"):
        MixedDecode([{"op": "decode", "device": "mixed", "backend": "dali"}], "uint8", "NHWC", "cpu")
    assert prep.decode(device="mixed", backend="torchvision") == {"op": "decode", "device": "mixed",
                                                                  "backend": "torchvision"}
    assert resolve_backend("torchvision") == "torchvision"
    # on CUDA "auto" is torchvision's batched nvJPEG, nvImageCodec where named (docs/PREP.md "The decode backend")
    assert resolve_backend("auto", "cuda") == resolve_backend("torchvision", "cuda") == "torchvision"
    if not NEEDS_NVIMGCODEC.args[0]:  # unless the op sets nvImageCodec's own options (hw_decoder_load, roi)
        assert resolve_backend("auto", "cuda", nvimgcodec_options=True) == "nvimgcodec"


def test_without_nvimgcodec_auto_is_torchvision_and_nvimgcodec_says_what_to_install() -> None:
    """In a process where ``nvidia.nvimgcodec`` cannot be imported (as on a machine without it)."""
    code = ("import sys; sys.modules['nvidia.nvimgcodec'] = None\n"
            "from unstall.prep.mixed import resolve_backend\n"
            "print(resolve_backend('auto'))\n"
            "try:\n    resolve_backend('nvimgcodec')\nexcept ImportError as e:\n    print(e)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(REPO / "python-shim" / "src"), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    auto, error = run.stdout.splitlines()[:2]
    assert auto == "torchvision"
    assert "needs NVIDIA nvImageCodec: pip install nvidia-nvimgcodec-cu13 nvidia-nvjpeg" in error
    assert "nvidia-nvimgcodec-cu12 nvidia-nvjpeg-cu12" in error


@NEEDS_NVIMGCODEC
def test_a_decoder_that_does_not_start_is_torchvisions_turn_under_auto_and_an_error_when_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """nvImageCodec imports but its decoder does not start (a driver older than the wheel's CUDA, say): ``"auto"``
    warns once, naming why, and decodes with torchvision (and says so in its ops, for the share scope); a job that
    named ``"nvimgcodec"`` fails, naming the device and the error."""
    from unstall.prep import nvimgcodec_decode

    def refuse(self: Any, device: Any, ops: Any) -> None:
        raise RuntimeError("CUDA Runtime failure: '#35'")

    monkeypatch.setattr(nvimgcodec_decode.RoiDecode, "__init__", refuse)
    with pytest.warns(RuntimeWarning, match="nvImageCodec's decoder does not start on cpu .*#35.*torchvision's "
                                            "decodes instead"):
        auto = _mixed("auto")
    assert auto.backend == auto.ops[0]["backend"] == "torchvision"
    with pytest.raises(RuntimeError, match=r"backend='nvimgcodec'\): nvImageCodec's decoder does not start on cpu: "
                                           "CUDA Runtime failure"):
        _mixed("nvimgcodec")


@NEEDS_NVIMGCODEC
def test_auto_is_resolved_before_the_share_scope_and_kept_from_the_sidecar() -> None:
    """Members whose backends differ never hand each other a batch: the resolved backend is in the ops the scope
    digests. A hybrid group's sidecar gets the decode op without it and the other device-only keys (the sidecar's
    parser knows no such fields)."""
    auto, tv = _mixed("auto"), _mixed("torchvision")
    assert auto.backend == auto.ops[0]["backend"] == "nvimgcodec" and tv.ops[0]["backend"] == "torchvision"
    assert share_scope("group", 7, auto.ops) == share_scope("group", 7, _mixed("nvimgcodec").ops)
    assert share_scope("group", 7, auto.ops) != share_scope("group", 7, tv.ops)
    hybrid = [dict(o) for o in TRAIN.ops]
    hybrid[0].update(cpu_load=0.5, backend="nvimgcodec", roi=False, hw_decoder_load=0.5)
    sidecar = MixedDecode(hybrid, "uint8", "NHWC", "cpu").sidecar_pipeline()
    assert sidecar is not None and sidecar["ops"][0] == {"op": "decode"}


@NEEDS_NVIMGCODEC
def test_a_hybrid_group_with_the_nvimgcodec_backend_runs(mixed_env: tuple[PrepEnv, list[Path]]) -> None:
    """The sidecar accepts the hybrid group's pipeline (the backend kept from it) and serves every sample."""
    e, paths = mixed_env
    pipe = prep.Pipeline((prep.decode(device="mixed", cpu_load=0.5, backend="nvimgcodec"),
                          prep.random_resized_crop(48), prep.hflip()), layout="NHWC", dtype="uint8")
    cpu = _epochs(e, prep.imagenet_train(48, dtype="uint8", layout="NHWC"), epochs=1)
    hybrid = _epochs(e, pipe, "cpu", epochs=1)
    assert sorted(i for i, _, _ in hybrid[0]) == list(range(len(paths)))
    _compare(cpu, hybrid)


@NEEDS_NVIMGCODEC
def test_one_padded_stack_resamples_each_window_as_it_alone(jpegs: list[Path]) -> None:
    """What CUDA runs (the batch's windows in one stack padded to the largest, each with its edge copied once past
    it) gives the pixels the CPU's window-by-window resampling gives: samples at a window's edge read the edge."""
    import torch

    paths = jpegs
    payloads, ids, keys = _payloads(paths), list(range(len(paths))), [p.name for p in paths]
    m = _mixed("nvimgcodec")
    images, rois, boxes = m._roi.windows(payloads, ids, keys, lambda s: m.boxes(s, ids, 3, 7))
    assert len({tuple(im.shape) for im in images}) > 1  # windows of different sizes in one stack
    stacked = m._resample(m._roi.stack(images), rois, 48, 48)
    alone = torch.cat([m._resample(im.permute(2, 0, 1)[None], [roi], 48, 48) for im, roi in zip(images, rois)])
    torch.testing.assert_close(stacked, alone, rtol=0, atol=0)
    grouped = torch.empty_like(alone)
    groups = m._roi.stacked(images, rois)  # what CUDA runs: stacks of windows of like sizes
    assert sorted(k for _, _, members in groups for k in members) == ids
    for stack, group_rois, members in groups:
        grouped[members] = m._resample(stack, group_rois, 48, 48)
    torch.testing.assert_close(grouped, alone, rtol=0, atol=0)


def test_stacks_of_like_windows_bound_their_padding_and_hold_every_window_once() -> None:
    """One large photo's window in a batch of small ones would pad a single stack to it for every window (a device
    memory blow-up): the groups keep each stack within STACK_SLACK times its windows' pixels, every window in one."""
    import random

    from unstall.prep.nvimgcodec_decode import STACK_SLACK, stack_groups

    rnd = random.Random(0)
    small = [(rnd.randint(60, 375), rnd.randint(60, 500)) for _ in range(255)]
    for shapes in (small + [(3000, 4000)], small, [(224, 224)] * 64, [(5, 900), (900, 5)], [(1, 1)]):
        groups = stack_groups(shapes)
        assert sorted(k for g in groups for k in g) == list(range(len(shapes)))
        for g in groups:
            padded = (max(shapes[k][0] for k in g) + 1) * (max(shapes[k][1] for k in g) + 1) * len(g)
            assert padded <= STACK_SLACK * sum((shapes[k][0] + 1) * (shapes[k][1] + 1) for k in g)
    assert len(stack_groups([(224, 224)] * 64)) == 1  # windows of one size: one stack, no padding
    assert [len(g) for g in stack_groups(small + [(3000, 4000)])][0] == 1  # the large one stacks alone
    assert len(stack_groups(small)) < len(small) // 8  # still few resampling calls, for sizes drawn independently
    with pytest.raises(ValueError, match="slack must be at least 1"):
        stack_groups(small, slack=0.5)


@NEEDS_NVIMGCODEC
def test_two_threads_decoding_with_one_decoder_get_the_pixels_of_one_thread_alone(jpegs: list[Path]) -> None:
    """Two threads decoding at once with one loader's nvImageCodec decoder, whose concurrent calls break it (a
    thread's batch "could not decode", the other's call never returns): the calls are taken one at a time, and each
    thread's batches are the pixels a decoder of its own gives."""
    import threading

    import torch

    payloads, keys = _payloads(jpegs), [p.name for p in jpegs]
    n = len(payloads)
    m = _mixed("nvimgcodec")
    batches = [(list(range(n)), 0), (list(range(n // 2)), 1), (list(range(n)), 2), (list(range(1, n)), 0)]

    def fresh(ids: list[int], epoch: int) -> Any:
        return _mixed("nvimgcodec")([payloads[i] for i in ids], ids, epoch, 7, [keys[i] for i in ids])

    expected = [fresh(ids, epoch) for ids, epoch in batches]
    got: dict[int, list[Any]] = {0: [], 1: []}

    def run(t: int) -> None:
        for ids, epoch in (batches if t == 0 else batches[::-1]) * 3:
            got[t].append(m([payloads[i] for i in ids], ids, epoch, 7, [keys[i] for i in ids]))

    threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert [len(got[t]) for t in (0, 1)] == [3 * len(batches)] * 2
    for a, b in zip(got[0] + got[1], expected * 3 + expected[::-1] * 3):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_import_unstall_imports_neither_nvimgcodec_nor_torch() -> None:
    code = ("import sys, unstall, unstall.prep, unstall.prep.mixed\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision', 'nvidia')))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(REPO / "python-shim" / "src"), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0 and run.stdout.strip() == "[]", (run.stdout, run.stderr)


def test_the_hybrids_timing_covers_only_the_encoded_samples_work(jpegs: list[Path]) -> None:
    """``MixedDecode(..., timing=)``, what a hybrid member times for the sidecar's split: called once per batch with
    the count of encoded samples, around their decode, resampling and flips only, so that the per-batch work (the
    output, the prepared samples' copy, the normalization) is not counted to them and the device's seconds per sample
    do not grow as its share shrinks; the batch is the same as untimed. A batch the sidecar prepared whole is not
    timed."""
    import torch

    mixed = _mixed("torchvision")
    paths = jpegs[:6]
    payloads, ids = _payloads(paths), list(range(len(paths)))
    untimed = mixed(payloads, ids, 0, 3)
    prepared = [k % 3 == 0 for k in range(len(paths))]  # the sidecar's rows: its uint8 HWC pixels, here the device's
    rows = [untimed[k].contiguous().view(-1) if prepared[k] else payloads[k] for k in range(len(paths))]
    calls: list[int] = []

    def timing(n: int, work: Any) -> Any:
        calls.append(n)
        out, boxes = work()
        assert len(boxes) == n and out.shape[0] == len(paths), "the work is the encoded samples' only"
        return out, boxes

    timed = mixed(rows, ids, 0, 3, None, prepared, timing)
    assert calls == [len(paths) - sum(prepared)] and torch.equal(timed, untimed)
    calls.clear()
    assert torch.equal(mixed([untimed[k].contiguous().view(-1) for k in range(len(paths))], ids, 0, 3, None,
                             [True] * len(paths), timing), untimed) and calls == []
