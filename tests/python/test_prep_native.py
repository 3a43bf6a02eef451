"""The sidecar's native JPEG prep against torchvision's PIL path, and its float16/bfloat16 outputs, through a
real sidecar. Pixel error, uint8 units: docs/PREP.md, "The pipeline"."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from test_prep_support import PrepEnv, start_env

from unstall import prep  # noqa: E402  (after test_prep_support put this checkout's shim first)

SIZES = [(600, 450), (333, 257), (1203, 901), (97, 61)]
SUBSAMPLING = {"420": 2, "444": 0}  # PIL's subsampling codes
N = len(SIZES) * (len(SUBSAMPLING) + 1)


def _images(root: Path) -> list[Path]:
    from PIL import Image

    rng = np.random.default_rng(3)
    paths = []
    for w, h in SIZES:
        yy, xx = np.mgrid[0:h, 0:w]
        base = np.stack([128 + 90 * np.sin(xx * f + yy * g) for f, g in ((0.03, 0.01), (0.011, 0.05), (0.02, 0.02))], -1)
        px = np.clip(base + rng.normal(0, 10, base.shape), 0, 255).astype(np.uint8)
        for name, code in SUBSAMPLING.items():
            p = root / "c0" / f"{w}x{h}-{name}.jpg"
            p.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(px).save(p, "JPEG", quality=93, subsampling=code)
            paths.append(p)
        p = root / "c0" / f"{w}x{h}-gray.jpg"
        Image.fromarray(px[:, :, 0]).save(p, "JPEG", quality=93)
        paths.append(p)
    return sorted(paths)  # the folder format's order: sample id = index


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrepEnv, list[Path]]]:
    tmp = tmp_path_factory.mktemp("prep-native")
    # The encoded path is what this module measures: kept decoded pixels would replace the restart-indexed copies
    # (docs/PREP.md, "Cache forms"; tests/python/test_prep_forms.py covers them).
    for e in start_env(tmp, java_options=["-Dunstall.prep.decoded-form=off"]):
        paths = _images(tmp / "jpegs")
        e.sidecar.register_dataset("jpegs", tmp / "jpegs")
        yield e, paths


def _prepared(e: PrepEnv, pipeline: prep.Pipeline) -> dict[int, Any]:
    with e.client() as client, prep.PrepLoader("jpegs", pipeline, batch_size=4, seed=1, shuffle=False, epochs=1,
                                                client=client, with_ids=True, copy=True) as loader:
        return {int(i): img for images, _, ids in loader for img, i in zip(images, ids.numpy())}


def _running_group(e: PrepEnv, pipeline: prep.Pipeline) -> tuple[str, dict[str, Any]]:
    """Takes the first batch of ``pipeline``; returns its group's id and stats, read while the group runs."""
    with e.client() as client, prep.PrepLoader("jpegs", pipeline, batch_size=4, seed=1, shuffle=False, epochs=1,
                                                client=client) as loader:
        images, _ = next(iter(loader))
        assert images.shape[0] == 4
        return loader.membership.group, e.group_stats(loader.membership.group)


def _diff(a: np.ndarray, b: np.ndarray) -> tuple[int, float]:
    d = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return int(d.max()), float(d.mean())


def test_native_prep_stays_close_to_torchvisions_pil_path(env: tuple[PrepEnv, list[Path]]) -> None:
    import torchvision.transforms.functional as F
    from PIL import Image

    e, paths = env
    native = e.stats()["decode"]
    if native["decoder"] != "libjpeg-turbo-crop":
        pytest.skip(f"the sidecar runs without its native JPEG library: {native.get('decoder_reason')}")
    # Measured 2026-11-23: bit-exact where no DCT scaling applies; DCT-scaled (the image >= 4x the output)
    # max abs 4, mean abs <= 0.50.
    max_abs, mean_abs = 5, 0.6
    cases = [  # (pipeline ops, the PIL reference)
        ((prep.resize((150, 200)),), lambda im: im.resize((200, 150), Image.BILINEAR)),
        ((prep.resize(72), prep.center_crop(64)), lambda im: F.center_crop(F.resize(im, 72), 64)),
        ((prep.resize((48, 64)),), lambda im: im.resize((64, 48), Image.BILINEAR)),
    ]
    exact = 0
    for ops, ref in cases:
        pipeline = prep.Pipeline((prep.decode(), *ops), layout="NHWC", dtype="uint8")
        got = _prepared(e, pipeline)
        assert sorted(got) == list(range(N))
        for i, p in enumerate(paths):
            want = np.asarray(ref(Image.open(p).convert("RGB")))
            m, a = _diff(got[i].numpy(), want)
            print(f"{p.name} {ops}: max abs {m}, mean abs {a:.3f}")
            assert m <= max_abs and a <= mean_abs, f"{p.name} {ops}: max abs {m}, mean abs {a:.3f}"
            exact += m == 0
    assert exact >= N, "the crops without DCT scaling equal torchvision's PIL output"
    assert e.stats()["decode"]["samples_native"] >= native["samples_native"] + 3 * N


def test_stats_and_log_say_which_decoder_prepares_and_why(env: tuple[PrepEnv, list[Path]]) -> None:
    """prep.stats names the decoder of the process and of each group, with the reason when it is OpenCV (here:
    a pipeline whose ops the native path lacks), and so does the group's first log line."""
    from waits import wait_until

    e, _ = env
    process = e.stats()["decode"]
    if process["decoder"] != "libjpeg-turbo-crop":
        assert process["decoder"] == "opencv" and process["decoder_reason"], process
        pytest.skip(f"the sidecar runs without its native JPEG library: {process['decoder_reason']}")
    assert "decoder_reason" not in process, process
    cases = [  # (ops, decoder, the ops the reason names)
        ((prep.resize(40), prep.center_crop(32)), "libjpeg-turbo-crop", None),
        ((prep.random_resized_crop(40), prep.center_crop(32)), "opencv", "random_resized_crop then center_crop"),
    ]
    log_path = e.sidecar.log_path
    for ops, decoder, reason in cases:
        group, g = _running_group(e, prep.Pipeline((prep.decode(), *ops), layout="NHWC", dtype="uint8"))
        assert g["decoder"] == decoder, g
        if reason is None:
            assert "decoder_reason" not in g, g
            line_end = f"JPEGs prepared by {decoder}"
        else:
            assert f"the native path lacks the pipeline's {reason};" in g["decoder_reason"], g
            line_end = f"JPEGs prepared by {decoder} ({g['decoder_reason']})"
        start = f"prep group {group} starts with"
        line = wait_until(lambda start=start: next((ln for ln in log_path.read_text(errors="replace").splitlines()
                                        if start in ln), None),
                          f"'{start}' in {log_path}")
        assert line.endswith(line_end), line


def test_stats_say_when_an_option_forces_opencv(env: tuple[PrepEnv, list[Path]], tmp_path: Path) -> None:
    """-Dunstall.prep.decoder=opencv: the process and its groups say OpenCV prepares, forced by that option."""
    import unstall
    from unstall.sidecar import find_jar

    _, paths = env
    forced = unstall.Sidecar(home=tmp_path / "home", jar=find_jar(), cache_capacity="16MiB", memory_budget="1GiB",
                             java_options=["-Dunstall.prep.decoder=opencv"], start=True)
    try:
        forced.register_dataset("jpegs", paths[0].parent.parent)
        forced_env = PrepEnv(forced, paths[0].parent.parent, tmp_path)
        _, g = _running_group(forced_env, prep.imagenet_train(32, dtype="uint8"))
        decode = forced_env.stats()["decode"]
    finally:
        forced.close()
    reason = "forced by -Dunstall.prep.decoder=opencv"
    assert decode["decoder"] == "opencv" and decode["decoder_reason"] == reason, decode
    assert decode["samples_opencv"] >= 4 and decode["samples_native"] == 0, decode
    assert g["decoder"] == "opencv" and g["decoder_reason"] == reason, g


def test_float16_and_bfloat16_outputs_follow_float32(env: tuple[PrepEnv, list[Path]]) -> None:
    import torch

    e, _ = env
    ref = _prepared(e, prep.imagenet_train(32, dtype="float32"))
    for dtype, torch_dtype, tol in (("float16", torch.float16, 2e-3), ("bfloat16", torch.bfloat16, 1.6e-2)):
        got = _prepared(e, prep.imagenet_train(32, dtype=dtype))
        for i, x in got.items():
            assert x.dtype == torch_dtype and x.shape == (3, 32, 32)
            np.testing.assert_allclose(x.float().numpy(), ref[i].numpy(), atol=tol * 3, rtol=tol)


def test_restart_indexed_copies_give_the_same_batches_as_the_originals(
        env: tuple[PrepEnv, list[Path]], tmp_path: Path) -> None:
    """A sidecar decodes each JPEG's later crops from a restart-indexed copy of it, only the intervals the crop
    covers (docs/ARCHITECTURE.md, "Decoding only the crop's MCUs"): its batches equal, byte for byte, those of a
    sidecar that decodes the original files (--reindex-memory 0), epoch after epoch."""
    import unstall
    from unstall.sidecar import find_jar

    e, paths = env
    if e.stats()["decode"]["decoder"] != "libjpeg-turbo-crop":
        pytest.skip("the sidecar runs without its native JPEG library")
    pipeline = prep.imagenet_train(64, dtype="uint8")
    before = e.stats()["decode"]
    with_copies = [_prepared(e, pipeline) for _ in range(2)]  # the first run makes the copies, the second hits them
    after = e.stats()["decode"]
    made = after["reindexed"]["made"] - before["reindexed"]["made"]
    assert after["reindexed"]["enabled"] and made <= N and after["reindexed"]["copies"] >= N, after["reindexed"]
    assert after["reindexed"]["hits"] - before["reindexed"]["hits"] >= N, after["reindexed"]
    assert after["samples_spliced"] > before["samples_spliced"], after

    plain = unstall.Sidecar(home=tmp_path / "home", jar=find_jar(), cache_capacity="16MiB", memory_budget="1GiB",
                            extra_args=["--reindex-memory", "0"], start=True)
    try:
        plain.register_dataset("jpegs", paths[0].parent.parent)
        plain_env = PrepEnv(plain, paths[0].parent.parent, tmp_path)
        off = plain_env.stats()["decode"]
        assert not off["reindexed"]["enabled"] and off["reindexed"]["copies"] == 0, off
        originals = [_prepared(plain_env, pipeline) for _ in range(2)]
        assert plain_env.stats()["decode"]["samples_spliced"] == off["samples_spliced"]  # nothing spliced there
    finally:
        plain.close()
    for run, (got, want) in enumerate(zip(with_copies, originals)):
        assert sorted(got) == sorted(want) == list(range(N))
        for i in want:
            assert np.array_equal(got[i].numpy(), want[i].numpy()), f"run {run}, {paths[i].name}: not the same crop"
