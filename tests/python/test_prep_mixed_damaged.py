"""Damaged JPEGs on both sides of a hybrid batch: the sidecar's CPU path (a real sidecar, ``decode()``) and the device
path (``decode(device="mixed")``, both backends' CPU decoders) refuse the same truncated and malformed files with
the sidecar's reason, naming the sample, and decode the damage both tolerate to the same pixels within the bound
of docs/PREP.md; where they differ (damage only a Huffman decode finds), the difference docs/PREP.md states holds.
A Motion-JPEG frame (no DHT segment) decodes on both sides as the image with the standard Huffman tables written
out, whatever the sidecar's prep thread decoded before. The files are made here with PIL, then cut or patched."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from test_prep_mixed import BACKENDS, DEVICES, MAX_MEAN_DIFF, MAX_P99_DIFF
from test_prep_mixed_backends import _mixed
from test_prep_support import REPO, PrepEnv, start_env

from unstall import prep  # noqa: E402  (after test_prep_support put this checkout's shim first)

NO_EOI = r"truncated JPEG: no end-of-image marker \(FF D9\) after the scan data, \d+ bytes in all"
MARKER_CUTS = "libjpeg: truncated JPEG data (a marker cuts the entropy-coded data within the decoded rows)"

# Both sides refuse these, the device with the sidecar's words: its header rules (ImageHeader.jpeg, ported in
# unstall.prep.jpeg_rules) or libjpeg's error for a malformed table, a progressive scan's invalid parameters, a
# coding process it does not decode, a scan's misplaced component, a marker it reads no segment of or the frame's
# sampling factors; libjpeg's after the pixel and aspect-ratio caps.
REFUSED = {
    "cut_50": NO_EOI, "cut_90": NO_EOI, "cut_before_eoi": NO_EOI, "no_eoi": NO_EOI, "progressive_cut_50": NO_EOI,
    "cut_in_header": r"truncated JPEG: the 0xFF[0-9A-F]{2} segment at byte \d+ needs \d+ bytes, the file ends at "
                     r"byte 300",
    "no_dqt": "corrupt JPEG: the first scan's component 1 uses quantization table 0, which no DQT segment before it "
              "defines",
    "bad_dht": "libjpeg: Bogus Huffman table definition",
    "bad_dqt": "libjpeg: Bogus DQT index 7",
    "progressive_past_coefficient_63": r"libjpeg: Invalid progressive parameters Ss=1 Se=64 Ah=0 Al=\d+",
    "lossless": r"libjpeg: Unsupported JPEG process: SOF type 0xc3",
    "scan_components_2_1_3": "libjpeg: Invalid component ID 1 in SOS",
    "jpg0_marker": "libjpeg: Unsupported marker type 0xf0",
    "sampling_factor_0": "libjpeg: Bogus sampling factors",
    "sampling_too_large": "libjpeg: Sampling factors too large for interleaved scan",
    # a header over the caps with a defect libjpeg refuses: the caps first, as the sidecar's header check applies
    # them before its decoder reads the file
    "over_the_pixel_cap_past_coefficient_63": r"decompression bomb\? the jpeg header declares 20000x20000 pixels "
                                              r"\(400000000\), above the cap of 89478485 \(--max-decode-pixels / "
                                              r"decode max_pixels\)",
    "over_the_aspect_cap_sampling_factor_0": r"the jpeg header declares 12800x96 pixels, an aspect ratio of 133\.3, "
                                             r"above the cap of 100 \(--max-decode-aspect-ratio / decode "
                                             r"max_aspect_ratio\)",
}
# A marker inside a single scan's data, or too few restart intervals: both sides refuse them by a rule on the bytes
# (ImageHeader.jpeg's scan rule, unstall.prep.jpeg_rules on the device), whatever the crop and the cache form.
REFUSED_BY_RULE = {
    "marker_in_scan": r"corrupt JPEG: marker 0xFFC4 at byte \d+ cuts the scan data$",
    "rst_without_interval": r"corrupt JPEG: marker 0xFFD3 at byte \d+ cuts the scan data \(no restart interval is "
                            r"declared\)",
    "restart_cut_50_eoi": r"truncated JPEG: the scan data ends after 6 of its 12 restart intervals",
}
# Cut, then ended with an end-of-image marker: only a Huffman decode finds the missing data. The sidecar refuses
# them (libjpeg: within the rows it decodes, every row when it keeps the image in a cache form); the device's CPU
# decoders (libjpeg-turbo) decode the rows that are there and fill the rest with gray (docs/PREP.md).
DECODED_THROUGH = ("cut_50_eoi", "progressive_cut_50_eoi")
FIXTURES = REPO / "protocol" / "fixtures"


def _picture(h: int, w: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // w, y * 255 // h, (x + y) * 255 // (w + h)], -1)
    return np.clip(base + np.random.default_rng(3).integers(-20, 20, (h, w, 3)), 0, 255).astype(np.uint8)


def _jpeg(arr: np.ndarray, mode: str = "RGB", **kw: Any) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).convert(mode).save(buf, "JPEG", quality=90, **kw)
    return buf.getvalue()


def _segments(data: bytes) -> list[tuple[int, int, int]]:
    """``(marker, start, end)`` of each segment before the scan data, the scan header last."""
    out, i = [], 2
    while True:
        marker, end = data[i + 1], i + 2 + int.from_bytes(data[i + 2:i + 4], "big")
        out.append((marker, i, end))
        if marker == 0xDA:
            return out
        i = end


def _without(data: bytes, marker: int) -> bytes:
    segs = _segments(data)
    return data[:2] + b"".join(data[s:e] for m, s, e in segs if m != marker) + data[segs[-1][2]:]


def _patched(data: bytes, at: int, new: bytes) -> bytes:
    return data[:at] + new + data[at + len(new):]


def _scan_middle(data: bytes) -> int:
    """The middle of ``data``'s scan data (from the end of its scan header to the end of the file)."""
    scan = _segments(data)[-1][2]
    return scan + (len(data) - scan) // 2


def _scan_parameters(data: bytes, scan: int) -> int:
    """Where the ``scan``-th scan header's Ss, Se and Ah << 4 | Al bytes are (scan data holds no FF DA: its 0xFF is
    stuffed)."""
    at = [m.start() for m in re.finditer(b"\xff\xda", data)][scan]
    return at + 5 + 2 * data[at + 4]


def _cases() -> dict[str, bytes]:
    """Each damaged (or odd but sound) JPEG by name, in the dataset's order."""
    px = _picture(96, 128)
    base, prog, rst = _jpeg(px), _jpeg(px, progressive=True), _jpeg(px, restart_marker_blocks=4)
    n, mid = len(base), _scan_middle(base)
    noise = np.random.default_rng(1).integers(0, 255, 64, dtype=np.uint8).tobytes()  # no 0xFF: no marker
    dht = next(s for m, s, _ in _segments(base) if m == 0xC4)
    dqt = next(s for m, s, _ in _segments(base) if m == 0xDB)
    sof, ids = base.index(b"\xff\xc0"), _scan_parameters(base, 0) - 6  # the frame header; the scan's component ids
    return {
        "intact": base, "cut_50": base[:n // 2], "cut_90": base[:n * 9 // 10], "cut_before_eoi": base[:n - 10],
        "no_eoi": base[:n - 2], "cut_in_header": base[:300], "cut_50_eoi": base[:n // 2] + b"\xff\xd9",
        "trailing_garbage": base + bytes(range(200)), "garbage_in_scan": _patched(base, mid, noise),
        "marker_in_scan": _patched(base, mid, b"\xff\xc4"), "rst_without_interval": _patched(base, mid, b"\xff\xd3"),
        # a Motion-JPEG frame (PIL writes the standard Huffman tables: base without them), decoded right after an
        # image with other tables: the sidecar's one prep thread keeps its decoder's tables from image to image
        "optimized": _jpeg(px[::-1], optimize=True), "no_dht": _without(base, 0xC4), "no_dqt": _without(base, 0xDB),
        "bad_dht": _patched(base, dht + 5, bytes([255] * 16)), "bad_dqt": _patched(base, dqt + 4, b"\x07"),
        "progressive": prog, "progressive_cut_50": prog[:len(prog) // 2],
        # a later AC scan's Se past the 64 coefficients: libjpeg refuses it once it reaches that scan; a sequential
        # scan's Ss, Se, Ah and Al all 0, which libjpeg only warns on; a lossless frame header, which it does not decode
        "progressive_past_coefficient_63": _patched(prog, _scan_parameters(prog, 2), b"\x01\x40"),
        "sequential_zero_scan_parameters": _patched(base, _scan_parameters(base, 0), bytes(3)),
        "lossless": _patched(base, base.index(b"\xff\xc0") + 1, b"\xc3"),
        # the scan's components 2, 1, 3 (libjpeg takes the i-th from the frame's i-th on); a JPG0 marker before the
        # scan; the luma sampling factors 2x0, then 4x4 (18 blocks an MCU, above libjpeg's 10)
        "scan_components_2_1_3": _patched(base, ids, base[ids + 2:ids + 4] + base[ids:ids + 2]),
        "jpg0_marker": base[:_segments(base)[-1][1]] + b"\xff\xf0\x00\x02" + base[_segments(base)[-1][1]:],
        "sampling_factor_0": _patched(base, sof + 11, b"\x20"),
        "sampling_too_large": _patched(base, sof + 11, b"\x44"),
        "over_the_pixel_cap_past_coefficient_63": _patched(
            _patched(prog, _scan_parameters(prog, 2), b"\x01\x40"), prog.index(b"\xff\xc2") + 5,
            (20000).to_bytes(2, "big") * 2),
        "over_the_aspect_cap_sampling_factor_0": _patched(_patched(base, sof + 11, b"\x20"), sof + 7,
                                                          (12800).to_bytes(2, "big")),
        "progressive_cut_50_eoi": prog[:len(prog) // 2] + b"\xff\xd9",
        "restart": rst, "restart_cut_50_eoi": rst[:len(rst) // 2] + b"\xff\xd9",
        "restart_444": _jpeg(px, subsampling=0, restart_marker_rows=1),
        "restart_gray": _jpeg(px, "L", restart_marker_blocks=5),
        "one_pixel": _jpeg(np.full((1, 1, 3), 200, np.uint8)),
    }


CASES = _cases()
KEYS = [f"c0/{k:02d}_{name}.jpg" for k, name in enumerate(CASES)]  # the dataset's keys, by sample id
PIPELINE = prep.imagenet_train(48, dtype="uint8", layout="NHWC")


def serve_cases(tmp: Path, cases: dict[str, bytes], keys: list[str]) -> Iterator[PrepEnv]:
    """A sidecar (one prep thread) serving the dataset ``damaged``: ``cases``' bytes under ``keys``, sample id k the
    k-th."""
    for e in start_env(tmp, extra_args=("--prep-threads", "1")):
        for key, data in zip(keys, cases.values()):
            (tmp / "damaged" / key).parent.mkdir(parents=True, exist_ok=True)
            (tmp / "damaged" / key).write_bytes(data)
        e.sidecar.register_dataset("damaged", tmp / "damaged")
        yield e


def sidecar_verdicts(env: PrepEnv, keys: list[str]) -> tuple[dict[int, np.ndarray], dict[int, str]]:
    """The sidecar's CPU path over every case of ``damaged`` (``on_error="skip"``: one pass): its crop by sample id,
    and its reason by the id of each sample it refused."""
    pixels: dict[int, np.ndarray] = {}
    with env.client() as client, prep.PrepLoader("damaged", PIPELINE, batch_size=1, seed=7, shuffle=False, epochs=1,
                                                 client=client, with_ids=True, on_error="skip") as loader:
        for images, _, ids in loader:
            pixels[int(ids[0])] = images[0].numpy()
        skipped = list(loader.skipped)
    assert all(s["key"] == keys[s["id"]] for s in skipped), skipped
    return pixels, {int(s["id"]): str(s["reason"]) for s in skipped}


def damaged_fixtures(tmp_name: str, cases: dict[str, bytes], keys: list[str]) -> tuple[Any, Any]:
    """A module's fixtures ``damaged`` (``serve_cases`` of ``cases`` under ``keys``, in a temporary folder named
    ``tmp_name``) and ``sidecar_side`` (``sidecar_verdicts`` of it), both module-scoped: bind them to those names."""

    @pytest.fixture(scope="module")
    def damaged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrepEnv]:
        yield from serve_cases(tmp_path_factory.mktemp(tmp_name), cases, keys)

    @pytest.fixture(scope="module")
    def sidecar_side(damaged: PrepEnv) -> tuple[dict[int, np.ndarray], dict[int, str]]:
        return sidecar_verdicts(damaged, keys)

    return damaged, sidecar_side


def device_verdict(backend: str, cases: dict[str, bytes], keys: list[str], k: int, device: str = "cpu") -> Any:
    """The device path's crop of sample ``k`` of ``cases`` (``MixedDecode`` on ``device``, the group's seed and
    epoch 0), or its error's message."""
    import torch

    data = list(cases.values())[k]
    try:
        return _mixed(backend, device=device)([torch.frombuffer(bytearray(data), dtype=torch.uint8)], [k], 0, 7,
                                              [keys[k]]).cpu().numpy()[0]
    except ValueError as e:
        return str(e)


def assert_refused_alike(pattern: str, reasons: dict[int, str], device: Any, k: int, keys: list[str],
                         name: str) -> None:
    """The sidecar refused sample ``k`` with a reason matching ``pattern``, and the device path with the same reason,
    naming the sample."""
    assert re.fullmatch(pattern, reasons.get(k, "")), (name, reasons.get(k))
    assert device == f"decode(device='mixed'): sample {k} ({keys[k]}): " + reasons[k], name


def assert_decoded_alike(diffs: list[np.ndarray], n: int) -> None:
    """``n`` samples decoded on both sides, whose pixel differences (``diffs``) are within docs/PREP.md's bound."""
    d = np.concatenate(diffs)
    assert len(diffs) == n and d.mean() <= MAX_MEAN_DIFF and np.percentile(d, 99) <= MAX_P99_DIFF, \
        (float(d.mean()), float(np.percentile(d, 99)))


def assert_the_batch_fails_naming_the_sample(env: PrepEnv, root: Path, intact: bytes, broken: bytes, suffix: str,
                                             cpu_load: float, reason: str) -> None:
    """A dataset at ``root`` of an intact file and a damaged one (``c0/a<suffix>``, ``c0/b<suffix>``), in one batch:
    the device (``cpu_load=0``) or the sidecar's CPUs (``cpu_load=1``) decode it, and either way the batch fails with
    the damaged sample's id, key and ``reason`` (a pattern); never fed."""
    (root / "c0").mkdir(parents=True)
    (root / "c0" / f"a{suffix}").write_bytes(intact)
    (root / "c0" / f"b{suffix}").write_bytes(broken)
    env.sidecar.register_dataset(root.name, root)
    pipe = prep.Pipeline((prep.decode(device="mixed", cpu_load=cpu_load), prep.random_resized_crop(48), prep.hflip()),
                         layout="NHWC", dtype="uint8")
    key = re.escape(f"c0/b{suffix}")
    where = rf"decode\(device='mixed'\): sample 1 \({key}\): " if cpu_load == 0 else \
        rf"dataset '{root.name}' sample 1 \('{key}'\): "
    with env.client() as client, prep.PrepLoader(root.name, pipe, batch_size=2, shuffle=False, epochs=1,
                                                  device="cpu", client=client) as loader:
        with pytest.raises(ValueError, match=where + reason):
            list(loader)


damaged, sidecar_side = damaged_fixtures("prep-damaged", CASES, KEYS)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("on", DEVICES)
def test_a_damaged_jpeg_is_refused_by_both_sides_naming_it_or_decoded_alike(
        sidecar_side: tuple[dict[int, np.ndarray], dict[int, str]], backend: str, on: str) -> None:
    pixels, reasons = sidecar_side
    diffs = []
    for k, name in enumerate(CASES):
        device = device_verdict(backend, CASES, KEYS, k, on)
        refused = REFUSED.get(name) or REFUSED_BY_RULE.get(name)
        if refused is not None:
            assert_refused_alike(refused, reasons, device, k, KEYS, name)
            if "cuts the scan data" in refused:  # the byte named is the one patched
                assert f" at byte {_scan_middle(CASES['intact'])} " in reasons[k], (name, reasons[k])
        elif name in DECODED_THROUGH:
            assert reasons.get(k) == MARKER_CUTS, (name, reasons.get(k))
            assert not isinstance(device, str) and device.shape == (48, 48, 3), (name, device)
        else:
            assert k in pixels and not isinstance(device, str), (name, reasons.get(k), device)
            diffs.append(np.abs(pixels[k].astype(np.int16) - device.astype(np.int16)).ravel())
    assert_decoded_alike(diffs, 11)


@pytest.mark.parametrize("name", ["cut_90", "no_dqt", "bad_dht"])
@pytest.mark.parametrize("cpu_load", [0, 1])
def test_through_a_sidecar_the_batch_fails_naming_the_sample_on_whichever_side_decodes_it(
        damaged: PrepEnv, tmp_path: Path, name: str, cpu_load: float) -> None:
    """A dataset of an intact JPEG and a damaged one, in one batch: the device (``cpu_load=0``) or the sidecar's
    CPUs (``cpu_load=1``) decode it, and either way the batch fails with the damaged sample's id, key and the same
    reason; never fed."""
    assert_the_batch_fails_naming_the_sample(damaged, tmp_path / f"damaged-{name}-{cpu_load}", CASES["intact"],
                                             CASES[name], ".jpg", cpu_load, REFUSED[name])


def _center(pixels: np.ndarray) -> np.ndarray:
    """The central 96 x 96 of a 96 x 128 image: FRAME_OPS' crop."""
    return pixels[:, 16:112]


FRAME_OPS = (prep.center_crop(96),)


def test_the_sidecar_decodes_a_motion_jpeg_frame_as_its_standard_tables_written_out(damaged: PrepEnv,
                                                                                     tmp_path: Path) -> None:
    """On the sidecar's one prep thread, right after an image with other (optimized) Huffman tables, in every epoch
    (whichever cache form the frame is decoded from): the frame's pixels are the original's, bit for bit, and
    PIL's."""
    from PIL import Image

    root = tmp_path / "mjpeg"
    (root / "c0").mkdir(parents=True)
    for k, name in enumerate(("optimized", "no_dht", "intact")):
        (root / "c0" / f"{k}_{name}.jpg").write_bytes(CASES[name])
    damaged.sidecar.register_dataset(root.name, root)
    pipe = prep.Pipeline((prep.decode(), *FRAME_OPS), layout="NHWC", dtype="uint8")
    with damaged.client() as client, prep.PrepLoader(root.name, pipe, batch_size=1, shuffle=False, epochs=2,
                                                      client=client) as loader:
        images = [images[0].numpy().copy() for _ in range(2) for images, _ in loader]
    pil = _center(np.asarray(Image.open(io.BytesIO(CASES["intact"]))))
    assert len(images) == 6
    for epoch in range(2):
        frame, intact = images[3 * epoch + 1], images[3 * epoch + 2]
        assert np.array_equal(frame, intact) and np.array_equal(frame, pil), \
            (epoch, int(np.abs(frame.astype(np.int16) - pil).max()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_device_decodes_a_motion_jpeg_frame_from_the_sidecars_copy(backend: str) -> None:
    """``MixedDecode`` hands the decoder the bytes the sidecar decodes (the golden copy flight-server's
    StandardHuffmanTablesTest holds the sidecar to), and decodes the frame as the original."""
    import torch

    def tensor(data: bytes) -> Any:
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)

    mixed = _mixed(backend, (prep.decode(device="mixed"), prep.center_crop(16)))
    kind, size, data = mixed._check(tensor((FIXTURES / "mjpeg-frame-v1.jpg").read_bytes()), 0, "c0/frame.jpg")
    assert (kind, size) == ("jpeg", (24, 32))
    assert bytes(data.numpy()) == (FIXTURES / "mjpeg-frame-v1-standard-tables.jpg").read_bytes()
    mixed = _mixed(backend, (prep.decode(device="mixed"), prep.center_crop(64)))
    frame_px, intact_px = (mixed([tensor(CASES[name])], [2], 0, 7, [name]).numpy()[0] for name in ("no_dht", "intact"))
    assert np.array_equal(frame_px, intact_px)
