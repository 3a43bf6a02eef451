"""The headers the sidecar vouches for (a raw or hybrid batch's ``header`` column, ``prep.next``'s ``headers``;
protocol/README.md, "Vouched headers"): ``MixedDecode`` skips the JPEG rules on a vouched row and decodes it bit for
bit as it decodes the row it checks itself, Motion-JPEG frames included; an unvouched row is checked as before, in
the same words; ``formats`` and the caps still apply to a vouched row. Through a real sidecar, over shared memory and
Flight, the member's batches carry the header of each JPEG it decodes (the sidecar's packing equals the device
rules' answer) and the images are the CPU path's within the bound of docs/PREP.md, without a JPEG rule run on the
trainer's host."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest

import test_prep_mixed
from test_prep_mixed import BACKENDS, _compare, _epochs
from test_prep_mixed_backends import _mixed
from test_prep_mixed_damaged import _jpeg, _picture
from test_prep_native import _images
from test_prep_support import REPO, PrepEnv

from unstall import prep  # noqa: E402  (after test_prep_support put this checkout's shim first)
from unstall.prep import mixed as mixed_module  # noqa: E402
from unstall.prep.jpeg_rules import jpeg_check  # noqa: E402
from unstall.prep.mixed import MixedDecode  # noqa: E402
from unstall.prep.mixed_parts import image_header  # noqa: E402
from unstall.protocol import VouchedHeader  # noqa: E402

FRAME = REPO / "protocol" / "fixtures" / "mjpeg-frame-v1.jpg"
mixed_env = test_prep_mixed.env  # the fixture: a sidecar serving test_prep_mixed's JPEGs, one for this module


def _vouch(data: Any) -> int:
    """The header the sidecar packs for ``data`` (bytes-like), by the device's rules: exactly the JPEGs they pass
    (flight-server's ImageHeaderTest holds the sidecar to that on protocol/fixtures/jpeg-scans-v1.json); -1 else."""
    kind, w, h = image_header(data)
    check = jpeg_check(data) if kind == "jpeg" else None
    if check is None or check.problem is not None:
        return -1
    return VouchedHeader(w, h, check.standard_tables, check.first_scan).packed()


@pytest.fixture
def rule_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the JPEG rules ``MixedDecode`` runs (the module attribute it calls, wrapped)."""
    calls: list[int] = []
    real = mixed_module.jpeg_check

    def counted(data: Any) -> Any:
        calls.append(1)
        return real(data)

    monkeypatch.setattr(mixed_module, "jpeg_check", counted)
    return calls


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[bytes], list[str]]:
    """test_prep_mixed's JPEGs (4:2:0, 4:2:2, 4:4:4, grayscale), a Motion-JPEG frame and a PNG."""
    from PIL import Image

    paths = _images(tmp_path_factory.mktemp("vouched"))
    png = tmp_path_factory.mktemp("png") / "x.png"
    Image.fromarray(_picture(40, 56)).save(png)
    files = [*paths, FRAME, png]
    return [p.read_bytes() for p in files], [p.name for p in files]


def _tensors(blobs: list[bytes]) -> list[Any]:
    import torch

    return [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]


def _refusal(decode: MixedDecode, rows: list[bytes], keys: list[str], headers: Optional[np.ndarray]) -> str:
    """The error of ``decode`` on a batch of ``rows`` (ids 0, 1, ...)."""
    with pytest.raises(ValueError) as e:
        decode(_tensors(rows), list(range(len(rows))), 0, 7, keys, headers=headers)
    return str(e.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_vouched_rows_skip_the_jpeg_rules_and_decode_bit_for_bit_as_checked_rows(
        batch: tuple[list[bytes], list[str]], backend: str, rule_calls: list[int]) -> None:
    blobs, keys = batch
    headers = np.array([_vouch(b) for b in blobs], dtype=np.int64)
    frame = VouchedHeader.unpack(int(headers[keys.index(FRAME.name)]))
    assert frame is not None and frame.standard_tables and frame.first_scan, "the frame relies on standard tables"
    assert headers[-1] == -1 and (headers[:-1] >= 0).all(), "every JPEG vouched, the PNG not"
    ids = list(range(len(blobs)))
    for ops in (prep.imagenet_train(48, dtype="uint8", layout="NHWC", decode_device="mixed").ops,
                (prep.decode(device="mixed"), prep.resize(56), prep.center_crop(48))):
        decode = _mixed(backend, ops)
        rule_calls.clear()
        checked = decode(_tensors(blobs), ids, 1, 7, keys).numpy()
        assert len(rule_calls) == len(blobs) - 1  # every JPEG's rules on the host
        rule_calls.clear()
        vouched = decode(_tensors(blobs), ids, 1, 7, keys, headers=headers).numpy()
        assert rule_calls == []  # none: the sidecar read them
        np.testing.assert_array_equal(vouched, checked)
        frame_only = [keys.index(FRAME.name)]
        np.testing.assert_array_equal(
            decode(_tensors([blobs[k] for k in frame_only]), frame_only, 1, 7, [FRAME.name],
                   headers=headers[frame_only]).numpy(), checked[frame_only])


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_unvouched_damaged_row_beside_vouched_ones_is_refused_in_the_sidecars_words(
        batch: tuple[list[bytes], list[str]], backend: str, rule_calls: list[int]) -> None:
    blobs, keys = batch
    cut = blobs[0][:len(blobs[0]) // 2]
    rows = [blobs[1], cut, blobs[2]]
    headers = np.array([_vouch(blobs[1]), -1, _vouch(blobs[2])], dtype=np.int64)
    decode = _mixed(backend)
    why = _refusal(decode, rows, ["a.jpg", "cut.jpg", "b.jpg"], headers)
    assert why == f"decode(device='mixed'): sample 1 (cut.jpg): {jpeg_check(cut).problem}"
    assert why.startswith("decode(device='mixed'): sample 1 (cut.jpg): truncated JPEG: no end-of-image marker")
    assert len(rule_calls) == 1  # the unvouched row's only


def test_formats_and_caps_still_refuse_a_vouched_jpeg_in_the_same_words(batch: tuple[list[bytes], list[str]],
                                                                        rule_calls: list[int]) -> None:
    blobs, keys = batch
    big = _jpeg(_picture(40, 4100))  # 4100x40: an aspect ratio of 102.5
    cases: list[tuple[dict[str, Any], bytes, str]] = [
        ({"formats": ["png"]}, blobs[0], "not one of the formats the pipeline decodes: png"),
        ({"max_pixels": 1000}, blobs[0], "decompression bomb? the jpeg header declares"),
        ({}, big, "an aspect ratio of 102.5, above the cap of 100"),
    ]
    for extra, data, says in cases:
        ops = [dict(o) for o in prep.imagenet_train(48, dtype="uint8", layout="NHWC", decode_device="mixed").ops]
        ops[0].update(extra)
        decode = MixedDecode(ops, "uint8", "NHWC", "cpu")
        header = _vouch(data)
        assert header >= 0, extra
        checked = _refusal(decode, [data], ["c0/x.jpg"], None)
        assert _refusal(decode, [data], ["c0/x.jpg"], np.array([header], dtype=np.int64)) == checked
        assert checked.startswith("decode(device='mixed'): sample 0 (c0/x.jpg): ") and says in checked, checked


@pytest.mark.parametrize("transport,cpu_load", [("shm", 0), ("flight", 0), ("shm", 0.5)])
def test_through_a_sidecar_the_members_batches_carry_each_jpegs_header(
        mixed_env: tuple[PrepEnv, list[Path]], monkeypatch: pytest.MonkeyPatch, rule_calls: list[int], transport: str,
        cpu_load: float) -> None:
    """A raw group (and a hybrid one, whose prepared rows carry none) over shared memory and over Flight: every
    JPEG the member decodes comes with the sidecar's header, the device rules' packing of its bytes; no JPEG rule runs
    on the trainer's host; the images are the CPU path's within the bound."""
    e, paths = mixed_env
    seen: list[tuple[int, int]] = []  # (the sidecar's header, the device rules' packing) of each row decoded here
    real = MixedDecode.__call__

    def spy(self: MixedDecode, payloads: Any, ids: Any, epoch: int, seed: int, keys: Any = None, prepared: Any = None,
            timing: Any = None, headers: Any = None) -> Any:
        assert headers is not None and len(headers) == len(payloads)
        for k, p in enumerate(payloads):
            seen.append((int(headers[k]), -1 if prepared is not None and prepared[k] else _vouch(p.numpy())))
        return real(self, payloads, ids, epoch, seed, keys, prepared, timing, headers)

    monkeypatch.setattr(MixedDecode, "__call__", spy)
    cpu = _epochs(e, prep.imagenet_train(48, dtype="uint8", layout="NHWC"))
    pipe = prep.Pipeline((prep.decode(device="mixed", cpu_load=cpu_load), prep.random_resized_crop(48),
                          prep.hflip()), layout="NHWC", dtype="uint8")
    got = _epochs(e, pipe, "cpu", transport=transport, device_share=False)
    _compare(cpu, got)
    assert len(seen) == 2 * len(paths), seen
    assert all(sidecar == device for sidecar, device in seen), seen
    vouched = sum(h >= 0 for h, _ in seen)
    assert vouched == len(seen) if cpu_load == 0 else 0 < vouched < len(seen), seen  # hybrid: not the prepared rows
    assert rule_calls == []


def test_a_batch_of_vouched_rows_is_checked_at_once_as_row_by_row(batch: tuple[list[bytes], list[str]],
                                                                  rule_calls: list[int]) -> None:
    """``MixedDecode.heads`` checks a batch the sidecar vouched for in array operations only when every row passes
    as it is: its answer is the rows' own ``_check``; a row without a header, a Motion-JPEG frame (its tables copied
    in) or a cap crossed sends the batch row by row. The caps at their bounds agree with the row's test."""
    blobs, keys = batch
    jpegs = [k for k, b in enumerate(blobs) if _vouch(b) >= 0 and k != keys.index(FRAME.name)]
    headers = np.array([_vouch(blobs[k]) for k in jpegs], dtype=np.int64)
    rows, ids, names = _tensors([blobs[k] for k in jpegs]), jpegs, [keys[k] for k in jpegs]
    decode = _mixed("torchvision")
    fast = decode._vouched_batch(rows, headers)
    assert fast is not None and rule_calls == []
    one_by_one = [decode._check(x, i, k, VouchedHeader.unpack(int(h))) for x, i, k, h in zip(rows, ids, names, headers)]
    assert [(kind, size) for kind, size, _ in fast] == [(kind, size) for kind, size, _ in one_by_one]
    assert all(a is b for (_, _, a), (_, _, b) in zip(fast, one_by_one))  # the bytes as they came, no copy
    assert decode.heads(rows, ids, names, headers) == fast
    frame = keys.index(FRAME.name)
    for extra_row, extra_header in ((blobs[frame], _vouch(blobs[frame])), (blobs[0], -1)):
        more = np.append(headers, extra_header)
        assert decode._vouched_batch([*rows, *_tensors([extra_row])], more) is None
    ops = [dict(o) for o in prep.imagenet_train(48, dtype="uint8", layout="NHWC", decode_device="mixed").ops]
    ops[0].update(max_pixels=160_000, max_aspect_ratio=100)
    capped = MixedDecode(ops, "uint8", "NHWC", "cpu")
    for w, h in ((4000, 40), (4001, 40), (40, 4000), (40, 4001), (400, 400), (401, 400), (3, 0), (1, 1)):
        header = np.array([VouchedHeader(w, h, 0, 0).packed()], dtype=np.int64)
        row = _tensors([blobs[0]])
        try:
            expected: Any = [capped._check(row[0], 0, "x.jpg", VouchedHeader(w, h, 0, 0))]
        except ValueError:
            expected = None
        got = capped._vouched_batch(row, header)
        assert (got is None) == (expected is None), (w, h)
        assert got is None or [(k, s) for k, s, _ in got] == [(k, s) for k, s, _ in expected], (w, h)
