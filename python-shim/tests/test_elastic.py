"""The job-wide order's bookkeeping (``unstall.elastic``) alone: shares, merges and restores on other world sizes
deliver every position of an epoch exactly once, whatever the interruptions."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from unstall.elastic import Remaining, Share, merge_states, normalize, restore
from unstall.state import STATE_VERSION


def rank_state(consumed: list[list[int]], size: int, world: int, rank: int, chunk: int, k: int,
               **extra: Any) -> dict[str, Any]:
    return {"version": STATE_VERSION, "dataset": "d", "seed": 1, "epoch": 0, "epoch_size": size, "consumed": consumed,
            "world_size": world, "rank": rank, "chunk": chunk, "batches_yielded": k, **extra}


def shares(size: int, consumed: Any, world: int, chunk: int, drop_last: bool = False) -> list[Share]:
    remaining = Remaining(size, consumed)
    return [Share(remaining, world, r, chunk, drop_last) for r in range(world)]


def test_normalize_merges_and_names_bad_ranges() -> None:
    assert normalize([[5, 7], [0, 2], [2, 3], [6, 9]]) == [(0, 3), (5, 9)]
    with pytest.raises(ValueError, match=r"range \[4, 4\)"):
        normalize([[4, 4]])
    with pytest.raises(ValueError, match=r"within \[0, 10\)"):
        normalize([[8, 11]], 10)
    with pytest.raises(ValueError, match="pairs of ints"):
        normalize([[1, 2, 3]])


def test_remaining_maps_indices_to_positions_around_the_consumed() -> None:
    rem = Remaining(20, [(2, 5), (10, 12)])
    assert len(rem) == 15
    flat = [p for a, b in rem.ranges(0, 15) for p in range(a, b)]
    assert flat == [p for p in range(20) if not (2 <= p < 5 or 10 <= p < 12)]
    assert rem.ranges(1, 4) == [(1, 2), (5, 7)]


@pytest.mark.parametrize("size,world,chunk,drop_last", [(23, 4, 2, False), (23, 4, 2, True), (3, 4, 5, False),
                                                       (64, 4, 4, False), (1, 1, 1, False), (0, 3, 2, False)])
def test_one_epoch_dealt_to_ranks_is_every_position_once(size: int, world: int, chunk: int, drop_last: bool) -> None:
    ss = shares(size, [], world, chunk, drop_last)
    got = sorted(p for s in ss for p in s.positions())
    if drop_last:
        assert len(got) == size - (size % (world * chunk)) % world
        assert len({s.num_items for s in ss}) == 1, "drop_last: every rank gets as many"
    else:
        assert got == list(range(size))
    assert all(len(list(s.positions())) == s.num_items for s in ss)
    assert max(len(s) for s in ss) - min(len(s) for s in ss) <= 1
    for s in ss:
        assert all(b - a <= chunk for a, b in (s.chunk_range(k) for k in range(len(s))))


def test_shares_deal_the_golden_fixture_s_batches(fixtures_dir: Path) -> None:
    """protocol/fixtures/share-v1.json, which the sidecar's RankShare also gives (its chunk 1 cases)."""
    cases = json.loads((fixtures_dir / "share-v1.json").read_text())["cases"]
    assert len(cases) > 100 and any(c["consumed"] and c["skip"] for c in cases)
    for c in cases:
        share = Share(Remaining(c["epoch_size"], c["consumed"]), c["world_size"], c["rank"], c["chunk"],
                      c["drop_last"])
        batches = [[p for a, b in share.remaining.ranges(*share.chunk_range(k)) for p in range(a, b)]
                   for k in range(c["skip"], len(share))]
        assert batches == c["batches"], c
        assert list(share.positions(c["skip"])) == [p for batch in batches for p in batch], c


def test_equal_steps_on_every_rank_consume_a_prefix() -> None:
    ss = shares(100, [], 4, 3)
    job = merge_states([rank_state([], 100, 4, r, 3, 5) for r in range(4)])
    assert job["kind"] == "job" and job["consumed"] == [[0, 60]]
    assert [p for p in ss[0].positions()][:3] == [0, 1, 2]


def test_restores_on_other_world_sizes_and_chunks_deliver_the_rest_exactly_once() -> None:
    rng = random.Random(5)
    for _ in range(300):
        size = rng.randint(0, 200)
        delivered: list[int] = []
        consumed: list[list[int]] = []
        world, chunk = rng.randint(1, 5), rng.randint(1, 9)
        for _interruption in range(rng.randint(1, 3)):
            ss = shares(size, consumed, world, chunk)
            steps = rng.randint(0, max(len(s) for s in ss) if ss else 0)
            ks = [min(len(s), max(0, steps - rng.randint(0, 1))) for s in ss]  # a rank may be one batch behind
            for s, k in zip(ss, ks):
                delivered.extend(p for c in range(k) for a, b in s.remaining.ranges(*s.chunk_range(c))
                                 for p in range(a, b))
            job = merge_states([rank_state(consumed, size, world, r, chunk, k) for r, k in enumerate(ks)])
            consumed = job["consumed"]
            world, chunk = rng.randint(1, 5), rng.randint(1, 9)
            for r in range(world):
                assert restore(job, world=world, rank=r, chunk=chunk, what="t").skip == 0
        ss = shares(size, consumed, world, chunk)
        delivered.extend(p for s in ss for p in s.positions())
        assert sorted(delivered) == list(range(size)), "every position once over interruptions and restores"


def test_a_rank_state_restores_as_it_is_on_the_same_world_and_chunk_only() -> None:
    s = rank_state([[0, 8]], 50, 4, 2, 2, 3)
    r = restore(s, world=4, rank=2, chunk=2, what="DataLoader")
    assert (r.epoch, r.consumed, r.skip) == (0, ((0, 8),), 3)
    with pytest.raises(ValueError, match=r"world_size 4 \(now 2\).*merge the states of all 4 ranks"):
        restore(s, world=2, rank=0, chunk=2, what="DataLoader")
    with pytest.raises(ValueError, match=r"chunk 2 \(now 3\)"):
        restore(s, world=4, rank=2, chunk=3, what="DataLoader")


def test_merge_refuses_states_that_do_not_belong_together() -> None:
    ok = [rank_state([], 40, 2, r, 2, 1) for r in range(2)]
    with pytest.raises(ValueError, match="'seed' is 1 in the first and 2 in state 1"):
        merge_states([ok[0], dict(ok[1], seed=2)])
    with pytest.raises(ValueError, match="'dataset' is 'd' in the first and 'e'"):
        merge_states([ok[0], dict(ok[1], dataset="e")])
    with pytest.raises(ValueError, match="'consumed'"):
        merge_states([ok[0], dict(ok[1], consumed=[[0, 4]])])
    with pytest.raises(ValueError, match=r"missing rank \[1\]"):
        merge_states([ok[0]])
    with pytest.raises(ValueError, match=r"rank \[0\] given more than once"):
        merge_states([ok[0], ok[0]])
    with pytest.raises(ValueError, match="already merged"):
        merge_states([merge_states(ok)])
    with pytest.raises(ValueError, match="no 'epoch_size'"):
        merge_states([{k: v for k, v in ok[0].items() if k != "epoch_size"}])


def test_an_epoch_consumed_whole_restores_as_its_end() -> None:
    ss = shares(10, [], 2, 3)
    job = merge_states([rank_state([], 10, 2, r, 3, len(s)) for r, s in enumerate(ss)])
    assert job["consumed"] == [[0, 10]]
    assert all(len(s) == 0 for s in shares(10, job["consumed"], 3, 2)), "nothing left: the next for yields nothing"


def test_a_rank_past_its_for_merges_as_the_end_of_the_epoch_the_others_are_in() -> None:
    ss = shares(10, [], 2, 3)
    behind = rank_state([], 10, 2, 0, 3, len(ss[0]) - 1)
    after_for = dict(rank_state([], 10, 2, 1, 3, 0), epoch=1)  # torchdata: once the for is over, the next epoch
    job = merge_states([behind, after_for])
    assert job["epoch"] == 0
    missing = set(range(10)) - {p for a, b in job["consumed"] for p in range(a, b)}
    assert missing == set(range(*ss[0].chunk_range(len(ss[0]) - 1))), "only rank 0's last batch is left"
    with pytest.raises(ValueError, match="'epoch' is 0 in the first and 2"):
        merge_states([behind, dict(after_for, epoch=2)])
