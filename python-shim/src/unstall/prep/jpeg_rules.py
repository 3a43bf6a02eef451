"""The sidecar's JPEG structure rules (``ImageHeader.jpeg`` in flight-server), for ``decode(device="mixed")``: the
markers up to the end-of-image marker, each segment's length, one frame header with a size and 1, 3 or 4 components
and a coding process libjpeg decodes, the tables it and each scan use defined (by the segments before that scan) and
well formed, each progressive scan's parameters valid (libjpeg's header and scan errors, in libjpeg's words), an
end-of-image marker after the scan data, no marker cutting a scan's data, and between the scans of a multi-scan
(progressive) JPEG only the markers libjpeg reads there. ``MixedDecode._check`` applies them before any decoder sees
the bytes, so a truncated or malformed JPEG is refused with the sidecar's reason whichever decoder (nvJPEG,
libjpeg-turbo) would have decoded it: some decode a truncated file's top rows without complaint, a later scan with a
table its file never defines, or scans libjpeg refuses. A sequential Motion-JPEG frame (a scan uses Huffman tables 0 or 1
that no DHT segment defines) is decoded from a copy with the standard tables inserted before its first scan, as the
sidecar decodes it (``StandardHuffmanTables``)."""

from __future__ import annotations

from bisect import bisect_left
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


# The markers by what the walk does with them, looked up once a segment.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # SOF0..SOF15 except DHT (C4), JPG (C8) and DAC (CC)
# The coding processes libjpeg-turbo 2.1 refuses at their frame header, lossless and differential (the JPG marker,
# 0xC8, in the same words, by the walk): it decodes sequential and progressive frames only, Huffman (SOF0, SOF1,
# SOF2) or arithmetic coded (SOF9, SOF10)
_UNSUPPORTED = frozenset((0xC3, 0xC5, 0xC6, 0xC7, 0xCB, 0xCD, 0xCE, 0xCF))
_PROGRESSIVE = frozenset((0xC2, 0xCA))
_NO_LENGTH = frozenset((0x01, *range(0xD0, 0xD8)))  # TEM, RSTn: no length
# The markers libjpeg-turbo 2.1 reads no segment of, which it refuses wherever it meets them ("Unsupported marker
# type"): the reserved ones (0x02..0xBF), DHP, EXP and JPG0..JPG13 (hierarchical coding and extensions)
_UNKNOWN = frozenset((*range(0x02, 0xC0), 0xDE, 0xDF, *range(0xF0, 0xFE)))
# The markers libjpeg reads between scans: DHT, DAC, SOS, EOI, DQT, DNL (which it skips: the frame header declared the
# height), DRI, APPn and COM; not SOI, SOFn or the reserved ones, which it refuses there.
_FOLLOWS_SCAN = frozenset((0xC4, 0xCC, 0xFE, *range(0xD9, 0xDE), *range(0xE0, 0xF0)))
_EOI = frozenset((0xD9,))
# What a 0xFF byte in scan data starts, by the byte after it: 0 no marker (a stuffed 0x00, or fill: the marker's
# last 0xFF byte is a later one), 1 a restart marker, 2 another marker.
_AFTER_FF = np.full(256, 2, dtype=np.uint8)
_AFTER_FF[[0x00, 0xFF]] = 0
_AFTER_FF[0xD0:0xD8] = 1


def _tables(b: bytes, marker: int, start: int, end: int, quant: set[int], huff: set[tuple[int, int]]
            ) -> Optional[str]:
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
        count = sum(b[at + 1:at + 17])  # past ``end`` (a table cut short): refused all the same
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


class _Frame(NamedTuple):
    """A JPEG's frame header (SOF): its coding process (the SOF marker), size, by component id its quantization
    table and sampling factors, its component ids in order, and libjpeg's refusal of the frame at the first scan."""

    sof: int
    width: int
    height: int
    declared: int  # components declared
    components: dict[int, tuple[int, int, int]]  # id -> (quantization table, h, v)
    h_max: int
    v_max: int
    ids: bytes  # the components' ids, in the frame's order
    blocks: int  # the components' blocks an MCU (h * v), all of them together
    setup: Optional[str]  # libjpeg's refusal of the frame once it reaches the first scan (_setup); None: none

    def mcus(self, b: bytes, start: int) -> int:
        """The MCUs of the scan whose header's data starts at ``start`` (its component count, then their ids and
        tables): a scan of one component has one block an MCU, a scan of several the frame's interleaved MCUs."""
        if b[start] > 1:
            return -(-self.width // (8 * self.h_max)) * -(-self.height // (8 * self.v_max))
        _, h, v = self.components[b[start + 1]]
        return -(-self.width * h // (8 * self.h_max)) * -(-self.height * v // (8 * self.v_max))


def _frame(b: bytes, marker: int, start: int, end: int) -> _Frame | str:
    """The frame header ``marker`` whose length starts at ``start`` (the segment ends at ``end``), or why it is
    refused."""
    length = end - start
    if length < 8:
        return f"corrupt JPEG: a frame header of {length} bytes"
    height, width, count = b[start + 3] << 8 | b[start + 4], b[start + 5] << 8 | b[start + 6], b[start + 7]
    if width == 0 or height == 0:
        return f"unsupported JPEG: the frame header declares {width}x{height} pixels (a height of 0 defers it to a " \
            "DNL marker, which the decoder does not support)"
    if count not in (1, 3, 4):
        return f"unsupported JPEG: {count} color components (1, 3 or 4 expected)"
    components: dict[int, tuple[int, int, int]] = {}
    h_max = v_max = 1
    blocks = 0
    entries = range(start + 8, min(start + 8 + 3 * count, end - 2), 3)  # a segment too short: the entries in it
    for at in entries:
        h, v = b[at + 1] >> 4, b[at + 1] & 0x0F
        components[b[at]] = (b[at + 2], h, v)
        h_max, v_max = max(h_max, h), max(v_max, v)
        blocks += h * v
    return _Frame(marker, width, height, count, components, h_max, v_max, b[start + 8:entries.stop:3], blocks,
                  _setup(b, start, entries))


def _setup(b: bytes, start: int, entries: range) -> Optional[str]:
    """What libjpeg-turbo 2.1 refuses in the frame header whose length starts at ``start`` (components at
    ``entries``) once it reaches the first scan, after that scan's component ids (jdinput.c's initial_setup, in its
    order): a width or height above 65500, a precision other than 8 bits, a component's sampling factor outside
    1..4."""
    if b[start + 3] << 8 | b[start + 4] > 65500 or b[start + 5] << 8 | b[start + 6] > 65500:
        return "libjpeg: Maximum supported image dimension is 65500 pixels"
    if b[start + 2] != 8:
        return f"libjpeg: Unsupported JPEG data precision {b[start + 2]}"
    if any(not (0x10 <= b[at + 1] < 0x50 and 0 < b[at + 1] & 0x0F <= 4) for at in entries):  # h, v: 1..4
        return "libjpeg: Bogus sampling factors"
    return None


def _bytes(data: Any) -> bytes:
    """``data`` (bytes-like) as bytes, which the walk indexes and searches fastest: itself, or one copy."""
    return data if type(data) is bytes else memoryview(data).cast("B").tobytes()


def _jpeg(data: Any) -> Optional[str] | JpegCheck:
    """``jpeg_check``'s walk of the markers: why the JPEG is refused, None, or the standard tables it relies on."""
    b = _bytes(data)
    n = len(b)
    i = 2
    frame: Optional[_Frame] = None
    quant: set[int] = set()
    huff: set[tuple[int, int]] = set()  # (0: DC / 1: AC, index)
    interval = 0  # MCUs per restart interval (DRI); 0: none
    # libjpeg's first error (a malformed table or segment) before the first scan, reported once the walk reaches it:
    # the sidecar's header check goes on to its own rules (a truncation after it is refused as such) and leaves it to
    # libjpeg
    libjpeg: Optional[str] = None
    scans: Optional[_Markers] = None  # the markers from the first scan's data on, once the walk reaches it
    first_scan = 0  # where the first scan's marker starts
    empty = 0  # the Huffman slots 0 and 1 still empty at the first scan (bit t: DC table t, 4 + t: AC table t)
    standard = False  # a scan relies on the standard tables of those slots
    while True:
        if i >= n:
            if scans is not None:
                return _no_end_marker(n)
            return f"truncated JPEG: the file ends at byte {n}, inside its header" + \
                (" (no frame header yet)" if frame is None else " (no scan yet)")
        if b[i] != 0xFF:
            return f"corrupt JPEG: byte {i} should start a marker (0xFF), it is 0x{b[i]:02X}"
        i += 1
        while i < n and b[i] == 0xFF:
            i += 1  # fill bytes
        if i >= n:
            continue  # truncated, reported above
        marker = b[i]
        i += 1
        if marker in _NO_LENGTH:
            continue
        if scans is not None:
            if marker == 0xD9:
                return JpegCheck(None, empty, first_scan) if standard else None
            if marker not in _FOLLOWS_SCAN:
                return f"corrupt JPEG: marker 0xFF{marker:02X} at byte {i - 2} between scans"
        elif marker in (0xD8, 0xD9, 0x00):
            return f"corrupt JPEG: marker 0xFF{marker:02X} at byte {i - 2}" + \
                (" before the frame header" if frame is None else " before the first scan")
        if i + 2 > n:
            return f"truncated JPEG: the file ends at byte {n}, inside the length of marker 0xFF{marker:02X}"
        length = b[i] << 8 | b[i + 1]
        if length < 2:
            return f"corrupt JPEG: marker 0xFF{marker:02X} at byte {i - 2} has length {length}"
        end = i + length
        if end > n:
            return f"truncated JPEG: the 0xFF{marker:02X} segment at byte {i - 2} needs {length} bytes, the file " \
                f"ends at byte {n}"
        if marker in _SOF:
            if frame is not None:
                return f"corrupt JPEG: a second frame header (0xFF{marker:02X}) at byte {i - 2}"
            read = _frame(b, marker, i, end)
            if isinstance(read, str):
                return read
            frame = read
            if marker in _UNSUPPORTED:
                libjpeg = libjpeg or _unsupported(marker)
            elif length != 8 + 3 * frame.declared:
                libjpeg = libjpeg or "libjpeg: Bogus marker length"
        elif marker == 0xC8:
            libjpeg = libjpeg or _unsupported(marker)
        elif marker in (0xC4, 0xDB):
            why = _tables(b, marker, i + 2, end, quant, huff)
            if why is not None and scans is not None:
                return why  # libjpeg refuses it after the scans before it
            libjpeg = libjpeg or why
        elif marker == 0xDA:
            if frame is None:
                return f"corrupt JPEG: a scan (0xFFDA) at byte {i - 2} before any frame header"
            tables = _scan_tables(b, i + 2, end, frame, quant, huff, None if scans is None else i - 2) \
                if libjpeg is None else False
            if isinstance(tables, str):
                if not tables.startswith("libjpeg: "):
                    return tables
                libjpeg = tables
            if scans is None:
                # The entropy-coded data never holds FF D9: it is the end-of-image marker, last but for trailing
                # padding.
                if b.rfind(b"\xff\xd9", end) < 0:
                    return _no_end_marker(n)
                if libjpeg is not None:
                    return libjpeg
                multi_scan = frame.sof not in (0xC0, 0xC1, 0xC9) or b[i + 2] < frame.declared
                scans, first_scan = _Markers(b, end, multi_scan), i - 2
                empty = sum(1 << (4 * kind + index) for kind in (0, 1) for index in (0, 1) if (kind, index) not in huff)
            elif libjpeg is not None:
                return libjpeg
            standard = standard or tables is True
            at = scans.scan_end(end, -(-frame.mcus(b, i + 2) // interval) if interval else 0)
            if isinstance(at, str):
                return at
            i = at
            continue
        elif marker == 0xDD and length >= 4:
            interval = b[i + 2] << 8 | b[i + 3]
        elif marker in _UNKNOWN:
            libjpeg = libjpeg or f"libjpeg: Unsupported marker type 0x{marker:02x}"
        i = end


def _no_end_marker(n: int) -> str:
    return f"truncated JPEG: no end-of-image marker (FF D9) after the scan data, {n} bytes in all"


def _unsupported(marker: int) -> str:
    """libjpeg's refusal of a coding process it does not decode (``_UNSUPPORTED``), at its marker."""
    return f"libjpeg: Unsupported JPEG process: SOF type 0x{marker:02x}"


def _scan_tables(b: bytes, start: int, end: int, frame: _Frame, quant: set[int], huff: set[tuple[int, int]],
                 scan: Optional[int]) -> str | bool:
    """A scan's header as libjpeg checks it, in its order: its length and component ids (the scan marker), at the
    first scan the frame (``_Frame.setup``), an interleaved scan's blocks an MCU (at most 10), each component's
    quantization table (the sidecar's rule, in its words), a progressive scan's parameters, then the
    sidecar's rule on the Huffman tables (not for arithmetic coding): the tables the scan decodes with defined before
    it, a sequential scan's DC and AC tables whatever its parameters (libjpeg only warns on a sequential scan's odd
    ones, and decodes it), a progressive scan's DC table when it is a first DC scan, its AC table when it is an AC
    scan. A decoder that keeps its tables from one image to the next would otherwise decode with the last image's,
    and decoders differ on a missing Huffman table. But a sequential frame's (SOF0, SOF1) Huffman table 0 or 1 may be
    missing (a Motion-JPEG frame): libjpeg-turbo fills a fresh decompressor's slots 0 and 1 still empty at the first
    scan with the standard tables (its progressive decoder fills none), so the answer is True when the scan relies on
    them, whose standard tables both sides insert before the first scan; False when the scan's tables are defined.
    ``scan``: where the scan's marker starts, None for the first scan, as the refusals name it. A string: why it is
    refused."""
    count = b[start] if start < end else 0
    if end - start != 2 * count + 4 or not 1 <= count <= 4:
        return "libjpeg: Bogus marker length"
    ss, se, ahal = b[start + 1 + 2 * count], b[start + 2 + 2 * count], b[start + 3 + 2 * count]
    ah, al = ahal >> 4, ahal & 0x0F
    components = [(b[start + 1 + 2 * c], b[start + 2 + 2 * c]) for c in range(count)]  # (id, DC << 4 | AC table)
    ids = b[start + 1:start + 1 + 2 * count:2]
    if ids != frame.ids[:count] and (count > 1 or ids[0] not in frame.components):  # else taken, as in frame order
        why = _scan_components(ids, frame.ids)
        if why is not None:
            return why
    if scan is None and frame.setup is not None:
        return frame.setup
    if count > 1 and frame.blocks > 10 and \
            sum(frame.components[cid][1] * frame.components[cid][2] for cid, _ in components) > 10:
        return "libjpeg: Sampling factors too large for interleaved scan"
    for cid, _ in components:
        table = frame.components[cid][0]
        if table not in quant:
            return f"corrupt JPEG: {_scan_name(scan)}'s component {cid} uses quantization table {table}, which no " \
                "DQT segment before it defines"
    progressive = frame.sof in _PROGRESSIVE
    if progressive and not _progression(ss, se, ah, al, count):
        return f"libjpeg: Invalid progressive parameters Ss={ss} Se={se} Ah={ah} Al={al}"
    # The Huffman tables each component of the scan decodes with (0: its DC table, 1: its AC table); none when
    # arithmetic coded
    kinds = () if frame.sof >= 0xC9 else (0, 1) if not progressive else (1,) if ss else (0,) if ah == 0 else ()
    standard = False
    for cid, sel in components:
        for kind in kinds:
            index = sel & 0x0F if kind else sel >> 4
            if (kind, index) in huff:
                continue
            if index > 1 or progressive:
                which = "tables 0 and 1 have" if index > 1 else "a sequential frame's tables 0 and 1 have"
                return f"unsupported JPEG: {_scan_name(scan)}'s component {cid} uses Huffman {'AC' if kind else 'DC'} " \
                    f"table {index}, which no DHT segment before it defines (only {which} standard ones)"
            standard = True
    return standard


def _scan_components(scan: bytes, ids: bytes) -> Optional[str]:
    """libjpeg-turbo 2.1's refusal of a scan's component ids (jdmarker.c's get_sos), None when it takes them: the
    scan's i-th component is the frame's first one from the i-th on with its id, and no scan component repeats one
    before it; so a component out of the frame's order is refused when the frame lists it before its place in the
    scan (a scan of components 3 and 2 of 1, 2, 3 is taken, one of 2 and 1 is not)."""
    picked: list[int] = []
    for i, cid in enumerate(scan):
        try:
            at = ids.index(cid, i)
        except ValueError:
            return f"libjpeg: Invalid component ID {cid} in SOS"
        if at in picked:
            return f"libjpeg: Invalid component ID {cid} in SOS"
        picked.append(at)
    return None


def _progression(ss: int, se: int, ah: int, al: int, count: int) -> bool:
    """Whether libjpeg decodes a progressive scan of ``count`` components with these parameters (its
    start_pass_phuff_decoder and arithmetic start_pass): a DC scan (Ss 0) codes no AC coefficient, an AC scan one
    component's coefficients Ss..Se of the 64, a refinement scan (Ah not 0) one bit more (Al = Ah - 1), and the point
    transform Al is at most 13."""
    band = se == 0 if ss == 0 else ss <= se <= 63 and count == 1
    return band and (ah == 0 or al == ah - 1) and al <= 13


def _scan_name(scan: Optional[int]) -> str:
    """How a refusal names the scan whose marker starts at ``scan`` (None: the first scan)."""
    return "the first scan" if scan is None else f"the scan at byte {scan}"


class _Markers:
    """The markers of a JPEG from its first scan's data on (``b``: the whole JPEG), found at once (numpy): each 0xFF
    byte followed by neither a stuffed 0x00 nor fill, by where it is, the restart markers apart; and those that may
    end a scan's data: the end-of-image marker, and between the scans of a multi-scan JPEG (``multi_scan``) the
    others that may follow a scan too."""

    def __init__(self, b: bytes, start: int, multi_scan: bool) -> None:
        self.data = b
        self.ends = _FOLLOWS_SCAN if multi_scan else _EOI
        data = np.frombuffer(b, dtype=np.uint8)
        ff = (data[start:-1] == 0xFF).nonzero()[0]  # from ``start``
        after = _AFTER_FF[data[start + 1:][ff]]
        at = start + ff
        self.restarts: list[int] = at[after == 1].tolist()
        self.others: list[int] = at[after == 2].tolist()

    def scan_end(self, start: int, intervals: int) -> int | str:
        """Where the data of the scan from ``start`` ends (its next marker but the restart markers of its
        ``intervals`` restart intervals; 0: no restart interval declared, none), which must come after some data and
        be one that may follow a scan: the end-of-image marker after a single scan, and after each scan of a
        multi-scan JPEG also a table, restart interval, DNL, APPn or comment segment or the next scan
        (``_FOLLOWS_SCAN``); where that marker's last 0xFF byte is, or why the scan is refused. libjpeg-turbo stops at
        any other marker, at the end of data short of its restart intervals, or at one restart marker too many (it
        cuts an interval's data, unless the scan's data ends right after it), and fills the rest of the image with
        gray; other decoders (nvJPEG) are not checked there. The sidecar applies the same rule in its header check
        (``ImageHeader.scanEnd``), so both sides refuse such bytes whatever the crop, cache form or decoder."""
        data, n = self.data, len(self.data)
        k = bisect_left(self.others, start)
        end = self.others[k] if k < len(self.others) else n
        first, last = bisect_left(self.restarts, start), bisect_left(self.restarts, end)
        found = last - first
        if found and not intervals:
            at = self.restarts[first]
            return f"corrupt JPEG: marker 0xFF{data[at + 1]:02X} at byte {at} cuts the scan data (no restart " \
                "interval is declared)"
        if intervals and found >= intervals:  # one too many: it cuts an interval, unless the scan's data ends there
            extra = self.restarts[first + intervals - 1]
            if not (extra + 3 < n and data[extra + 2] == 0xFF and data[extra + 3] in self.ends):
                return f"corrupt JPEG: marker 0xFF{data[extra + 1]:02X} at byte {extra} cuts the scan data " \
                    f"(its {intervals} restart intervals need {intervals - 1} restart markers)"
        if end == n:
            return _no_end_marker(n)
        if data[end + 1] not in self.ends or end == start:  # a scan codes at least one symbol
            return f"corrupt JPEG: marker 0xFF{data[end + 1]:02X} at byte {end} cuts the scan data"
        if intervals and found < intervals - 1:
            return f"truncated JPEG: the scan data ends after {found + 1} of its {intervals} restart intervals"
        return end
