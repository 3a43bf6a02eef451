"""``unstall.prep.jpeg_rules`` on Motion-JPEG frames (no DHT segment: the decoder supplies the JPEG standard's Huffman
tables): the copy it makes is the sidecar's (protocol/fixtures/mjpeg-frame-v1*.jpg, which flight-server's
StandardHuffmanTablesTest holds the sidecar to), its tables are the ones libjpeg writes when it does not optimize,
and PIL decodes the frame, its copy and the original JPEG to the same pixels; and its order of refusals and restart
marker rule, as the sidecar's ImageHeader has them; and the rules on every scan of a multi-scan JPEG (the golden
verdicts of protocol/fixtures/jpeg-scans-v1.json, the sidecar's too)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from unstall.prep.jpeg_rules import JpegCheck, jpeg_check, with_standard_tables


def _jpeg(mode: str, progressive: bool = False) -> bytes:
    """A PIL JPEG with the standard Huffman tables (``optimize=False``, PIL's default), or a progressive one (its first
    scan the DC scan of every component, its third an AC scan)."""
    px = np.random.default_rng(5).integers(0, 255, (40, 56, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(px).convert(mode).save(buf, "JPEG", quality=90, optimize=False, progressive=progressive)
    return buf.getvalue()


def _segments(data: bytes) -> list[tuple[int, int, int]]:
    """``(marker, start, end)`` of each segment before the first scan's marker."""
    out, i = [], 2
    while data[i + 1] != 0xDA:
        end = i + 2 + int.from_bytes(data[i + 2:i + 4], "big")
        out.append((data[i + 1], i, end))
        i = end
    return out


def _first_scan(data: bytes) -> int:
    return _segments(data)[-1][2]


def _without_dht(data: bytes) -> bytes:
    segs = _segments(data)
    return data[:2] + b"".join(data[s:e] for m, s, e in segs if m != 0xC4) + data[segs[-1][2]:]


def _tables(data: bytes) -> list[bytes]:
    """Every table of ``data``'s DHT segments before its first scan: class byte, code counts, symbols."""
    out = []
    for marker, start, end in _segments(data):
        at = start + 4
        while marker == 0xC4 and at < end:
            n = 17 + sum(data[at + 1:at + 17])
            out.append(data[at:at + n])
            at += n
    return out


def _pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(bytes(data))))


def test_the_copy_is_the_golden_fixture_the_sidecar_makes_too(fixtures_dir: Path) -> None:
    frame = (fixtures_dir / "mjpeg-frame-v1.jpg").read_bytes()
    check = jpeg_check(frame)
    assert check == JpegCheck(None, 0x33, _first_scan(frame))
    assert with_standard_tables(frame, check) == (fixtures_dir / "mjpeg-frame-v1-standard-tables.jpg").read_bytes()


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_a_frame_gets_the_standard_tables_libjpeg_writes_and_decodes_as_its_original(mode: str) -> None:
    original = _jpeg(mode)
    assert jpeg_check(original) == JpegCheck(None), "tables defined: untouched"
    frame = _without_dht(original)
    check = jpeg_check(frame)
    assert check == JpegCheck(None, 0x33, _first_scan(frame))
    copy = bytes(with_standard_tables(frame, check))
    at = check.first_scan
    assert copy[:at] == frame[:at] and copy[-(len(frame) - at):] == frame[at:] and len(copy) == len(frame) + 420
    assert jpeg_check(copy) == JpegCheck(None), "the copy defines every table"
    # libjpeg (through PIL) writes the standard tables when it does not optimize: luminance only for gray
    assert set(_tables(original)) <= set(_tables(copy)) and len(_tables(original)) == (4 if mode == "RGB" else 2)
    assert np.array_equal(_pixels(copy), _pixels(original))
    assert np.array_equal(_pixels(frame), _pixels(original)), "PIL fills in the same standard tables"


def test_a_frame_that_defines_table_1_gets_only_table_0() -> None:
    frame = _without_dht(_jpeg("RGB"))
    table1 = bytes(with_standard_tables(frame, JpegCheck(None, 0x22, _first_scan(frame))))
    check = jpeg_check(table1)
    assert check == JpegCheck(None, 0x11, _first_scan(table1))
    copy = bytes(with_standard_tables(table1, check))
    assert [t[0] for t in _tables(copy)] == [0x01, 0x11, 0x00, 0x10]
    assert len(copy) == len(table1) + 4 + 2 * 17 + 12 + 162
    assert np.array_equal(_pixels(copy), _pixels(frame))


@pytest.mark.parametrize("dht", [True, False])
def test_an_undefined_table_2_is_still_refused(dht: bool) -> None:
    jpeg = _jpeg("RGB") if dht else _without_dht(_jpeg("RGB"))
    at = _first_scan(jpeg)
    for selector, kind, index in ((0x20, "DC", 2), (0x03, "AC", 3)):
        patched = jpeg[:at + 6] + bytes([selector]) + jpeg[at + 7:]  # component 1's tables
        assert jpeg_check(patched).problem == f"unsupported JPEG: the first scan's component 1 uses Huffman {kind} " \
            f"table {index}, which no DHT segment before it defines (only tables 0 and 1 have standard ones)"


def test_a_malformed_table_is_libjpegs_to_report_after_the_sidecars_own_rules() -> None:
    """libjpeg's words for a malformed table come only once the walk reached the scan, as the sidecar's header check
    leaves them to its decoder: a file cut short after it is refused as truncated first, by both."""
    jpeg = _jpeg("RGB")
    dht = next(s for m, s, _ in _segments(jpeg) if m == 0xC4)
    bad = jpeg[:dht + 5] + bytes([255] * 16) + jpeg[dht + 21:]  # code counts summing over 256
    assert jpeg_check(bad).problem == "libjpeg: Bogus Huffman table definition"
    assert jpeg_check(bad[:-2]).problem == \
        f"truncated JPEG: no end-of-image marker (FF D9) after the scan data, {len(bad) - 2} bytes in all"
    # a frame header longer than its components: libjpeg's, and its entries past the segment are not read
    sof = next(s for m, s, _ in _segments(jpeg) if m == 0xC0)
    long_sof = jpeg[:sof + 9] + b"\x04" + jpeg[sof + 10:]
    assert jpeg_check(long_sof).problem == "libjpeg: Bogus marker length"


def _scan_parameters(data: bytes, scan: int) -> int:
    """Where the ``scan``-th scan header's Ss, Se and Ah << 4 | Al bytes are (scan data holds no FF DA)."""
    at = [m.start() for m in re.finditer(b"\xff\xda", data)][scan]
    return at + 5 + 2 * data[at + 4]


@pytest.mark.parametrize("scan, params", [(0, (0, 3, 0x01)), (0, (0, 0, 0x0E)), (2, (1, 64, 0x00)),
                                          (2, (6, 5, 0x02)), (2, (1, 63, 0x31))])
def test_libjpegs_invalid_progressive_parameters_are_refused_in_its_words(scan: int, params: tuple[int, int, int]
                                                                         ) -> None:
    """A progressive scan's Ss, Se, Ah and Al as libjpeg checks them (a DC scan codes no AC coefficient, an AC scan
    coefficients within the 64, a refinement one bit, Al at most 13): the sidecar's decoder refuses them in these
    words (flight-server's NativeJpegTest) after its header rules pass the file."""
    data = _jpeg("RGB", progressive=True)
    at = _scan_parameters(data, scan)
    assert (data[at] == 0) == (params[0] == 0), "the same kind of scan"
    bad = data[:at] + bytes(params) + data[at + 3:]
    ss, se, ahal = params
    assert jpeg_check(bad).problem == \
        f"libjpeg: Invalid progressive parameters Ss={ss} Se={se} Ah={ahal >> 4} Al={ahal & 0x0F}"


def test_a_sequential_scans_odd_parameters_pass_and_its_ac_table_is_still_checked() -> None:
    """libjpeg only warns on a sequential scan's Ss, Se, Ah and Al (some writers leave them 0) and decodes it with its
    DC and AC tables whatever they say."""
    data = _jpeg("L")
    at = _scan_parameters(data, 0)
    zeros = data[:at] + bytes(3) + data[at + 3:]
    assert jpeg_check(zeros) == JpegCheck(None) and np.array_equal(_pixels(zeros), _pixels(data))
    frame = _without_dht(zeros)
    assert jpeg_check(frame) == JpegCheck(None, 0x33, _first_scan(frame)), "the standard AC table too"
    ac2 = zeros[:at - 1] + b"\x02" + zeros[at:]  # component 1's selectors: DC table 0, AC table 2
    assert jpeg_check(ac2).problem == "unsupported JPEG: the first scan's component 1 uses Huffman AC table 2, " \
        "which no DHT segment before it defines (only tables 0 and 1 have standard ones)"


@pytest.mark.parametrize("sof", [0xC3, 0xC5, 0xC6, 0xC7, 0xCB, 0xCD, 0xCE, 0xCF])
def test_a_coding_process_libjpeg_does_not_decode_is_refused_in_its_words(sof: int) -> None:
    """Lossless and differential frames: libjpeg-turbo 2.1 refuses them at the frame header, before any table."""
    data = _jpeg("RGB")
    at = data.index(b"\xff\xc0") + 1
    assert jpeg_check(data[:at] + bytes([sof]) + data[at + 1:]).problem == \
        f"libjpeg: Unsupported JPEG process: SOF type 0x{sof:02x}"


def _scan_ids(data: bytes, scan: int, ids: tuple[int, ...]) -> bytes:
    """``data`` with the ``scan``-th scan header's component ids replaced by ``ids`` (their tables kept)."""
    at = [m.start() for m in re.finditer(b"\xff\xda", data)][scan] + 5
    out = bytearray(data)
    out[at:at + 2 * len(ids):2] = bytes(ids)
    return bytes(out)


@pytest.mark.parametrize("ids, refused", [((1, 1, 3), 1), ((2, 1, 3), 1), ((3, 2, 1), 1), ((1, 3, 2), 2),
                                          ((1, 3, 3), 3), ((1, 2, 4), 4), ((1, 2, 3), None)])
def test_a_scans_repeated_or_misplaced_component_is_refused_in_libjpegs_words(ids: tuple[int, ...],
                                                                             refused: int | None) -> None:
    """libjpeg takes a scan's i-th component as the frame's first one from the i-th on with its id, and refuses one
    that repeats a component before it (jdmarker.c's get_sos), so a scan out of the frame's order is refused by where
    the frame lists its components; a progressive DC scan of components 3 and 2 (of 1, 2, 3) is taken."""
    data = _jpeg("RGB")
    assert jpeg_check(_scan_ids(data, 0, ids)).problem == \
        (None if refused is None else f"libjpeg: Invalid component ID {refused} in SOS")
    prog = _jpeg("RGB", progressive=True)
    dc = [m.start() for m in re.finditer(b"\xff\xda", prog)][0]
    two = prog[:dc] + bytes([0xFF, 0xDA, 0, 10, 2, 3, 0, 2, 0]) + prog[dc + 11:]  # components 3 and 2 of the 3
    assert prog[dc + 4] == 3 and jpeg_check(two).problem is None
    assert jpeg_check(_scan_ids(two, 0, (2, 1))).problem == "libjpeg: Invalid component ID 1 in SOS"


@pytest.mark.parametrize("marker", [0x02, 0x7F, 0xBF, 0xDE, 0xDF, 0xF0, 0xFD])
def test_a_marker_libjpeg_reads_no_segment_of_is_refused_in_its_words_before_the_first_scan(marker: int) -> None:
    """Reserved markers, DHP, EXP and JPGn: libjpeg refuses them where it meets them, once the sidecar's own rules
    pass the file (a truncation after it is refused as such); a DNL segment is skipped."""
    data = _jpeg("RGB")
    for at in (2, _first_scan(data)):
        bad = data[:at] + bytes([0xFF, marker, 0, 2]) + data[at:]
        assert jpeg_check(bad).problem == f"libjpeg: Unsupported marker type 0x{marker:02x}"
        assert jpeg_check(bad[:-2]).problem == \
            f"truncated JPEG: no end-of-image marker (FF D9) after the scan data, {len(bad) - 2} bytes in all"
    scan = _first_scan(data)
    assert jpeg_check(data[:scan] + bytes([0xFF, 0xDC, 0, 4, 0, 40]) + data[scan:]).problem is None


@pytest.mark.parametrize("sampling, refused", [(0x00, "Bogus sampling factors"), (0x52, "Bogus sampling factors"),
                                               (0x25, "Bogus sampling factors"), (0x42, None), (0x32, None),
                                               (0x44, "Sampling factors too large for interleaved scan"),
                                               (0x33, "Sampling factors too large for interleaved scan")])
def test_libjpegs_sampling_factor_refusals_are_in_its_words_and_order(sampling: int, refused: str | None) -> None:
    """Each sampling factor 1..4 (jdinput.c's initial_setup, at the first scan after its component ids, with the
    frame's size and precision), and at most 10 blocks an MCU in an interleaved scan (per_scan_setup, before the
    scan's quantization tables)."""
    data = _jpeg("RGB")  # 4:2:0: the luma component's factors 2x2
    sof = data.index(b"\xff\xc0")
    assert data[sof + 11] == 0x22
    bad = data[:sof + 11] + bytes([sampling]) + data[sof + 12:]
    assert jpeg_check(bad).problem == (None if refused is None else f"libjpeg: {refused}")
    if refused is not None:  # a scan's component ids, then the frame, then the MCU, then the quantization table
        assert jpeg_check(_scan_ids(bad, 0, (2, 1, 3))).problem == "libjpeg: Invalid component ID 1 in SOS"
        no_table = bad[:sof + 12] + b"\x03" + bad[sof + 13:]
        assert jpeg_check(no_table).problem == f"libjpeg: {refused}"
    twelve = data[:sof + 4] + b"\x0c" + data[sof + 5:]
    assert jpeg_check(twelve[:sof + 11] + b"\x00" + twelve[sof + 12:]).problem == \
        "libjpeg: Unsupported JPEG data precision 12"


def test_one_restart_marker_too_many_cuts_an_interval_unless_the_end_follows_it() -> None:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(5).integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(
        buf, "JPEG", quality=90, restart_marker_blocks=3)
    rst = buf.getvalue()  # 4 x 3 MCUs of 16x16 pixels, 3 an interval: 4 intervals, 3 restart markers
    at = len(rst) - 10  # inside the last interval's data
    assert rst[at - 1] != 0xFF and jpeg_check(rst).problem is None
    assert jpeg_check(rst[:at] + b"\xff\xd1" + rst[at:]).problem == \
        f"corrupt JPEG: marker 0xFFD1 at byte {at} cuts the scan data (its 4 restart intervals need 3 restart markers)"
    # libjpeg has read every interval before it: decoded
    assert jpeg_check(rst[:-2] + b"\xff\xd1" + rst[-2:]).problem is None


def test_the_rules_on_every_scan_give_the_golden_verdicts(fixtures_dir: Path) -> None:
    """protocol/fixtures/jpeg-scans-v1.json, which flight-server's ImageHeaderTest holds the sidecar to."""
    doc = json.loads((fixtures_dir / "jpeg-scans-v1.json").read_text())
    assert len(doc["cases"]) == 62
    for case in doc["cases"]:
        check = jpeg_check(bytes.fromhex(case["hex"]))
        assert check == JpegCheck(case["reason"], case["standard_tables"], case["first_scan"]), case["name"]


@pytest.mark.parametrize("options", [
    {"progressive": True}, {"progressive": True, "optimize": True}, {"progressive": True, "subsampling": 0},
    {"progressive": True, "subsampling": 1, "restart_marker_blocks": 3},
    {"progressive": True, "optimize": True, "restart_marker_rows": 1}, {"progressive": True, "mode": "L"},
    {"progressive": True, "mode": "L", "restart_marker_blocks": 1}, {"progressive": True, "mode": "CMYK"},
])
def test_pil_progressive_files_pass_every_scan(options: dict[str, Any]) -> None:
    """libjpeg's progressive files: a DHT before most scans, one component in each AC scan, restart intervals
    counted per scan (a scan of one component has one block an MCU); PIL decodes them."""
    mode = options.pop("mode", "RGB")
    px = np.random.default_rng(5).integers(0, 255, (37, 91, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(px).convert(mode).save(buf, "JPEG", quality=90, **options)
    data = buf.getvalue()
    assert data.count(b"\xff\xda") > 2 and jpeg_check(data) == JpegCheck(None)
    assert _pixels(data).shape[:2] == (37, 91)


def test_a_marker_in_a_later_scan_of_a_progressive_file_cuts_its_data() -> None:
    """A marker that may not follow a scan; one that may (a DHT) is read as its segment, and its length and tables
    (the scan data's bytes) refused as such."""
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(5).integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(
        buf, "JPEG", quality=90, progressive=True)
    prog = buf.getvalue()
    last = prog.rindex(b"\xff\xda")
    at = last + 2 + int.from_bytes(prog[last + 2:last + 4], "big") + 3  # in the last scan's data
    assert prog[at - 1] != 0xFF
    assert jpeg_check(prog[:at] + b"\xff\xc0" + prog[at:]).problem == \
        f"corrupt JPEG: marker 0xFFC0 at byte {at} cuts the scan data"
    assert jpeg_check(prog[:at] + b"\xff\xc4" + prog[at:]).problem.startswith("truncated JPEG: the 0xFFC4 segment at "
                                                                             f"byte {at} needs ")
