"""A seeded random cross-check that the device path (``decode(device="mixed")``: ``MixedDecode``, the host decode of a
PNG) and a real sidecar (``decode()``) give one verdict on damaged PNGs: valid files of several kinds (PIL: RGB,
palette, gray, several IDAT chunks; 16-bit RGBA) cut, cut and closed again with an IEND chunk, with bytes flipped
anywhere or in the image data (its CRC made right), chunks dropped or duplicated. What one side refuses the other
refuses, in the same words. test_prep_mixed_damaged_png.py has the named cases."""

from __future__ import annotations

from typing import Iterator, NamedTuple

import numpy as np
import pytest

from test_prep_mixed_backends import _mixed
from test_prep_mixed_damaged import _picture
from test_prep_mixed_damaged_png import _png, chunk, chunks, raw_png, split_idat
from test_prep_support import PrepEnv, start_env

from unstall import prep  # noqa: E402  (after test_prep_support put this checkout's shim first)

SEED = 20261128
PER_KIND = 12  # mutations of each kind per base file
OPS = (prep.decode(on_error="skip"), prep.resize((24, 32)))
KINDS = ("cut", "cut_iend", "flip", "flip_data", "overwrite_data", "drop_chunk", "duplicate_chunk")


class Sample(NamedTuple):
    name: str
    data: bytes


def _bases() -> dict[str, bytes]:
    from PIL import Image

    px = _picture(40, 56)
    rgb = Image.fromarray(px)
    wide = np.concatenate([px, px[..., :1]], -1).astype(np.uint16) * 257
    return {"rgb": _png(rgb), "palette": _png(rgb.convert("P")), "gray_split": split_idat(_png(rgb.convert("L")), 300),
            "rgba_16": raw_png(wide, 6)}


def _mutate(kind: str, base: bytes, rng: np.random.Generator) -> bytes:
    parts = chunks(base)
    if kind in ("cut", "cut_iend"):
        at = int(rng.integers(8, len(base)))
        return base[:at] + (chunk(b"IEND", b"") if kind == "cut_iend" else b"")
    if kind == "flip":
        at = int(rng.integers(8, len(base)))
        return base[:at] + bytes([base[at] ^ int(rng.integers(1, 256))]) + base[at + 1:]
    if kind in ("flip_data", "overwrite_data"):
        t, s, e = [p for p in parts if p[0] == b"IDAT"][int(rng.integers(0, sum(p[0] == b"IDAT" for p in parts)))]
        data = bytearray(base[s + 8:e - 4])
        at = int(rng.integers(0, len(data)))
        if kind == "flip_data":
            data[at] ^= int(rng.integers(1, 256))
        else:
            data[at:at + 8] = rng.integers(0, 256, len(data[at:at + 8]), dtype=np.uint8).tobytes()
        return base[:s] + chunk(b"IDAT", bytes(data)) + base[e:]
    _, s, e = parts[int(rng.integers(1, len(parts)))]  # not IHDR: the rules name its damage
    return base[:e] + base[s:] if kind == "duplicate_chunk" else base[:s] + base[e:]


def _samples() -> list[Sample]:
    rng = np.random.default_rng(SEED)
    return [Sample(f"{b}_{kind}_{k}", _mutate(kind, data, rng))
            for b, data in _bases().items() for kind in KINDS for k in range(PER_KIND)]


SAMPLES = _samples()
KEYS = [f"c0/{k:04d}_{s.name}.png" for k, s in enumerate(SAMPLES)]


@pytest.fixture(scope="module")
def sidecar_reasons(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """The sidecar's reason by the id of each sample it refuses (the whole image decoded)."""
    tmp = tmp_path_factory.mktemp("png-verdicts")
    for e in start_env(tmp, extra_args=("--prep-threads", "1")):
        for key, s in zip(KEYS, SAMPLES):
            (tmp / "v" / key).parent.mkdir(parents=True, exist_ok=True)
            (tmp / "v" / key).write_bytes(s.data)
        e.sidecar.register_dataset("v", tmp / "v")
        return _sidecar(e)
    raise AssertionError("no sidecar")


def _sidecar(env: PrepEnv) -> dict[int, str]:
    pipe = prep.Pipeline(OPS, layout="NHWC", dtype="uint8")
    with env.client() as client, prep.PrepLoader("v", pipe, batch_size=1, shuffle=False, epochs=1, client=client,
                                                  on_error="skip") as loader:
        for _ in loader:
            pass
        skipped = list(loader.skipped)
    assert all(s["key"] == KEYS[s["id"]] for s in skipped), [s for s in skipped if s["key"] != KEYS[s["id"]]][:3]
    return {int(s["id"]): str(s["reason"]) for s in skipped}


def _device() -> Iterator[tuple[int, str]]:
    """Each sample's id and the device path's error (""; decoded)."""
    import torch

    mixed = _mixed("torchvision", (prep.decode(device="mixed"), prep.resize((24, 32))))
    for k, s in enumerate(SAMPLES):
        try:
            mixed([torch.frombuffer(bytearray(s.data), dtype=torch.uint8)], [k], 0, 7, [KEYS[k]])
            yield k, ""
        except ValueError as e:
            yield k, str(e)


def test_the_device_and_the_sidecar_refuse_the_same_damaged_pngs_in_the_same_words(
        sidecar_reasons: dict[int, str]) -> None:
    where = "decode(device='mixed'): sample {} ({}): "
    diverging = [(SAMPLES[k].name, sidecar_reasons.get(k), why) for k, why in _device()
                 if why != (where.format(k, KEYS[k]) + sidecar_reasons[k] if k in sidecar_reasons else "")]
    assert not diverging, "\n".join(map(str, diverging))
    assert 0.3 * len(SAMPLES) < len(sidecar_reasons) < len(SAMPLES), len(sidecar_reasons)  # both verdicts occur
