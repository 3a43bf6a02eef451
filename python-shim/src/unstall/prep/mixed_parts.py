"""What ``decode(device="mixed")``'s decode backends share with ``MixedDecode`` (``mixed``, ``nvimgcodec_decode``):
the shape of the decoded pixels they hand back, the error that names a sample that does not decode, and the copy
of small host tensors onto the device. No torch import at module level."""

from __future__ import annotations

import struct
from typing import Any, List, Optional, Tuple

from ..png_rules import PNG_SIGNATURE

__all__ = ["Group", "image_header", "describe_image", "not_an_image", "not_decodable", "to_device"]

_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}  # frame headers: size

# Decoded images of a batch resampled in one call: an NCHW stack, each sample's window (x0, y0, x1, y1) in its image
# of the stack (the k-th window in the k-th image), and the samples' positions among the batch's encoded ones.
Group = Tuple[Any, List[Tuple[float, float, float, float]], List[int]]


def image_header(data: Any) -> Tuple[Optional[str], int, int]:
    """``(format, width, height)`` of an encoded image from its header alone (``data``: bytes-like), as the
    sidecar's ``ImageHeader`` reads it: ``"jpeg"`` (its frame header), ``"png"`` (IHDR) or ``"webp"`` (VP8, VP8L,
    VP8X); format None when it is none of them; sizes 0 when the header is cut short."""
    b = memoryview(data).cast("B")
    n = len(b)
    if n >= 3 and b[0] == 0xFF and b[1] == 0xD8 and b[2] == 0xFF:
        at = 2
        while at + 9 <= n and b[at] == 0xFF:
            marker = b[at + 1]
            if marker in _SOF:
                height, width = struct.unpack_from(">HH", b, at + 5)
                return "jpeg", width, height
            if marker == 0xFF:  # fill byte
                at += 1
                continue
            at += 2 + struct.unpack_from(">H", b, at + 2)[0]
        return "jpeg", 0, 0
    if n >= 8 and bytes(b[:8]) == PNG_SIGNATURE:
        return ("png", *struct.unpack_from(">II", b, 16)) if n >= 24 else ("png", 0, 0)
    if n >= 12 and bytes(b[:4]) == b"RIFF" and bytes(b[8:12]) == b"WEBP":
        chunk = bytes(b[12:16]) if n >= 16 else b""
        if chunk == b"VP8 " and n >= 30:
            width, height = struct.unpack_from("<HH", b, 26)
            return "webp", width & 0x3FFF, height & 0x3FFF
        if chunk == b"VP8L" and n >= 25:
            bits = struct.unpack_from("<I", b, 21)[0]
            return "webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
        if chunk == b"VP8X" and n >= 30:
            return "webp", int.from_bytes(b[24:27], "little") + 1, int.from_bytes(b[27:30], "little") + 1
        return "webp", 0, 0
    return None, 0, 0


# What bytes are by their magic, as the sidecar's ImageHeader.kind names them (its order, its words): a name, the
# least bytes it needs, and its magics, any of which names it: each a few (offset, bytes) that must all be there.
_KINDS: Tuple[Tuple[str, int, Tuple[Tuple[Tuple[int, bytes], ...], ...]], ...] = (
    ("a TIFF file", 0, (((0, b"II*\x00"),), ((0, b"MM\x00*"),), ((0, b"II+\x00"),), ((0, b"MM\x00+"),))),
    ("a JPEG 2000 file", 0, (((0, b"\xffO\xffQ"),), ((0, b"\x00\x00\x00\x0cjP  "),))),
    ("a GIF file", 0, (((0, b"GIF8"),),)),
    ("a BMP file", 0, (((0, b"BM"),),)),
    ("an OpenEXR file", 0, (((0, b"v/1\x01"),),)),
    ("a Radiance HDR file", 0, (((0, b"#?"),),)),
    ("a Sun raster file", 0, (((0, b"Y\xa6j\x95"),),)),
    ("an ISO media file (HEIF/AVIF)", 12, (((4, b"ftyp"),),)),
    ("a PNM/PFM file", 0, tuple(((0, b"P" + c),) for c in (b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"F", b"f"))),
    ("a WebP file", 0, (((0, b"RIFF"), (8, b"WEBP")),)),
    ("a JPEG file", 0, (((0, b"\xff\xd8\xff"),),)),
    ("a PNG file", 0, (((0, b"\x89PNG"),),)),
)


def _hex(b: bytes) -> str:
    return b[:8].hex(" ")


def describe_image(data: Any) -> Optional[str]:
    """What ``data`` (bytes-like) is by its magic bytes, with its first bytes ("a TIFF file (first bytes 49 49 2a 00
    ...)"), in the sidecar's words (``ImageHeader.describe``); None when no image format starts so."""
    b = bytes(memoryview(data).cast("B")[:12])
    for name, least, magics in _KINDS:
        if len(b) >= least and any(all(b[at:at + len(m)] == m for at, m in magic) for magic in magics):
            return f"{name} (first bytes {_hex(b)})"
    return None


def not_an_image(data: Any) -> str:
    """The sidecar's words (``ImageHeader.notAnImage``) for bytes no image format starts with."""
    view = memoryview(data).cast("B")
    if len(view) == 0:
        return "an empty file (0 bytes)"
    return f"not an image: no image format starts with the bytes {_hex(bytes(view[:8]))} ({len(view)} bytes in all)"


def not_decodable(sample_id: int, key: str, why: Any) -> ValueError:
    """The error of a sample whose bytes the device path does not decode, naming it."""
    return ValueError(f"decode(device='mixed'): sample {sample_id} ({key}) is not a JPEG the device decodes: {why}")


def to_device(t: Any, device: Any) -> Any:
    """A small host tensor onto ``device`` without blocking this thread on the stream's earlier work."""
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)
