"""Damaged PNGs on both sides of a hybrid batch: the sidecar's CPU path (a real sidecar, ``decode()``) and the device
path (``decode(device="mixed")``: the host decode of a PNG, both backends) refuse the same truncated and malformed
files with the sidecar's reason, naming the sample: its header rules (``ImageHeader.png``, ported in
``unstall.png_rules.png_check``) or its decoder's refusal (OpenCV's libpng; ``png_data_check`` on the device),
and decode the sound ones (gray, RGB, RGBA, palette, gray + alpha, 16-bit, several IDAT chunks, bytes after IEND) to
the same pixels within the bound of docs/PREP.md. The files are made here with PIL or by hand, then cut, patched or
rechunked."""

from __future__ import annotations

import io
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from test_prep_mixed import BACKENDS, DEVICES, MAX_MEAN_DIFF
from test_prep_mixed_damaged import (_picture, assert_decoded_alike, assert_refused_alike,
                                     assert_the_batch_fails_naming_the_sample, damaged_fixtures, device_verdict)
from test_prep_support import PrepEnv


NO_IEND = r"truncated PNG: no IEND chunk after the image data, \d+ bytes in all"
NO_IDAT = r"truncated PNG: the file ends at byte \d+ before any image data \(IDAT\)"

# Both sides refuse these, the device with the sidecar's words (ImageHeader.png, ported in unstall.png_rules).
REFUSED = {
    "cut_20": r"truncated PNG: 20 bytes, shorter than a PNG header \(33\)",
    "ihdr_14_bytes": "corrupt PNG: the first chunk is not a 13-byte IHDR",
    "zero_width": r"corrupt PNG: IHDR declares 0x96 pixels",
    "color_type_9": "corrupt PNG: IHDR declares color type 9",
    "cut_in_text": NO_IDAT, "no_idat": NO_IDAT,
    "cut_50": NO_IEND, "cut_90": NO_IEND, "cut_in_iend": NO_IEND, "no_iend": NO_IEND, "split_idat_cut_50": NO_IEND,
}
# The sidecar's decoder (OpenCV's libpng) refuses these; the device finds the same before its host decoder
# (unstall.png_rules.png_data_check), which would end the process on some of them.
REJECTED = r"the PNG decoder rejected it \(corrupt data\), \d+ bytes declaring 128x96 pixels"
REJECTED_BY_DECODER = ("cut_50_iend", "split_idat_cut_at_a_chunk_iend", "split_idat_one_dropped", "idat_flipped",
                       "idat_flipped_crc_made_right", "ihdr_crc", "ihdr_depth_3", "ihdr_interlace_2",
                       "filter_type_7")


def _png(image: Any, **kw: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG", **kw)
    return buf.getvalue()


def chunk(kind: bytes, data: bytes) -> bytes:
    """A PNG chunk: length, type, data, CRC."""
    return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")


def chunks(png: bytes) -> list[tuple[bytes, int, int]]:
    """``(type, start, end)`` of each chunk of a sound PNG."""
    out, i = [], 8
    while i < len(png):
        end = i + 12 + int.from_bytes(png[i:i + 4], "big")
        out.append((png[i + 4:i + 8], i, end))
        i = end
    return out


def split_idat(png: bytes, size: int) -> bytes:
    """``png`` with its image data in IDAT chunks of ``size`` bytes (the last shorter)."""
    parts = chunks(png)
    data = b"".join(png[s + 8:e - 4] for t, s, e in parts if t == b"IDAT")
    first = next(s for t, s, _ in parts if t == b"IDAT")
    idat = b"".join(chunk(b"IDAT", data[k:k + size]) for k in range(0, len(data), size))
    return png[:first] + idat + chunk(b"IEND", b"")


def raw_png(px: np.ndarray, color_type: int, depth: int = 16) -> bytes:
    """A PNG of ``px`` (H x W x C samples, big-endian when 16-bit), unfiltered, in one IDAT chunk."""
    h, w = px.shape[:2]
    rows = px.astype(">u2" if depth == 16 else "u1").reshape(h, -1).view(np.uint8)
    data = b"".join(b"\x00" + r.tobytes() for r in rows)
    ihdr = w.to_bytes(4, "big") + h.to_bytes(4, "big") + bytes([depth, color_type, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(data)) + chunk(b"IEND", b"")


def _patched(data: bytes, at: int, new: bytes) -> bytes:
    return data[:at] + new + data[at + len(new):]


def _with_ihdr(png: bytes, at: int, new: bytes) -> bytes:
    """``png`` with ``new`` at byte ``at`` of its IHDR chunk's data, the CRC made right."""
    ihdr = bytearray(png[12:29])
    ihdr[4 + at:4 + at + len(new)] = new
    return png[:8] + chunk(b"IHDR", bytes(ihdr[4:])) + png[33:]


def _idat_patched(png: bytes, k: int, at: int, crc: bool) -> bytes:
    """``png`` with byte ``at`` of its ``k``-th IDAT chunk's data flipped, its CRC made right when ``crc``."""
    start, end = [(s, e) for t, s, e in chunks(png) if t == b"IDAT"][k]
    data = bytearray(png[start + 8:end - 4])
    data[at] ^= 0xFF
    new = chunk(b"IDAT", bytes(data)) if crc else png[start:start + 8] + bytes(data) + png[end - 4:end]
    return png[:start] + new + png[end:]


def _cases() -> dict[str, bytes]:
    """Each damaged (or odd but sound) PNG by name, in the dataset's order."""
    from PIL import Image, PngImagePlugin

    px = _picture(96, 128)
    rgb = Image.fromarray(px)
    base = _png(rgb)
    n = len(base)
    info = PngImagePlugin.PngInfo()
    info.add_text("comment", "x" * 200)
    text = _png(rgb, pnginfo=info)
    split = split_idat(base, 4096)
    idats = [s for t, s, _ in chunks(split) if t == b"IDAT"]
    iend = chunk(b"IEND", b"")
    wide = px.astype(np.uint16) * 256 + np.random.default_rng(4).integers(0, 256, px.shape, dtype=np.uint16)
    alpha = np.random.default_rng(5).integers(0, 65536, px.shape[:2] + (1,), dtype=np.uint16)
    unfiltered = raw_png(px, 2, 8)
    return {
        "intact": base, "gray": _png(rgb.convert("L")), "rgba": _png(rgb.convert("RGBA")),
        "palette": _png(rgb.convert("P")), "gray_16": _png(Image.fromarray(wide[..., 0])),
        "rgb_16": raw_png(wide, 2), "rgba_16": raw_png(np.concatenate([wide, alpha], -1), 6),
        "gray_alpha": raw_png(np.concatenate([px[..., :1], alpha >> 8], -1), 4, 8),
        "text_before_idat": text, "split_idat": split, "bytes_after_iend": base + bytes(range(100)),
        "cut_20": base[:20], "ihdr_14_bytes": _patched(base, 8, (14).to_bytes(4, "big")),
        "zero_width": _patched(base, 16, bytes(4)), "color_type_9": _patched(base, 25, b"\x09"),
        "cut_in_text": text[:33 + 100], "no_idat": base[:33] + iend,
        "cut_50": base[:n // 2], "cut_90": base[:n * 9 // 10], "cut_in_iend": base[:n - 6], "no_iend": base[:n - 12],
        "split_idat_cut_50": split[:len(split) // 2],
        "cut_50_iend": base[:n // 2] + iend, "split_idat_cut_at_a_chunk_iend": split[:idats[len(idats) // 2]] + iend,
        "split_idat_one_dropped": split[:idats[2]] + split[idats[3]:],
        "idat_flipped": _idat_patched(base, 0, 1000, crc=False), "idat_flipped_crc_made_right":
            _idat_patched(split, 1, 100, crc=True), "ihdr_crc": _patched(base, 29, bytes(4)),
        "ihdr_depth_3": _with_ihdr(base, 8, b"\x03"), "ihdr_interlace_2": _with_ihdr(base, 12, b"\x02"),
        "filter_type_7": unfiltered[:33] + chunk(b"IDAT", zlib.compress(b"\x07" + zlib.decompress(
            unfiltered[41:-16])[1:])) + iend,
    }


CASES = _cases()
KEYS = [f"c0/{k:02d}_{name}.png" for k, name in enumerate(CASES)]  # the dataset's keys, by sample id


damaged, sidecar_side = damaged_fixtures("prep-damaged-png", CASES, KEYS)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("on", DEVICES)
def test_a_damaged_png_is_refused_by_both_sides_naming_it_or_decoded_alike(
        sidecar_side: tuple[dict[int, np.ndarray], dict[int, str]], backend: str, on: str) -> None:
    pixels, reasons = sidecar_side
    diffs = []
    for k, name in enumerate(CASES):
        device = device_verdict(backend, CASES, KEYS, k, on)
        refused = REFUSED.get(name) or (REJECTED if name in REJECTED_BY_DECODER else None)
        if refused is not None:
            assert_refused_alike(refused, reasons, device, k, KEYS, name)
        else:
            assert k in pixels and not isinstance(device, str), (name, reasons.get(k), device)
            diff = np.abs(pixels[k].astype(np.int16) - device.astype(np.int16))
            assert diff.mean() <= MAX_MEAN_DIFF, (name, float(diff.mean()))  # each alike: 16-bit samples too
            diffs.append(diff.ravel())
    assert_decoded_alike(diffs, 11)


@pytest.mark.parametrize("name", ["cut_90", "color_type_9", "idat_flipped"])
@pytest.mark.parametrize("cpu_load", [0, 1])
def test_through_a_sidecar_the_batch_fails_naming_the_sample_on_whichever_side_decodes_it(
        damaged: PrepEnv, tmp_path: Path, name: str, cpu_load: float) -> None:
    """A dataset of an intact PNG and a damaged one, in one batch: the device (``cpu_load=0``) or the sidecar's CPUs
    (``cpu_load=1``) decode it, and either way the batch fails with the damaged sample's id, key and the same
    reason; never fed."""
    assert_the_batch_fails_naming_the_sample(damaged, tmp_path / f"damaged-{name}-{cpu_load}", CASES["intact"],
                                             CASES[name], ".png", cpu_load, REFUSED.get(name) or REJECTED)
