"""Data-parallel ranks in a prep group, with a real sidecar: each rank (its own member, explicit ``rank`` and
``world_size``; the ranks run as loaders of one process, read in step) reads its share of every epoch, the group
prepares each batch once, and the states of 4 ranks interrupted mid-epoch, merged, restore on 2 and on 3 ranks."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from test_prep_support import N_SAMPLES, PIPELINE_NCHW, PrepEnv, digest, start_env

from unstall import prep  # noqa: E402  (after test_prep_support put this checkout's shim first)
from unstall.elastic import merge_states  # noqa: E402

BATCH = 4
NUM_BATCHES = -(-N_SAMPLES // BATCH)  # 10: the last one partial
EPOCHS = 2
SEED = 5

Batch = tuple[list[int], str]  # a batch's sample ids and its images' digest
Read = list[list[Batch]]  # per rank, the batches it was handed


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrepEnv]:
    yield from start_env(tmp_path_factory.mktemp("prep-ranks"))


def loaders(env: PrepEnv, world: int, transport: str) -> list[prep.PrepLoader]:
    # window 8 >= world: the ranks of this one process read in turn, so each one's next batch lies within the window
    out = [prep.PrepLoader("imgs", PIPELINE_NCHW, batch_size=BATCH, seed=SEED, with_ids=True, rank=r,
                           world_size=world, group_size=world, epochs=EPOCHS, window=8, client=env.client(),
                           transport=transport) for r in range(world)]
    for loader in out:
        loader.membership  # noqa: B018  (every rank joins before any reads: the group starts with all of them)
    return out


def read(its: list[Iterator[Any]], steps: list[int]) -> Read:
    """Step by step, each rank its next batch, rank ``r`` for ``steps[r]`` steps (or until its share ends)."""
    out: Read = [[] for _ in its]
    for step in range(max(steps)):
        for r, it in enumerate(its):
            if step < steps[r]:
                batch = next(it, None)
                if batch is not None:
                    images, _, ids = batch
                    out[r].append(([int(i) for i in ids], digest(images.numpy())))
    return out


def ids(read: Read) -> list[int]:
    return sorted(i for rank in read for batch_ids, _ in rank for i in batch_ids)


def epoch(ls: list[prep.PrepLoader]) -> Read:
    return read([iter(loader) for loader in ls], [NUM_BATCHES] * len(ls))


@pytest.mark.parametrize("transport", ["shm", "flight"])
def test_four_ranks_interrupted_mid_epoch_restore_on_two_and_three(env: PrepEnv, transport: str) -> None:
    whole = {}
    for world in (2, 3):  # uninterrupted runs: each rank its share, every batch prepared and served once
        ls = loaders(env, world, transport)
        whole[world] = [epoch(ls) for _ in range(EPOCHS)]
        group = ls[0].membership.group
        for e in range(EPOCHS):
            assert ids(whole[world][e]) == list(range(N_SAMPLES)), f"{world} ranks, epoch {e}: every sample once"
        s = env.group_stats(group)
        assert s["batches_prepared_per_epoch"] == {str(e): NUM_BATCHES for e in range(EPOCHS)}
        assert s["batches_served"] == EPOCHS * NUM_BATCHES, "each batch read by the one rank whose it is"
        assert s["state"] == "closed" and s["members"] == [], "every rank finished after its own last batch"

    four = loaders(env, 4, transport)
    its = [iter(loader) for loader in four]
    before = read(its, [2, 2, 1, 2])  # rank 2 a step behind: batch 6, its second, is not read
    states = [loader.state_dict() for loader in four]
    assert [s["batches_yielded"] for s in states] == [2, 2, 1, 2]
    assert all(s["world_size"] == 4 and s["epoch_size"] == NUM_BATCHES and s["consumed"] == [] for s in states)
    for loader in four:
        loader.close()
    job = merge_states(states, what="PrepLoader")
    assert job["consumed"] == [[0, 6], [7, 8]] and job["kind"] == "job"

    for world in (2, 3):
        restored = [prep.PrepLoader("imgs", PIPELINE_NCHW, batch_size=BATCH, seed=SEED, with_ids=True, rank=r,
                                    world_size=world, group_size=world, epochs=EPOCHS, window=8,
                                    client=env.client(), transport=transport) for r in range(world)]
        for loader in restored:
            loader.load_state_dict(job)  # joins the group at the first batch its share still needs
        rest = epoch(restored)
        assert sorted(ids(before) + ids(rest)) == list(range(N_SAMPLES)), \
            f"on {world} ranks: every sample of the interrupted epoch once over both runs"
        assert [s["batches_yielded"] for s in (loader.state_dict() for loader in restored)] == [len(r) for r in rest]
        assert epoch(restored) == whole[world][1], f"the next epoch is an uninterrupted {world}-rank run's"
        s = env.group_stats(restored[0].membership.group)
        # positions from the first one a restored rank needs (batch 6) are prepared once; nothing before it
        assert s["batches_prepared_per_epoch"] == {"0": NUM_BATCHES - 6, "1": NUM_BATCHES}
        assert s["batches_served"] == 3 + NUM_BATCHES
        assert s["state"] == "closed" and s["members"] == []


def test_a_state_after_the_last_batch_restores_as_the_end_of_its_epoch(env: PrepEnv) -> None:
    two = loaders(env, 2, "flight")
    first = epoch(two)
    job = merge_states([loader.state_dict() for loader in two], what="PrepLoader")
    assert job["epoch"] == 0 and job["consumed"] == [[0, NUM_BATCHES]]
    for loader in two:
        loader.close()
    three = [prep.PrepLoader("imgs", PIPELINE_NCHW, batch_size=BATCH, seed=SEED, with_ids=True, rank=r,
                             world_size=3, group_size=3, epochs=EPOCHS, window=8, client=env.client(),
                             transport="flight") for r in range(3)]
    for loader in three:
        loader.load_state_dict(job)
    assert epoch(three) == [[], [], []], "the end of epoch 0: the first for yields nothing"
    assert ids(epoch(three)) == list(range(N_SAMPLES)), "then epoch 1"
    assert ids(first) == list(range(N_SAMPLES))
    with pytest.raises(ValueError, match="taken with batch_size 4; this loader has 8"):
        prep.PrepLoader("imgs", PIPELINE_NCHW, batch_size=8, seed=SEED, rank=0, world_size=2,
                        client=env.client()).load_state_dict(job)


def test_ranks_of_python_side_transforms_each_make_and_read_their_own_batches(env: PrepEnv) -> None:
    from torchvision import transforms

    tf = transforms.Compose([transforms.Resize((16, 16)), transforms.ToTensor()])
    ranks = [prep.SharedTransformLoader("imgs", tf, fingerprint="ranks-resize16", batch_size=BATCH, seed=SEED,
                                        with_ids=True, rank=r, world_size=3, group_size=3, epochs=1,
                                        client=env.client()) for r in range(3)]
    for loader in ranks:
        loader.membership  # noqa: B018  (all join before any reads)
    got = epoch(ranks)
    assert ids(got) == list(range(N_SAMPLES))
    assert [len(r) for r in got] == [4, 3, 3] and [loader.made for loader in ranks] == [4, 3, 3]
    s = env.group_stats(ranks[0].membership.group)
    assert s["batches_prepared_per_epoch"] == {"0": NUM_BATCHES} and s["batches_served"] == NUM_BATCHES
    assert s["state"] == "closed"
