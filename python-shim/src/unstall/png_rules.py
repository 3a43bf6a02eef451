"""The sidecar's PNG rules, for decoders in the trainer's process. ``png_check``: its structure rules
(``ImageHeader.png`` in flight-server): a header of 33 bytes or more, a first chunk that is a 13-byte IHDR declaring a
size (1 to 2^31 - 1 pixels each way) and a color type PNG defines (0, 2, 3, 4 or 6), chunks that lead to the image
data (IDAT), and an IEND chunk after it. ``png_data_check``: what the sidecar's decoder (OpenCV's libpng) refuses once
they pass, read from the bytes. ``decode(device="mixed")`` (``MixedDecode._check``) applies both before its host
decoder sees the bytes, so a damaged PNG is refused with the sidecar's reason, not decoded (torchvision decodes a PNG
without IEND) or refused in torchvision's words; ``unstall.torch.decode_image`` applies both too. Either way
torchvision's ``decode_png``, which ends the process on a libpng error in the image data, never meets one."""

from __future__ import annotations

import zlib
from typing import Any, Optional

import numpy as np

__all__ = ["PNG_SIGNATURE", "png_check", "png_data_check"]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"  # a PNG file's first 8 bytes

_HEADER = 33  # the signature (8 bytes) and the IHDR chunk (length, type, 13 bytes of data, CRC)
_COLOR_TYPES = (0, 2, 3, 4, 6)  # gray, RGB, palette, gray + alpha, RGBA
_MAX_SIDE = (1 << 31) - 1
_TAIL = 4096  # where an IEND chunk is searched first: the end of the file, where it is


def _u32(b: memoryview, at: int) -> int:
    return int.from_bytes(b[at:at + 4], "big")


def _has_from_end(b: memoryview, start: int, needle: bytes) -> bool:
    """Whether ``needle`` occurs at or after ``start`` in ``b`` (the end of the file first)."""
    tail = max(start, len(b) - _TAIL)
    return bytes(b[tail:]).rfind(needle) >= 0 or bytes(b[start:tail + len(needle) - 1]).find(needle) >= 0


def _first_idat(b: memoryview) -> int:
    """Where the first IDAT chunk of ``b`` starts, walking the chunks after IHDR; -1 when the file ends first."""
    i = _HEADER
    while i + 8 <= len(b):
        if bytes(b[i + 4:i + 8]) == b"IDAT":
            return i
        i += 12 + _u32(b, i)
    return -1


def png_check(data: Any) -> Optional[str]:
    """Why the sidecar refuses the PNG ``data`` (bytes-like, starting with the PNG signature) from its structure, in
    its words (``ImageHeader.png``'s); None when it passes."""
    b = memoryview(data).cast("B")
    n = len(b)
    if n < _HEADER:
        return f"truncated PNG: {n} bytes, shorter than a PNG header ({_HEADER})"
    if _u32(b, 8) != 13 or bytes(b[12:16]) != b"IHDR":
        return "corrupt PNG: the first chunk is not a 13-byte IHDR"
    width, height, color_type = _u32(b, 16), _u32(b, 20), b[25]
    if not (0 < width <= _MAX_SIDE and 0 < height <= _MAX_SIDE):
        return f"corrupt PNG: IHDR declares {width}x{height} pixels"
    if color_type not in _COLOR_TYPES:
        return f"corrupt PNG: IHDR declares color type {color_type}"
    i = _first_idat(b)
    if i < 0:
        return f"truncated PNG: the file ends at byte {n} before any image data (IDAT)"
    if not _has_from_end(b, i, b"IEND"):
        return f"truncated PNG: no IEND chunk after the image data, {n} bytes in all"
    return None


_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # samples per pixel, by color type
# Adam7's passes: (first column, first row, column step, row step)
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def _rows(b: memoryview) -> list[tuple[int, int]]:
    """``(count, bytes)`` of the image data's rows, pass by pass (one pass unless Adam7-interlaced), each row a filter
    byte and its samples, from the IHDR of ``b``."""
    width, height, depth, color_type, interlace = _u32(b, 16), _u32(b, 20), b[24], b[25], b[28]
    bits = depth * _CHANNELS[color_type]
    passes = _ADAM7 if interlace == 1 else ((0, 0, 1, 1),)
    sizes = [(-(-(width - x) // dx), -(-(height - y) // dy)) for x, y, dx, dy in passes]
    return [(h, 1 + (w * bits + 7) // 8) for w, h in sizes if w > 0 and h > 0]


_CRITICAL = (b"IHDR", b"PLTE", b"IDAT", b"IEND")  # the critical chunks PNG defines
_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}  # bit depths, by color type


def _chunks(b: memoryview) -> Optional[list[tuple[bytes, int, int]]]:
    """``(type, start, end)`` of each chunk's data in ``b`` before IEND; None when one runs past the end of the file
    before IEND, or a critical chunk before it is not one PNG defines or fails its CRC (the sidecar's decoder refuses
    them; it only warns of an ancillary chunk's CRC, and does not check IEND's)."""
    out: list[tuple[bytes, int, int]] = []
    i = 8
    while i + 8 <= len(b):
        kind, end = bytes(b[i + 4:i + 8]), i + 12 + _u32(b, i)
        if end > len(b):
            return None
        if kind == b"IEND":
            return out
        if not kind[0] & 0x20 and (kind not in _CRITICAL or zlib.crc32(b[i + 4:end - 4]) != _u32(b, end - 4)):
            return None
        out.append((kind, i + 8, end - 4))
        i = end
    return None


def _ihdr_sound(b: memoryview, kinds: list[bytes]) -> bool:
    """Whether libpng reads the header chunks of ``b`` (``kinds``: its chunks' types, up to IEND): one IHDR, with a
    bit depth its color type allows, compression and filter method 0, interlace method 0 or 1; at most one PLTE,
    before the image data, and one for a palette image (color type 3)."""
    plte = kinds.count(b"PLTE")
    palette = plte == kinds[:kinds.index(b"IDAT")].count(b"PLTE") and plte <= 1 and (b[25] != 3 or plte == 1)
    ihdr = kinds.count(b"IHDR") == 1 and b[24] in _DEPTHS[b[25]] and b[26] == 0 and b[27] == 0 and b[28] in (0, 1)
    return palette and ihdr


_PIECE = 1 << 20  # bytes inflated at a time: the check never holds the image's pixels


def _inflates(idat: bytes, rows: list[tuple[int, int]]) -> bool:
    """Whether libpng reads the zlib stream ``idat`` as the image's ``rows`` (a pass's count and bytes each): it
    inflates without error into them, each starting with a filter type PNG defines (0 to 4), and goes on to its end
    (libpng: "Not enough image data" when it does not; an error past the rows, such as a wrong checksum, it only
    warns of). Inflated ``_PIECE`` bytes at a time, each dropped once its rows' filter bytes are read."""
    sizes = [h * r for h, r in rows]
    starts = np.concatenate([at + r * np.arange(h, dtype=np.int64)
                             for at, (h, r) in zip(np.cumsum([0] + sizes[:-1]), rows)])
    need, got, k = sum(sizes), 0, 0
    inflate = zlib.decompressobj()
    tail = idat
    try:
        while got < need:
            piece = inflate.decompress(tail, min(_PIECE, need - got))
            tail = inflate.unconsumed_tail
            if not piece and (inflate.eof or not tail):
                return False  # the stream or the data ended before the last row
            upto = int(np.searchsorted(starts, got + len(piece)))
            if (np.frombuffer(piece, np.uint8)[starts[k:upto] - got] > 4).any():
                return False
            k, got = upto, got + len(piece)
        while tail and not inflate.eof:
            inflate.decompress(tail, _PIECE)
            tail = inflate.unconsumed_tail
    except zlib.error:
        return got >= need
    return inflate.eof


def png_data_check(data: Any) -> Optional[str]:
    """Why the sidecar's decoder (OpenCV's, libpng) refuses a PNG that passed ``png_check`` and the caps, in the
    sidecar's words for it: chunks that run past the file before IEND, a critical chunk PNG does not define or whose
    CRC fails, header chunks libpng does not read (IHDR's bit depth and methods; PLTE), image data that does not
    inflate into every row or stops short of its stream's end, or a row whose filter type PNG does not define. The
    device checks them before its host decoder (torchvision's ``decode_png``, which ends the process on a libpng
    error in the image data); None when they pass. One inflate of the image data, a piece at a time."""
    b = memoryview(data).cast("B")
    refused = f"the PNG decoder rejected it (corrupt data), {len(b)} bytes declaring {_u32(b, 16)}x{_u32(b, 20)} pixels"
    found = _chunks(b)
    if found is None or not _ihdr_sound(b, [kind for kind, _, _ in found]):
        return refused
    idat = b"".join(b[start:end] for kind, start, end in found if kind == b"IDAT")
    return None if _inflates(idat, _rows(b)) else refused
