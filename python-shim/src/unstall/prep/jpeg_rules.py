"""The sidecar's JPEG structure rules (``ImageHeader.jpeg`` in flight-server), for ``decode(device="mixed")``: the
markers up to the first scan, each segment's length, one frame header with a size and 1, 3 or 4 components, the
tables it and the first scan use defined and well formed (libjpeg's header errors, in libjpeg's words), an
end-of-image marker after the scan data, and no marker cutting a single scan's data. ``MixedDecode._check`` applies
them before any decoder sees the bytes, so a truncated or malformed JPEG is refused with the sidecar's reason
whichever decoder (nvJPEG, libjpeg-turbo) would have decoded it: some decode a truncated file's top rows without
complaint. A Motion-JPEG frame (its first scan uses Huffman tables 0 or 1 that no DHT segment defines) is decoded
from a copy with the standard tables inserted, as the sidecar decodes it (``StandardHuffmanTables``)."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import numpy as np

__all__ = ["JpegCheck", "jpeg_check", "with_standard_tables"]

# The JPEG standard's Huffman tables (ITU T.81 Annex K.3: luminance as table 0, chrominance as table 1), which
# libjpeg-turbo gives a fresh decompressor's empty slots 0 and 1: by DHT class and index byte (Tc << 4 | Th), the
# code counts by length (1..16 bits), then the symbols.
_STANDARD_TABLES: tuple[tuple[int, bytes, bytes], ...] = (
    (0x00, bytes([0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0]), bytes(range(12))),
    (0x10, bytes([0, 2, 1, 3, 3, 2, 4, 3, 5, 5, 4, 4, 0, 0, 1, 0x7D]), bytes.fromhex(
        "01020300041105122131410613516107227114328191a1082342b1c11552d1f0"
        "2433627282090a161718191a25262728292a3435363738393a43444546474849"
        "4a535455565758595a636465666768696a737475767778797a83848586878889"
        "8a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5"
        "c6c7c8c9cad2d3d4d5d6d7d8d9dae1e2e3e4e5e6e7e8e9eaf1f2f3f4f5f6f7f8"
        "f9fa")),
    (0x01, bytes([0, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0]), bytes(range(12))),
    (0x11, bytes([0, 2, 1, 2, 4, 4, 3, 4, 7, 5, 4, 4, 0, 1, 2, 0x77]), bytes.fromhex(
        "000102031104052131061241510761711322328108144291a1b1c109233352f0"
        "156272d10a162434e125f11718191a262728292a35363738393a434445464748"
        "494a535455565758595a636465666768696a737475767778797a828384858687"
        "88898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3"
        "c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae2e3e4e5e6e7e8e9eaf2f3f4f5f6f7f8"
        "f9fa")),
)


class JpegCheck(NamedTuple):
    """``jpeg_check``'s answer: why the sidecar refuses the JPEG (None: it passes), and for a frame that relies on the
    standard Huffman tables the slots to fill (bit t: DC table t, 4 + t: AC table t; 0: none) and where its first
    scan's marker starts."""

    problem: Optional[str]
    standard_tables: int = 0
    first_scan: int = 0


def with_standard_tables(data: Any, check: JpegCheck) -> bytearray:
    """``data`` (a JPEG whose ``check`` names standard tables) with one DHT segment holding them inserted at its first
    scan's marker: the bytes the sidecar decodes for it (``StandardHuffmanTables.insert``)."""
    b = memoryview(data).cast("B")
    tables = b"".join(bytes([tc]) + bits + values for tc, bits, values in _STANDARD_TABLES
                      if check.standard_tables & 1 << (4 * (tc >> 4) + (tc & 0x0F)))
    out = bytearray(b[:check.first_scan])
    out += b"\xff\xc4" + (len(tables) + 2).to_bytes(2, "big") + tables
    out += b[check.first_scan:]
    return out


def _sof(m: int) -> bool:
    """SOF0..SOF15 except DHT (C4), JPG (C8) and DAC (CC)."""
    return 0xC0 <= m <= 0xCF and m not in (0xC4, 0xC8, 0xCC)


def _tables(b: Any, marker: int, start: int, end: int, quant: set[int], huff: set[tuple[int, int]]) -> Optional[str]:
    """Reads a DQT or DHT segment's tables (its data: ``start..end``) into ``quant`` / ``huff``: libjpeg's error for
    a malformed one (its words, as the sidecar's decoder reports them), else None."""
    at = start
    while at < end:
        index = b[at]
        if marker == 0xDB:
            if index & 0x0F > 3:
                return f"libjpeg: Bogus DQT index {index & 0x0F}"
            at += 1 + 64 * (2 if index >> 4 else 1)
            quant.add(index & 0x0F)
            continue
        kind = 1 if index & 0x10 else 0
        index -= 0x10 * kind
        if index > 3:
            return f"libjpeg: Bogus DHT index {index}"
        count = sum(b[at + 1:min(at + 17, end)])
        if count > 256 or at + 17 + count > end:
            return "libjpeg: Bogus Huffman table definition"
        at += 17 + count
        huff.add((kind, index))
    return None if at == end else "libjpeg: Bogus marker length"


def jpeg_check(data: Any) -> JpegCheck:
    """Why the sidecar refuses the JPEG ``data`` (bytes-like, starting FF D8 FF) from its structure, in its words
    (``ImageHeader.jpeg``'s, libjpeg's for a malformed table), or the standard tables it relies on."""
    why = _jpeg(data)
    return why if isinstance(why, JpegCheck) else JpegCheck(why)


def _jpeg(data: Any) -> Optional[str] | JpegCheck:
    """``jpeg_check``'s walk of the markers: why the JPEG is refused, None, or the standard tables it relies on."""
    b = memoryview(data).cast("B")
    n = len(b)
    i = 2
    sof = -1
    components: dict[int, int] = {}  # component id -> its quantization table
    quant: set[int] = set()
    huff: set[tuple[int, int]] = set()  # (0: DC / 1: AC, index)
    interval = 0  # MCUs per restart interval (DRI); 0: none
    mcus = 0
    # libjpeg's first error (a malformed table or segment), reported once the walk reaches the scan: the sidecar's
    # header check goes on to its own rules (a truncation after it is refused as such) and leaves it to libjpeg
    libjpeg: Optional[str] = None
    while True:
        if i >= n:
            return f"truncated JPEG: the file ends at byte {n}, inside its header" + \
                (" (no frame header yet)" if sof < 0 else " (no scan yet)")
        if b[i] != 0xFF:
            return f"corrupt JPEG: byte {i} should start a marker (0xFF), it is 0x{b[i]:02X}"
        while i < n and b[i] == 0xFF:
            i += 1  # fill bytes
        if i >= n:
            continue  # truncated, reported above
        marker = b[i]
        i += 1
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:
            continue  # TEM, RSTn: no length
        if marker in (0xD8, 0xD9, 0x00):
            return f"corrupt JPEG: marker 0xFF{marker:02X} at byte {i - 2}" + \
                (" before the frame header" if sof < 0 else " before the first scan")
        if i + 2 > n:
            return f"truncated JPEG: the file ends at byte {n}, inside the length of marker 0xFF{marker:02X}"
        length = b[i] << 8 | b[i + 1]
        if length < 2:
            return f"corrupt JPEG: marker 0xFF{marker:02X} at byte {i - 2} has length {length}"
        end = i + length
        if end > n:
            return f"truncated JPEG: the 0xFF{marker:02X} segment at byte {i - 2} needs {length} bytes, the file " \
                f"ends at byte {n}"
        if _sof(marker):
            if sof >= 0:
                return f"corrupt JPEG: a second frame header (0xFF{marker:02X}) at byte {i - 2}"
            if length < 8:
                return f"corrupt JPEG: a frame header of {length} bytes"
            sof = marker
            height, width, count = b[i + 3] << 8 | b[i + 4], b[i + 5] << 8 | b[i + 6], b[i + 7]
            if width == 0 or height == 0:
                return f"unsupported JPEG: the frame header declares {width}x{height} pixels (a height of 0 defers " \
                    "it to a DNL marker, which the decoder does not support)"
            if count not in (1, 3, 4):
                return f"unsupported JPEG: {count} color components (1, 3 or 4 expected)"
            if length != 8 + 3 * count:
                libjpeg = libjpeg or "libjpeg: Bogus marker length"
            inside = [c for c in range(count) if i + 10 + 3 * c < end]  # a segment too short: the entries it holds
            components = {b[i + 8 + 3 * c]: b[i + 10 + 3 * c] for c in inside}
            h_max = max([b[i + 9 + 3 * c] >> 4 for c in inside] + [1])
            v_max = max([b[i + 9 + 3 * c] & 0x0F for c in inside] + [1])
            # MCUs of the scan that holds every component (one block each when there is one component)
            mcus = (-(-width // (8 * (h_max if count > 1 else 1)))) * (-(-height // (8 * (v_max if count > 1 else 1))))
        elif marker in (0xC4, 0xDB):
            libjpeg = libjpeg or _tables(b, marker, i + 2, end, quant, huff)
        elif marker == 0xDA:
            if sof < 0:
                return f"corrupt JPEG: a scan (0xFFDA) at byte {i - 2} before any frame header"
            scan = _scan_tables(b, i + 2, end, sof, components, quant, huff) if libjpeg is None else 0
            if isinstance(scan, str) and not scan.startswith("libjpeg: "):
                return scan
            libjpeg = libjpeg or (scan if isinstance(scan, str) else None)
            # The entropy-coded data never holds FF D9: it is the end-of-image marker, last but for trailing padding.
            if bytes(b[end:]).rfind(b"\xff\xd9") < 0:
                return f"truncated JPEG: no end-of-image marker (FF D9) after the scan data, {n} bytes in all"
            if libjpeg is not None or isinstance(scan, str):
                return libjpeg
            multi_scan = sof not in (0xC0, 0xC1, 0xC9) or b[i + 2] < len(components)
            why = None if multi_scan else _marker_in_scan(b, end, -(-mcus // interval) if interval else 0)
            return JpegCheck(None, scan, i - 2) if why is None and scan else why
        elif marker == 0xDD and length >= 4:
            interval = b[i + 2] << 8 | b[i + 3]
        i = end


def _scan_tables(b: Any, start: int, end: int, sof: int, components: dict[int, int], quant: set[int],
                 huff: set[tuple[int, int]]) -> str | int:
    """The first scan's components (libjpeg's checks of the scan header), and the sidecar's rule on their tables:
    each component's quantization table, and with Huffman coding (not SOF9..SOF15) the DC table of a first DC scan
    and the AC table of an AC or sequential scan, defined before the scan. A decoder that keeps its tables from one
    image to the next would otherwise decode with the last image's, and decoders differ on a missing Huffman table.
    But a Huffman table 0 or 1 may be missing (a Motion-JPEG frame): libjpeg-turbo fills a fresh decompressor's
    empty slots 0 and 1 with the standard tables, so the answer is those slots (bit t: DC table t, 4 + t: AC table
    t), whose standard tables both sides insert; 0 when the scan's tables are defined. A string: why it is
    refused."""
    count = b[start] if start < end else 0
    if end - start != 2 * count + 4 or not 1 <= count <= 4:
        return "libjpeg: Bogus marker length"
    ss, se, ah = b[start + 1 + 2 * count], b[start + 2 + 2 * count], b[start + 3 + 2 * count] >> 4
    standard = False
    for c in range(count):
        cid, sel = b[start + 1 + 2 * c], b[start + 2 + 2 * c]
        if cid not in components:
            return f"libjpeg: Invalid component ID {cid} in SOS"
        if components[cid] not in quant:
            return f"corrupt JPEG: the first scan's component {cid} uses quantization table {components[cid]}, " \
                "which no DQT segment before it defines"
        needed = [("DC", 0, sel >> 4)] * (ss == 0 and ah == 0) + [("AC", 1, sel & 0x0F)] * (se > 0)
        for name, kind, index in needed if sof < 0xC9 else ():
            if (kind, index) in huff:
                continue
            if index > 1:
                return f"unsupported JPEG: the first scan's component {cid} uses Huffman {name} table {index}, " \
                    "which no DHT segment before it defines (only tables 0 and 1 have standard ones)"
            standard = True
    return sum(1 << (4 * kind + index) for kind in (0, 1) for index in (0, 1) if (kind, index) not in huff) \
        if standard else 0


def _marker_in_scan(b: Any, start: int, intervals: int) -> Optional[str]:
    """A single-scan JPEG's scan data (from ``start`` up to its end-of-image marker) holds no marker but its
    ``intervals`` - 1 restart markers (0: no restart interval declared, none). libjpeg-turbo stops at any other
    marker, at the end of data short of its restart intervals, or at one restart marker too many (it cuts an
    interval's data, unless only the end-of-image marker follows it), and fills the rest of the image with gray; other
    decoders (nvJPEG) are not checked there. The sidecar applies the same rule in its header check
    (``ImageHeader.markerInScan``), so both sides refuse such bytes whatever the crop, cache form or decoder.
    ``b``: the whole JPEG."""
    data = np.frombuffer(b, dtype=np.uint8)
    at = start + np.flatnonzero(data[start:-1] == 0xFF)
    after = data[at + 1]
    rst = (after & 0xF8) == 0xD0
    bad = (after != 0x00) & (after != 0xFF) & (~rst if intervals else True)
    k = int(np.argmax(bad))  # the caller found an end-of-image marker: some byte pair is bad
    restarts = np.flatnonzero(rst[:k])
    if intervals and len(restarts) >= intervals:  # one too many: it splits an interval, unless the end follows it
        extra = int(at[restarts[intervals - 1]])
        if bytes(data[extra + 2:extra + 4]) != b"\xff\xd9":
            return f"corrupt JPEG: marker 0xFF{int(data[extra + 1]):02X} at byte {extra} cuts the scan data (its " \
                f"{intervals} restart intervals need {intervals - 1} restart markers)"
    if after[k] != 0xD9:
        return f"corrupt JPEG: marker 0xFF{int(after[k]):02X} at byte {int(at[k])} cuts the scan data" + \
            (" (no restart interval is declared)" if rst[k] else "")
    found = int(rst[:k].sum())
    if intervals and found < intervals - 1:
        return f"truncated JPEG: the scan data ends after {found + 1} of its {intervals} restart intervals"
    return None
