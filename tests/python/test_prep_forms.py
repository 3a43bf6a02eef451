"""The cache forms through a real sidecar (docs/PREP.md, "Cache forms"): a PrepLoader over several epochs gets the
same tensors, ids and order with the decoded form as without it (bit-exact here: the images are small enough that
no crop takes a reduced DCT scale, so the kept pixels are full size), the sidecar keeps every JPEG decoded and
prepares later epochs from the kept pixels, and the group's stats and ``unstall analyze``'s line say what the cost
model planned and why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from test_prep_support import BATCH, N_SAMPLES, PIPELINE_NCHW, make_images

import unstall  # noqa: E402  (after test_prep_support put this checkout's shim first)
from unstall import prep
from unstall.analyze.report import cache_forms_lines

EPOCHS = 3
N_PNG = len(range(0, N_SAMPLES, 7))  # make_images writes every 7th sample as a PNG (the OpenCV path: no form)


def _epochs(s: unstall.Sidecar) -> tuple[list[tuple[np.ndarray, np.ndarray]], dict[str, Any]]:
    """Every epoch's ids and images; the group's stats after the last."""
    with unstall.FlightClient(s.flight_location, s.token) as client, prep.PrepLoader(
            "imgs", PIPELINE_NCHW, batch_size=BATCH, seed=5, epochs=EPOCHS, client=client, with_ids=True,
            copy=True, window=2, autotune=False) as loader:  # a small window: epoch 0 is prepared before epoch 2
        out = []
        for _ in range(EPOCHS):
            batches = [(ids.numpy(), images.numpy()) for images, _, ids in loader]
            out.append((np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches])))
        return out, loader.membership.group_stats()


def test_the_decoded_form_gives_the_encoded_paths_tensors_and_says_what_it_planned(
        start_sidecar: Callable[..., unstall.Sidecar], tmp_path: Path) -> None:
    root = make_images(tmp_path / "imgs")
    on = start_sidecar(memory_budget="1GiB")
    off = start_sidecar(memory_budget="1GiB", java_options=["-Dunstall.prep.decoded-form=off"])
    for s in (on, off):
        s.register_dataset("imgs", root)
    with unstall.FlightClient(on.flight_location, on.token) as c:
        decode = json.loads(c.do_action("prep.stats")[0])["decode"]
    if decode["decoder"] != "libjpeg-turbo-crop":
        pytest.skip(f"the sidecar runs without its native JPEG library: {decode.get('decoder_reason')}")

    kept, stats = _epochs(on)
    plain, plain_stats = _epochs(off)
    for e in range(EPOCHS):
        assert sorted(kept[e][0].tolist()) == list(range(N_SAMPLES)), f"epoch {e}: every sample once"
        np.testing.assert_array_equal(kept[e][0], plain[e][0], err_msg=f"epoch {e}: the same order")
        np.testing.assert_array_equal(kept[e][1], plain[e][1], err_msg=f"epoch {e}: the same tensors")
    assert not np.array_equal(kept[0][1], kept[1][1]), "each epoch draws new crops"

    with unstall.FlightClient(on.flight_location, on.token) as c:
        decoded = json.loads(c.do_action("prep.stats")[0])["decode"]["decoded"]
    assert decoded["enabled"] and decoded["images"] == N_SAMPLES - N_PNG, decoded
    assert decoded["hits"] == (EPOCHS - 1) * (N_SAMPLES - N_PNG), decoded  # epoch 0 decodes into the store

    plans = stats["cache_forms"]
    assert [p["epoch"] for p in plans] == list(range(EPOCHS)), plans
    assert "not measured yet" in plans[0]["reason"], plans[0]
    later = plans[-1]
    assert {"decoded_bytes", "predicted_epoch_s", "predicted_epoch_s_encoded_only", "bound", "keep_prepared",
            "encoded_cpu_ms_per_sample", "decoded_cpu_ms_per_sample"} <= later.keys(), later
    assert later["keep_prepared"] is False and "prepared batches not kept" in later["reason"], later
    assert all("measured_epoch_s" in p for p in plans[:-1]), plans
    line = cache_forms_lines(later)[0]
    assert line.startswith(f"  cache forms (sidecar, epoch {EPOCHS - 1}): ") and later["reason"] in line, line

    assert "cache_forms" not in plain_stats or not plain_stats["cache_forms"], plain_stats
