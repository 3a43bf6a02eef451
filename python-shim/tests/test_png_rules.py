"""``unstall.png_rules`` on PNGs made here (PIL's, and hand-made: 16-bit, Adam7-interlaced; 1-bit from PIL):
``png_check`` has the sidecar's structure rules (``ImageHeader.png``) and words, in its order, for files cut at any
offset, a malformed IHDR, no image data or no IEND; ``png_data_check`` passes every sound file (PIL decodes each to
its pixels) and refuses in the sidecar's decoder's words what libpng refuses in the chunks and the image data.
tests/python/test_png_verdicts.py holds both to a real sidecar."""

from __future__ import annotations

import io
import zlib

import numpy as np
import pytest
from PIL import Image

from unstall.prep.mixed_parts import image_header
from unstall.png_rules import png_check, png_data_check

SIGNATURE = b"\x89PNG\r\n\x1a\n"
NO_IEND = "truncated PNG: no IEND chunk after the image data, {} bytes in all"
NO_IDAT = "truncated PNG: the file ends at byte {} before any image data (IDAT)"
REJECTED = "the PNG decoder rejected it (corrupt data), {} bytes declaring {}x{} pixels"
ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def chunk(kind: bytes, data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")


def ihdr(w: int, h: int, depth: int = 8, color_type: int = 2, interlace: int = 0) -> bytes:
    return chunk(b"IHDR", w.to_bytes(4, "big") + h.to_bytes(4, "big") + bytes([depth, color_type, 0, 0, interlace]))


def made(px: np.ndarray, color_type: int, interlace: bool = False, plte: bytes = b"") -> bytes:
    """A PNG of ``px`` (H x W x C samples; uint16: 16-bit), unfiltered, Adam7-interlaced when ``interlace``."""
    depth = 16 if px.dtype == np.uint16 else 8
    h, w = px.shape[:2]
    data = b""
    for x0, y0, dx, dy in ADAM7 if interlace else ((0, 0, 1, 1),):
        sub = px[y0::dy, x0::dx]
        if sub.size:  # an empty pass has no rows
            rows = sub.astype(">u2" if depth == 16 else "u1").reshape(sub.shape[0], -1).view(np.uint8)
            data += b"".join(b"\x00" + r.tobytes() for r in rows)
    return SIGNATURE + ihdr(w, h, depth, color_type, int(interlace)) + (chunk(b"PLTE", plte) if plte else b"") + \
        chunk(b"IDAT", zlib.compress(data)) + chunk(b"IEND", b"")


def pil(image: Image.Image, **kw: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG", **kw)
    return buf.getvalue()


def chunks(png: bytes) -> list[tuple[bytes, int, int]]:
    """``(type, start, end)`` of each chunk of a sound PNG."""
    out, i = [], 8
    while i < len(png):
        end = i + 12 + int.from_bytes(png[i:i + 4], "big")
        out.append((png[i + 4:i + 8], i, end))
        i = end
    return out


PX = np.random.default_rng(6).integers(0, 256, (21, 19, 4), dtype=np.uint8)
WIDE = PX.astype(np.uint16) * 256 + np.random.default_rng(7).integers(0, 256, PX.shape, dtype=np.uint16)


def sound() -> dict[str, tuple[bytes, np.ndarray]]:
    """Sound PNGs and the pixels PIL should decode from them."""
    rgb = Image.fromarray(PX[..., :3])
    p256 = rgb.convert("P")
    return {
        "gray": (pil(rgb.convert("L")), np.asarray(rgb.convert("L"))), "rgb": (pil(rgb), PX[..., :3]),
        "rgba": (pil(Image.fromarray(PX)), PX), "palette": (pil(p256), np.asarray(p256.convert("RGB"))),
        "bilevel": (pil(rgb.convert("1")), np.asarray(rgb.convert("1"))),
        "gray_16": (pil(Image.fromarray(WIDE[..., 0])), WIDE[..., 0]),
        "rgb_16": (made(WIDE[..., :3], 2), WIDE[..., :3] >> 8), "rgba_16": (made(WIDE, 6), WIDE >> 8),
        "gray_alpha": (made(PX[..., :2], 4), PX[..., :2]), "interlaced": (made(PX[..., :3], 2, True), PX[..., :3]),
        "interlaced_1x1": (made(PX[:1, :1, :3], 2, True), PX[:1, :1, :3]),
        "interlaced_16": (made(WIDE[..., :3], 2, True), WIDE[..., :3] >> 8),
        "text_before_idat": (pil(rgb, pnginfo=_text()), PX[..., :3]),
    }


def _text() -> object:
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("comment", "x" * 50)
    return info


SOUND = sound()


@pytest.mark.parametrize("name", list(SOUND))
def test_sound_pngs_pass_both_checks(name: str) -> None:
    data, pixels = SOUND[name]
    image = Image.open(io.BytesIO(data))
    decoded = np.asarray(image.convert("RGB") if image.mode == "P" else image)  # a palette's order is PIL's
    if decoded.dtype != pixels.dtype:  # PIL decodes 16-bit color to 8 bits, as the sidecar does
        decoded, pixels = decoded.astype(np.uint16), pixels.astype(np.uint16)
    assert np.array_equal(decoded, pixels), name  # the file is what it says
    assert png_check(data) is None and png_data_check(data) is None, name
    assert png_check(data + bytes(range(50))) is None and png_data_check(data + bytes(range(50))) is None


def test_a_cut_file_is_refused_with_the_sidecars_words_for_where_it_ends() -> None:
    data = SOUND["text_before_idat"][0]
    idat = next(s for t, s, _ in chunks(data) if t == b"IDAT")
    for at in range(len(data)):
        expected = f"truncated PNG: {at} bytes, shorter than a PNG header (33)" if at < 33 else \
            NO_IDAT.format(at) if at < idat + 8 else NO_IEND.format(at) if at < len(data) - 4 else None
        assert png_check(data[:at]) == expected, at  # cut in IEND's CRC: its type is there, the sidecar's rule


def test_a_malformed_ihdr_is_refused_in_the_order_the_sidecar_checks() -> None:
    body = SOUND["rgb"][0][33:]
    assert png_check(SIGNATURE + chunk(b"IHDR", bytes(14)) + body) == \
        "corrupt PNG: the first chunk is not a 13-byte IHDR"
    assert png_check(SIGNATURE + chunk(b"IHDX", bytes(13)) + body) == \
        "corrupt PNG: the first chunk is not a 13-byte IHDR"
    assert png_check(SIGNATURE + chunk(b"tEXt", b"a\x00bcdefghijkl") + body) == \
        "corrupt PNG: the first chunk is not a 13-byte IHDR"
    for w, h in ((0, 5), (5, 0), (1 << 31, 5), (5, 0xFFFFFFFF)):
        assert png_check(SIGNATURE + ihdr(w, h) + body) == f"corrupt PNG: IHDR declares {w}x{h} pixels"
    assert png_check(SIGNATURE + ihdr((1 << 31) - 1, 1) + body) is None  # the largest side PNG allows
    for color_type in (1, 5, 7, 9, 255):
        assert png_check(SIGNATURE + ihdr(0, 5, color_type=color_type) + body) == \
            "corrupt PNG: IHDR declares 0x5 pixels"  # the size first
        assert png_check(SIGNATURE + ihdr(3, 5, color_type=color_type) + body) == \
            f"corrupt PNG: IHDR declares color type {color_type}"


def test_no_image_data_and_no_iend() -> None:
    data = SOUND["rgb"][0]
    iend = chunk(b"IEND", b"")
    assert png_check(data[:33] + iend) == NO_IDAT.format(45)
    assert png_check(data[:33] + chunk(b"tEXt", b"a\x00b") + iend) == NO_IDAT.format(60)
    assert png_check(data[:-12]) == NO_IEND.format(len(data) - 12)
    assert png_check(data[:-12] + b"IEND") is None  # the sidecar looks for the type's four bytes
    assert png_check(data + iend) is None


def test_image_header_names_a_png_by_its_signature_however_short() -> None:
    data = SOUND["rgb"][0]
    assert image_header(data[:8]) == ("png", 0, 0) and image_header(data[:23]) == ("png", 0, 0)
    assert image_header(data) == ("png", 19, 21)


def _patched_chunk(data: bytes, kind: bytes, body: bytes, crc: bool = True) -> bytes:
    """``data`` with its first chunk of ``kind`` holding ``body``, its CRC right when ``crc``."""
    _, start, end = next(c for c in chunks(data) if c[0] == kind)
    new = chunk(kind, body)
    return data[:start] + (new if crc else new[:-4] + data[end - 4:end]) + data[end:]


def _idat(data: bytes) -> bytes:
    return b"".join(data[s + 8:e - 4] for t, s, e in chunks(data) if t == b"IDAT")


def test_what_libpng_refuses_in_the_chunks_and_the_image_data_is_refused_in_the_sidecars_words() -> None:
    data = SOUND["rgb"][0]
    idat = _idat(data)
    raw = zlib.decompress(idat)

    def rejected(png: bytes) -> None:
        assert png_check(png) is None, png_check(png)
        assert png_data_check(png) == REJECTED.format(len(png), 19, 21)

    flipped = bytes([idat[0]]) + bytes([idat[1]]) + bytes([idat[2] ^ 0x40]) + idat[3:]
    rejected(_patched_chunk(data, b"IDAT", flipped, crc=False))  # the IDAT's CRC
    rejected(data[:29] + bytes(4) + data[33:])  # the IHDR's
    rejected(_patched_chunk(data, b"IDAT", zlib.compress(raw[:len(raw) // 2])))  # too few rows
    rejected(_patched_chunk(data, b"IDAT", idat[:len(idat) // 2]))  # a stream that stops short of its end
    rejected(_patched_chunk(data, b"IDAT", zlib.compress(b"\x05" + raw[1:])))  # a filter type PNG does not define
    rejected(_patched_chunk(data, b"IDAT", b"\x78\x9c\xff\xff" + idat[4:]))  # not deflate data
    rejected(data[:33] + chunk(b"ABCD", b"") + data[33:])  # a critical chunk PNG does not define
    cut = len(data) - 20
    rejected(data[:cut] + chunk(b"IEND", b""))  # an IDAT chunk that runs past the end of the file
    for at, value in ((24, 3), (24, 16), (26, 1), (27, 1), (28, 2)):  # bit depth, methods
        png = _patched_chunk(data, b"IHDR", data[16:at] + bytes([value]) + data[at + 1:29])
        rejected(png)


def test_the_palette_rules() -> None:
    data = SOUND["palette"][0]
    plte = next(data[s:e] for t, s, e in chunks(data) if t == b"PLTE")
    idat = next(s for t, s, _ in chunks(data) if t == b"IDAT")
    w, h = 19, 21

    def verdict(png: bytes) -> object:
        return png_data_check(png) == REJECTED.format(len(png), w, h)

    without = data.replace(plte, b"")
    assert verdict(without) and verdict(data[:idat] + plte + data[idat:])  # none, two
    assert verdict(without[:-12] + plte + without[-12:])  # after the image data
    assert verdict(data.replace(plte, plte[:-4] + bytes(4)))  # its CRC
    rgb = SOUND["rgb"][0]
    assert png_data_check(rgb[:33] + plte + rgb[33:]) is None  # a suggested palette


def test_what_the_sidecars_decoder_tolerates_passes() -> None:
    data = SOUND["rgb"][0]
    idat = _idat(data)
    raw = zlib.decompress(idat)
    extra = zlib.compress(raw + bytes(40))
    assert png_data_check(_patched_chunk(data, b"IDAT", extra[:-4] + bytes(4))) is None  # past the rows: libpng warns
    assert png_data_check(_patched_chunk(data, b"IDAT", idat[:-4] + bytes(4))) == \
        REJECTED.format(len(data), 19, 21)  # a wrong checksum right after the last row: met reading it
    assert png_data_check(data[:-4] + bytes(4)) is None  # IEND's CRC
    text = SOUND["text_before_idat"][0]
    _, s, e = next(c for c in chunks(text) if c[0] == b"tEXt")
    assert png_data_check(text[:e - 4] + bytes(4) + text[e:]) is None  # an ancillary chunk's CRC
    split = b"".join(chunk(b"IDAT", idat[k:k + 7]) for k in range(0, len(idat), 7))
    assert png_data_check(data[:33] + split + data[-12:]) is None  # many IDAT chunks
    assert png_data_check(_patched_chunk(data, b"IDAT", zlib.compress(raw + bytes(40)))) is None  # too much data


def test_the_data_check_inflates_a_piece_at_a_time() -> None:
    """A 4096 x 4096 RGB PNG inflates to 48 MiB: the check reads every row's filter byte (a bad one in the last row is
    refused) while holding a few pieces of it, never the image."""
    import tracemalloc

    rows = np.zeros((4096, 1 + 3 * 4096), np.uint8)
    good = SIGNATURE + ihdr(4096, 4096) + chunk(b"IDAT", zlib.compress(rows.tobytes(), 9)) + chunk(b"IEND", b"")
    rows[-1, 0] = 5
    bad = SIGNATURE + ihdr(4096, 4096) + chunk(b"IDAT", zlib.compress(rows.tobytes(), 9)) + chunk(b"IEND", b"")
    del rows
    tracemalloc.start()
    try:
        assert png_data_check(good) is None
        assert png_data_check(bad) == REJECTED.format(len(bad), 4096, 4096)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak} bytes held to check a 48 MiB image"
