"""``unstall.prep.draws``: the sidecar's per-sample draws in Python, against protocol/fixtures/draws-v1.json (which
flight-server's SpatialOpsTest holds the sidecar's own draws to)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from unstall.prep.draws import (SplittableRandom, SplittableRandoms, crop_params, sample_box, sample_boxes, sample_rng,
                                sample_rngs)


def test_every_case_of_the_golden_fixture(fixtures_dir: Path) -> None:
    cases = json.loads((fixtures_dir / "draws-v1.json").read_text())["cases"]
    assert len(cases) >= 300
    assert any(c["box"]["flip"] for c in cases) and any(not c["box"]["flip"] for c in cases)
    assert any(c["height"] * 10 < c["width"] for c in cases)  # the central-crop fallback
    for c in cases:
        box = sample_box(c["ops"], c["height"], c["width"], sample_rng(c["seed"], c["epoch"], c["id"]))
        assert box._asdict() == c["box"], c


def test_bounded_ints_stay_in_range_and_use_every_value() -> None:
    rng = SplittableRandom(12345)
    for bound in (1, 2, 3, 7, 64, 1000, 2**31 - 1):
        seen = {rng.next_int(bound) for _ in range(200)}
        assert min(seen) >= 0 and max(seen) < bound
        if bound <= 7:
            assert seen == set(range(bound))
    with pytest.raises(ValueError, match="bound must be positive"):
        rng.next_int(0)


def test_the_same_sample_and_epoch_draw_the_same_crop_and_another_epoch_another() -> None:
    crop = [crop_params(375, 500, (0.08, 1.0), (3 / 4, 4 / 3), sample_rng(3, e, 17)) for e in (0, 0, 1)]
    assert crop[0] == crop[1] != crop[2]
    top, left, h, w = crop[0]
    assert 0 <= top <= 375 - h and 0 <= left <= 500 - w


def test_ops_the_device_cannot_run_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="cannot run the op 'rotate'"):
        sample_box([{"op": "decode"}, {"op": "rotate"}], 10, 10, sample_rng(0, 0, 0))
    with pytest.raises(ValueError, match="center_crop 20x20 is larger than the 10x10 image"):
        sample_box([{"op": "decode"}, {"op": "center_crop", "size": [20, 20]}], 10, 10, sample_rng(0, 0, 0))


def test_a_crop_size_is_one_int_or_height_and_width_as_the_sidecar_takes_it() -> None:
    """A pipeline written as JSON may give a crop's size as one int (the sidecar's square); the device path draws the
    same box from it as from ``[n, n]``."""
    for op in ("random_resized_crop", "center_crop"):
        square = sample_box([{"op": "decode"}, {"op": op, "size": 32}], 97, 61, sample_rng(7, 0, 3))
        pair = sample_box([{"op": "decode"}, {"op": op, "size": [32, 32]}], 97, 61, sample_rng(7, 0, 3))
        assert square == pair and (square.out_h, square.out_w) == (32, 32)
    with pytest.raises(ValueError, match="size must be an int or \\(height, width\\)"):
        sample_box([{"op": "decode"}, {"op": "center_crop", "size": [1, 2, 3]}], 97, 61, sample_rng(7, 0, 3))


def test_a_batch_draws_what_each_of_its_samples_draws_alone() -> None:
    """``sample_boxes`` advances each sample's generator only by that sample's own draws (a miss drawn again, a
    rejected bounded int, the central-crop fallback), so a sample's box does not depend on its batch."""
    rnd = random.Random(20261128)
    pipelines = [
        [{"op": "decode"}, {"op": "random_resized_crop", "size": 224}, {"op": "hflip"}],
        [{"op": "decode"}, {"op": "random_resized_crop", "size": [64, 48], "scale": [0.99, 1.0],
                            "ratio": [5.0, 9.0]}, {"op": "hflip", "p": 0.3}],  # mostly ten misses: the fallback
        [{"op": "decode"}, {"op": "resize", "size": [300, 200]}, {"op": "center_crop", "size": 101},
         {"op": "hflip", "p": 0.9}],
    ]
    for ops in pipelines:
        for _ in range(20):
            seed, epoch = rnd.randrange(-(2**63), 2**63), rnd.randrange(2**32)
            ids = [rnd.randrange(2**62) for _ in range(rnd.randrange(1, 64))]
            sizes = [(rnd.randrange(101, 2000), rnd.randrange(101, 2000)) for _ in ids]
            batch = sample_boxes(ops, [h for h, _ in sizes], [w for _, w in sizes], sample_rngs(seed, epoch, ids))
            alone = [sample_box(ops, h, w, sample_rng(seed, epoch, i)) for (h, w), i in zip(sizes, ids)]
            assert batch == alone


def test_bounded_ints_of_many_generators_each_follow_their_own_rejections() -> None:
    """Java's ``nextInt(bound)`` draws again when it rejects (about half the time for 2**30 + 1, whose multiples
    leave 2**30 - 1 of the 2**31 draws over): in a batch only the rejected generators draw again."""
    seeds = list(range(-50, 50))
    bound = 2**30 + 1
    together = SplittableRandoms(seeds)
    got = [together.next_int(bound=np.full(len(seeds), bound)).tolist() for _ in range(5)]
    five = SplittableRandoms(seeds)
    for _ in range(5):
        five.next_long()
    assert 0 < int(np.sum(together.seeds != five.seeds)) < len(seeds)  # some drew again, some did not
    alone = [SplittableRandom(s) for s in seeds]
    assert [[r.next_int(bound) for r in alone] for _ in range(5)] == got
    assert together.next_long().tolist() == [r.next_long() for r in alone]  # and stay in step afterwards


def test_a_pair_of_bounded_ints_is_two_draws_in_turn_whatever_either_rejects() -> None:
    """``next_int_pair`` takes two states at once; where the first or the second draw is rejected (about half of the
    draws for 2**30 + 1) it draws again in Java's order: the same answers and states as two ``nextInt(bound)``."""
    seeds = list(range(-100, 100))
    first = np.array([2**30 + 1, 7, 2**30 + 1, 64] * 50)
    second = np.array([2**30 + 1, 2**30 + 1, 5, 64] * 50)
    at = np.arange(len(seeds))
    pair, turn = SplittableRandoms(seeds), SplittableRandoms(seeds)
    for _ in range(4):
        a, b = pair.next_int_pair(at, first, second)
        assert a.tolist() == turn.next_int(at, first).tolist()
        assert b.tolist() == turn.next_int(at, second).tolist()
        assert pair.seeds.tolist() == turn.seeds.tolist()
