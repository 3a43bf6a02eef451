"""``unstall.mixture.schedule`` alone: which source each position of a mixture's epoch draws from."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pytest

from unstall.mixture import schedule

WEIGHTS = [
    (0.5, 0.3, 0.2),
    (1, 1, 1),
    (0.7, 0.2, 0.1),
    (3, 2, 2, 1, 1, 1),
    (1, 1e-3),
    (0.5, *[0.5 / 50] * 50),  # one heavy source and many light ones that all fall due together
    tuple(np.random.default_rng(1).random(20)),
    tuple(np.random.default_rng(2).random(200)),  # more sources than an int8 holds
]


def prefix_lag(sources: np.ndarray, weights: Sequence[float]) -> float:
    """The largest |count of source i among the first m positions - m * w_i| over every m and i."""
    w = np.asarray(weights, dtype=np.float64) / np.sum(weights)
    m = np.arange(1, len(sources) + 1)
    return max(float(np.abs(np.cumsum(sources == i) - m * w[i]).max()) for i in range(len(w)))


@pytest.mark.parametrize("weights", WEIGHTS, ids=lambda w: f"{len(w)}-sources")
def test_every_prefix_holds_each_share_within_one_draw(weights: Sequence[float]) -> None:
    sources = schedule(weights, 5000)
    assert set(np.unique(sources)) <= set(range(len(weights)))
    assert prefix_lag(sources, weights) < 1 + 1e-9


def test_a_function_of_the_normalised_weights_alone() -> None:
    a = schedule((0.5, 0.3, 0.2), 997)
    assert np.array_equal(a, schedule((5, 3, 2), 997))
    assert np.array_equal(a[:100], schedule((0.5, 0.3, 0.2), 100)), "a shorter epoch is a prefix of a longer one"
    assert not np.array_equal(a, schedule((0.2, 0.3, 0.5), 997))


def test_equal_weights_take_turns_in_source_order() -> None:
    assert schedule((1, 1, 1), 7).tolist() == [0, 1, 2, 0, 1, 2, 0]
