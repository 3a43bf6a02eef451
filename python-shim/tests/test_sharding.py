"""``unstall.torch.DistributedSampler`` alone: torch's signature and errors, one job-wide order per epoch that no
world size changes, dealt batch by batch with nothing padded."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch.utils.data as tud

from unstall.torch import DistributedSampler, merge_states


def samplers(n: int, world: int, **kwargs: Any) -> list[DistributedSampler]:
    return [DistributedSampler(range(n), num_replicas=world, rank=r, **kwargs) for r in range(world)]


def by_steps(ss: list[DistributedSampler], chunk: int) -> list[int]:
    """The ranks' samples in the order the job consumes them: step by step, rank by rank within a step."""
    shares = [list(s) for s in ss]
    out: list[int] = []
    for step in range(max(len(x) for x in shares) // chunk + 1):
        for x in shares:
            out.extend(x[step * chunk:(step + 1) * chunk])
    return out


def raised(make: Callable[..., Any], **kwargs: Any) -> tuple[type, str]:
    with pytest.raises(Exception) as info:
        make(range(4), **kwargs)
    return type(info.value), str(info.value)


def test_the_errors_are_torchs() -> None:
    for kwargs in ({}, {"num_replicas": 2}, {"num_replicas": 2, "rank": 2}, {"num_replicas": 2, "rank": -1}):
        assert raised(DistributedSampler, **kwargs) == raised(tud.DistributedSampler, **kwargs), kwargs
    with pytest.raises(ValueError, match="batch_size must be a positive int or None, got 0"):
        DistributedSampler(range(4), 2, 0, batch_size=0)


def test_an_epoch_is_one_permutation_dealt_step_by_step_whatever_the_world_size() -> None:
    n, chunk = 50, 4
    order = DistributedSampler(range(n), 1, 0, seed=7).global_order(3)
    assert sorted(order) == list(range(n)) and order != list(range(n))
    for world in (1, 2, 3, 4, 5):
        ss = samplers(n, world, seed=7, batch_size=chunk)
        for s in ss:
            s.set_epoch(3)
        assert by_steps(ss, chunk) == order, f"{world} ranks consume the one order, a prefix after each step"
        assert sum(len(s) for s in ss) == n, "nothing padded, nothing left out"
        assert max(len(s) for s in ss) - min(len(s) for s in ss) <= chunk


def test_the_order_is_a_function_of_seed_and_epoch() -> None:
    a, b = DistributedSampler(range(30), 2, 1, seed=3), DistributedSampler(range(30), 2, 1, seed=3)
    b.set_epoch(5)
    list(b)
    b.set_epoch(1)
    a.set_epoch(1)
    assert list(a) == list(b), "what ran before does not matter"
    a.set_epoch(2)
    assert list(a) != list(b)
    assert DistributedSampler(range(30), 2, 1, seed=4).global_order(1) != a.global_order(1)


def test_without_shuffle_the_order_is_the_dataset_dealt_like_torchs() -> None:
    ss = samplers(10, 4, shuffle=False)
    assert [list(s) for s in ss] == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]
    torch_ranks = [list(tud.DistributedSampler(range(10), 4, r, shuffle=False)) for r in range(4)]
    assert [x[:2] for x in torch_ranks] == [list(s)[:2] for s in ss], "torch's interleaving, without its padding"
    assert sum(len(x) for x in torch_ranks) == 12, "torch pads 10 samples to 12"


def test_drop_last_gives_every_rank_as_many() -> None:
    ss = samplers(23, 4, seed=1, drop_last=True, batch_size=2)
    got = [list(s) for s in ss]
    assert {len(x) for x in got} == {5} and [len(s) for s in ss] == [5] * 4
    assert len(set().union(*got)) == 20
    assert [len(s) for s in samplers(23, 4, batch_size=2)] == [6, 6, 6, 5]


def test_a_restored_epoch_is_dealt_around_what_was_consumed_then_the_next_is_whole() -> None:
    s = DistributedSampler(range(20), 2, 0, seed=2, batch_size=3)
    s.restore(4, [(0, 12)])
    order = s.global_order(4)
    assert s.epoch == 4 and list(s) == order[12:15] + order[18:19]
    assert s.consumed(4) == [(0, 12)] and s.consumed(5) == []
    s.set_epoch(5)
    assert len(s) == 10 and list(s) == [p for k in (0, 6, 12, 18) for p in s.global_order(5)[k:k + 3]][:10]


def rank_state(world: int, rank: int, yielded: int, **kwargs: Any) -> dict[str, Any]:
    """A rank's state over 50 samples dealt 4 per step, as the loader takes it."""
    state = {"version": 1, "dataset": "d", "epoch": 0, "batches_yielded": yielded, "seed": 0, "order": "global",
             "epoch_size": 50, "consumed": [], "world_size": world, "rank": rank, "chunk": 4, "drop_last": False}
    state.update(kwargs)
    return state


def test_a_loader_dropping_the_incomplete_last_batch_has_consumed_it_once_past_the_full_ones() -> None:
    shares = [s.share() for s in samplers(50, 4, batch_size=4)]  # 13, 13, 12, 12 samples
    assert [(s.num_items, len(s)) for s in shares] == [(13, 4), (13, 4), (12, 3), (12, 3)]
    assert [s.chunks_consumed(3, drop_last=True) for s in shares] == [4, 4, 3, 3], "the dropped batch is consumed"
    assert [s.chunks_consumed(3, drop_last=False) for s in shares] == [3] * 4, "without drop_last it is still due"
    assert shares[0].chunks_consumed(2, drop_last=True) == 2
    ends = [rank_state(4, r, s.chunks_consumed(3, drop_last=True)) for r, s in enumerate(shares)]
    assert merge_states(ends)["consumed"] == [[0, 50]]


def test_once_every_rank_is_past_its_share_the_job_state_is_the_epochs_end() -> None:
    dropped = [len(s) for s in samplers(50, 4, batch_size=4, drop_last=True)]
    assert dropped == [12] * 4, "drop_last leaves 2 of 50 samples out"
    assert merge_states([rank_state(4, r, 3, drop_last=True) for r in range(4)])["consumed"] == [[0, 50]], (
        "the 2 samples left out are not delivered in the epoch after a restore either")
    assert merge_states([rank_state(4, r, 2, drop_last=True) for r in range(4)])["consumed"] == [[0, 32]]
    assert merge_states([rank_state(4, r, 3 - (r == 3), drop_last=True) for r in range(4)])["consumed"] == [
        [0, 44]], "a rank behind: the epoch goes on"
