"""Elastic restore across processes: 4 ranks (real torch.distributed, gloo) read an epoch through
``unstall.torch.DataLoader`` over its default job-wide order and are interrupted mid-epoch (in one case a rank is a
batch behind); ``merge_states`` of their 4 states is restored on 2 and on 3 ranks, with the batch size kept and
changed. Over the interrupted epoch every sample is delivered exactly once, and the next epoch equals an
uninterrupted run's on the new world size. A ``Mixture`` of two datasets (weights 0.7/0.3) read the same way deals
each rank contiguous windows of its schedule, so every batch holds the proportions within one sample at its
boundaries, and resumes as exactly. States of another job are refused, naming what differs.

The ranks (``elastic_rank.py``) attach to one sidecar; each launch runs several scenarios in the same processes.
In-process loaders, one per rank, check ``drop_last`` and a ``BatchSampler`` over the job-wide order.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch.utils.data as tud

import unstall
from elastic_rank import keep, sample_id
from ranks import rank_env, run_ranks
from waits import send_signal
from unstall.torch import DataLoader, Dataset, DistributedSampler, Mixture, merge_states

N = 50  # not a multiple of a step (4 ranks x 4): the last step is split, two ranks get a batch more
WORLD = 4
BATCH = 4
SEED = 11
NAME = "elastic"

MIX = (("elastic-mix-a", 35, 0.7), ("elastic-mix-b", 15, 0.3))  # (name, samples, weight): 50 draws, each sample once
TAG = 1000  # the id of source k's sample i is k * TAG + i

Runs = dict[str, list[dict[str, Any]]]  # run name -> per rank, its loops (epoch, ids, sizes, state)


@pytest.fixture(scope="module")
def dataset(sidecar: unstall.Sidecar, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """N files in an image-folder layout; each one's bytes are its id (its index in the folder's order)."""
    root = tmp_path_factory.mktemp("elastic") / "data"
    for i in range(N):
        p = root / f"class{i * 2 // N}" / f"{i:03d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"%d" % i)
    sidecar.register_dataset(NAME, root)
    return root


@pytest.fixture(scope="module")
def mixture(sidecar: unstall.Sidecar, tmp_path_factory: pytest.TempPathFactory) -> Mixture:
    """The ranks' mixture, as this process sees it: two image-folder datasets whose files' bytes are their ids."""
    for k, (name, n, _) in enumerate(MIX):
        root = tmp_path_factory.mktemp(name) / "data"
        for i in range(n):
            p = root / "class0" / f"{i:03d}.jpg"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(b"%d" % (k * TAG + i))
        sidecar.register_dataset(name, root)
    return Mixture([(Dataset(name, sidecar=sidecar, loader=sample_id), w) for name, _, w in MIX])


def launch(sidecar: unstall.Sidecar, tmp: Path, world: int, runs: list[dict[str, Any]]) -> Runs:
    out = tmp / "out"
    out.mkdir(parents=True)
    run_ranks("elastic_rank.py", [{"rank": r, "world": world, "rendezvous": str(tmp / "rendezvous"), "out": str(out),
                                   "dataset": NAME, "mixture": [[name, w] for name, _, w in MIX], "seed": SEED,
                                   "runs": runs} for r in range(world)],
              rank_env(UNSTALL_HOME=str(sidecar.home), UNSTALL_EPOCH_LOG="0"), tmp)
    return {run["name"]: [json.loads((out / f"{run['name']}-rank{r}.json").read_text()) for r in range(world)]
            for run in runs}


def ids(ranks: list[list[dict[str, Any]]], loop: int) -> Counter[int]:
    return Counter(i for loops in ranks for i in loops[loop]["ids"])


def states(ranks: list[list[dict[str, Any]]], loop: int) -> list[dict[str, Any]]:
    return [loops[loop]["state"] for loops in ranks]


EVERY = Counter(range(N))
EVERY_MIX = Counter(k * TAG + i for k, (_, n, _) in enumerate(MIX) for i in range(n))


def mixture_batches(m: Mixture, ranks: list[list[dict[str, Any]]], loop: int) -> list[list[int]]:
    """Every batch the ranks were handed in loop ``loop``, as the positions of the mixture's epoch they read (each
    sample is drawn once per epoch, so its position is known; one that is not the mixture's draw fails here)."""
    out = []
    for loops in ranks:
        lp = loops[loop]
        source, sample = m.draws(range(len(m)), lp["epoch"])
        where = {int(s) * TAG + int(i): p for p, (s, i) in enumerate(zip(source, sample))}
        assert len(where) == len(m) and set(lp["ids"]) <= set(where), f"epoch {lp['epoch']}: not the mixture's draws"
        at = 0
        for size in lp["sizes"]:
            out.append([where[i] for i in lp["ids"][at:at + size]])
            at += size
    return out


def windows(batch: list[int]) -> list[tuple[int, int]]:
    """``batch``'s positions as contiguous windows ``[a, b)`` of the schedule, in order."""
    out: list[tuple[int, int]] = []
    for p in batch:
        if out and out[-1][1] == p:
            out[-1] = (out[-1][0], p + 1)
        else:
            out.append((p, p + 1))
    return out


def check_proportions(m: Mixture, batches: list[list[int]], label: str, contiguous: bool) -> None:
    """Each batch is dealt in windows of the schedule (one when nothing was consumed around it), at whose boundaries
    the draws so far hold every source's share within one sample."""
    source = m.draws(range(len(m)), 0)[0]  # the schedule: the same every epoch
    before = np.vstack([np.zeros(len(MIX), int), np.cumsum(np.eye(len(MIX), dtype=int)[source], axis=0)])
    share = np.outer(np.arange(len(m) + 1), m.weights)
    for batch in batches:
        ws = windows(batch)
        assert not contiguous or len(ws) == 1, f"{label}: batch {batch} is not one window of the schedule"
        for a, b in ws:
            for end in (a, b):
                assert np.all(np.abs(before[end] - share[end]) < 1), (
                    f"{label}: after {end} draws the sources' counts {before[end]} are not within one of {share[end]}")


@pytest.fixture(scope="module")
def four(sidecar: unstall.Sidecar, dataset: Path, mixture: Mixture, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """One launch of 4 ranks: an uninterrupted run of 2 epochs, two interruptions after 2 batches (rank 2 after 1,
    with a worker), and a restore of that one from each rank's own state; over the mixture, an uninterrupted run and
    an interruption with the ranks 1 to 3 steps in (with a worker)."""
    return launch(sidecar, tmp_path_factory.mktemp("four"), WORLD, [
        {"name": "whole", "batch_size": BATCH, "loops": [None, None]},
        {"name": "even", "batch_size": BATCH, "loops": [2]},
        {"name": "behind", "batch_size": BATCH, "loops": [[2, 2, 1, 2]], "num_workers": 1},
        {"name": "resumed", "batch_size": BATCH, "load": {"run": "behind"}, "loops": [None, None]},
        {"name": "mix-whole", "batch_size": BATCH, "mixture": True, "loops": [None, None]},
        {"name": "mix-behind", "batch_size": BATCH, "mixture": True, "loops": [[3, 1, 2, 2]], "num_workers": 1},
    ])


@pytest.fixture(scope="module")
def jobs(four: Runs, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The 4 ranks' states merged into job states, saved as a checkpoint would be."""
    folder = tmp_path_factory.mktemp("jobs")
    out = {}
    for name, run, loop in (("even", "even", 0), ("behind", "behind", 0), ("end", "whole", 0),
                            ("mix-behind", "mix-behind", 0)):
        out[name] = folder / f"{name}.json"
        out[name].write_text(json.dumps(merge_states(states(four[run], loop))))
    return out


def test_four_ranks_deal_one_order_and_their_states_merge(four: Runs, jobs: dict[str, Path]) -> None:
    whole = four["whole"]
    assert [[lp["epoch"] for lp in loops] for loops in whole] == [[0, 1]] * WORLD
    assert ids(whole, 0) == EVERY and ids(whole, 1) == EVERY, "every sample once per epoch, none padded"
    assert [len(loops[0]["ids"]) for loops in whole] == [13, 13, 12, 12]
    order = DistributedSampler(range(N), 1, 0, seed=SEED).global_order(0)
    steps = [i for s in range(4) for loops in whole for i in loops[0]["ids"][s * BATCH:(s + 1) * BATCH]]
    assert steps == order, "step by step, rank by rank, the job consumes epoch 0's global order"
    for r, loops in enumerate(whole):
        assert four["even"][r][0]["ids"] == loops[0]["ids"][:2 * BATCH]
        k = 1 if r == 2 else 2
        assert four["behind"][r][0]["ids"] == loops[0]["ids"][:k * BATCH], "a worker's prefetch is not consumed"
        resumed = four["resumed"][r]
        assert four["behind"][r][0]["ids"] + resumed[0]["ids"] == loops[0]["ids"], "a rank's own state continues it"
        assert resumed[1] == loops[1], "and the next epoch is the same"
    end = states(whole, 0)
    assert [(s["epoch"], s["batches_yielded"]) for s in end] == [(0, 4), (0, 4), (0, 3), (0, 3)], "each share's end"
    assert states(four["behind"], 0)[2] == {
        "version": 1, "dataset": NAME, "epoch": 0, "batches_yielded": 1, "seed": SEED, "order": "global",
        "epoch_size": N, "consumed": [], "world_size": WORLD, "rank": 2, "chunk": BATCH, "drop_last": False}
    merged = {name: json.loads(path.read_text()) for name, path in jobs.items()}
    assert merged["even"]["consumed"] == [[0, 32]], "2 steps of 4 ranks x 4: a prefix"
    assert merged["behind"]["consumed"] == [[0, 24], [28, 32]], "rank 2's second batch was not consumed"
    assert merged["end"]["consumed"] == [[0, N]] and merged["end"]["kind"] == "job"


def test_four_ranks_read_a_mixture_in_windows_of_its_schedule(four: Runs, jobs: dict[str, Path],
                                                                mixture: Mixture) -> None:
    whole = four["mix-whole"]
    assert [[lp["epoch"] for lp in loops] for loops in whole] == [[0, 1]] * WORLD
    assert ids(whole, 0) == EVERY_MIX and ids(whole, 1) == EVERY_MIX, "each source's samples once per epoch"
    for loop in (0, 1):
        check_proportions(mixture, mixture_batches(mixture, whole, loop), f"4 ranks, epoch {loop}", contiguous=True)
    for r, k in enumerate([3, 1, 2, 2]):
        assert four["mix-behind"][r][0]["ids"] == whole[r][0]["ids"][:k * BATCH], "a worker's prefetch is not consumed"
    assert merge_states(states(whole, 0))["consumed"] == [[0, N]]
    assert json.loads(jobs["mix-behind"].read_text())["consumed"] == [[0, 20], [24, 36]], (
        "rank 1's second and third batches were not consumed")


@pytest.mark.parametrize("world,batch", [(2, 3), (3, 5)])
def test_a_four_rank_job_restores_on_fewer_ranks_and_another_batch_size(
        sidecar: unstall.Sidecar, four: Runs, jobs: dict[str, Path], mixture: Mixture, tmp_path: Path, world: int,
        batch: int) -> None:
    got = launch(sidecar, tmp_path, world, [
        {"name": f"whole-{BATCH}", "batch_size": BATCH, "loops": [None, None]},
        {"name": f"whole-{batch}", "batch_size": batch, "loops": [None, None]},
        *({"name": f"{job}-{b}", "batch_size": b, "load": str(jobs[job]), "loops": [None, None]}
          for job in ("even", "behind", "end") for b in (BATCH, batch)),
        *({"name": f"mix-whole-{b}", "batch_size": b, "mixture": True, "loops": [None, None]} for b in (BATCH, batch)),
        *({"name": f"mix-behind-{b}", "batch_size": b, "mixture": True, "load": str(jobs["mix-behind"]),
           "loops": [None, None]} for b in (BATCH, batch)),
    ])
    for b in (BATCH, batch):
        whole, restored = got[f"mix-whole-{b}"], got[f"mix-behind-{b}"]
        label = f"{WORLD} ranks' mixture state on {world} ranks, batch size {b}"
        for loop in (0, 1):
            check_proportions(mixture, mixture_batches(mixture, whole, loop), f"{world} ranks, batch size {b}",
                              contiguous=True)
        assert [[lp["epoch"] for lp in loops] for loops in restored] == [[0, 1]] * world, label
        assert ids(four["mix-behind"], 0) + ids(restored, 0) == ids(four["mix-whole"], 0) == EVERY_MIX, (
            f"{label}: the epoch's draws, each exactly once, as an uninterrupted run's")
        check_proportions(mixture, mixture_batches(mixture, restored, 0), label, contiguous=False)
        assert [loops[1] for loops in restored] == [loops[1] for loops in whole], (
            f"{label}: the next epoch is an uninterrupted {world}-rank run's")
    for b in (BATCH, batch):
        assert ids(got[f"whole-{b}"], 0) == EVERY
        for job, source in (("even", "even"), ("behind", "behind"), ("end", "whole")):
            restored = got[f"{job}-{b}"]
            label = f"{WORLD} ranks' {job!r} state on {world} ranks, batch size {b}"
            assert [[lp["epoch"] for lp in loops] for loops in restored] == [[0, 1]] * world, label
            assert ids(four[source], 0) + ids(restored, 0) == EVERY, f"{label}: every sample of the epoch exactly once"
            merged = merge_states(states(restored, 0))
            if job == "end":  # nothing was left: each rank's for was empty, and over (torchdata: the next epoch)
                assert (merged["epoch"], merged["consumed"]) == (1, []), f"{label}: the next epoch's start"
            else:
                assert (merged["epoch"], merged["consumed"]) == (0, [[0, N]]), f"{label}: the epoch's end, job-wide"
            assert [loops[1] for loops in restored] == [loops[1] for loops in got[f"whole-{b}"]], (
                f"{label}: the next epoch is an uninterrupted {world}-rank run's")
        assert all(loops[0]["ids"] == [] for loops in got[f"end-{b}"]), "a state at the epoch's end: nothing left"
    assert [lp[1]["ids"] for lp in got[f"whole-{BATCH}"]] != [lp[1]["ids"] for lp in got[f"whole-{batch}"]]


def refused(make: Callable[[], DataLoader], state: dict[str, Any]) -> str:
    with pytest.raises(ValueError) as info:
        make().load_state_dict(state)
    return str(info.value)


def test_states_of_another_job_are_refused_naming_what_differs(sidecar: unstall.Sidecar, dataset: Path,
                                                               four: Runs, jobs: dict[str, Path]) -> None:
    sidecar.register_dataset(f"{NAME}-other", dataset)
    ours, other = (Dataset(n, sidecar=sidecar, loader=sample_id) for n in (NAME, f"{NAME}-other"))

    def ranked(ds: Dataset = ours, seed: int = SEED, world: int = 2) -> DataLoader:
        return DataLoader(ds, batch_size=BATCH, collate_fn=keep, sampler=DistributedSampler(ds, world, 0, seed=seed))

    job = json.loads(jobs["behind"].read_text())
    rank = states(four["behind"], 0)[0]
    assert "seed 11; this loader's order has seed 12" in refused(lambda: ranked(seed=SEED + 1), job)
    assert "dataset 'elastic'; this one reads 'elastic-other'" in refused(lambda: ranked(other), job)
    assert "epoch_size of 49 samples; dataset 'elastic' has 50" in refused(ranked, dict(job, epoch_size=N - 1))
    assert "order is 'global'" in refused(lambda: DataLoader(ours, batch_size=BATCH, shuffle=True, seed=SEED), job)
    assert "order is 'seed'; this one deals a job-wide order" in refused(ranked, DataLoader(
        ours, batch_size=BATCH, shuffle=True, seed=SEED).state_dict())
    assert "world_size 4 (now 2)" in refused(ranked, rank), "a rank's own state needs its world size: merge first"
    for ds, seed, differs in ((ours, SEED + 1, "'seed' is 11 in the first and 12"),
                              (other, SEED, "'dataset' is 'elastic' in the first and 'elastic-other'")):
        stranger = DataLoader(ds, batch_size=BATCH, collate_fn=keep, sampler=DistributedSampler(ds, WORLD, 1, seed=seed))
        next(iter(stranger))
        with pytest.raises(ValueError, match=differs):
            merge_states([rank, stranger.state_dict(), *states(four["behind"], 0)[2:]])
    with pytest.raises(ValueError, match="deals batch_size=3 per step but the DataLoader batches 4"):
        DataLoader(ours, batch_size=BATCH, sampler=DistributedSampler(ours, 2, 0, batch_size=3))
    with pytest.raises(ValueError, match="seed 12 differs from its DistributedSampler's seed 11"):
        DataLoader(ours, batch_size=BATCH, seed=SEED + 1, sampler=DistributedSampler(ours, 2, 0, seed=SEED))
    loader = ranked(world=WORLD)  # a sampler without batch_size deals the loader's
    loader.load_state_dict(rank)  # rank 0's own state, same world size and batch size: taken as it is
    assert loader.state_dict() == rank


def read(loader: DataLoader) -> list[int]:
    return [i for batch in loader for i, _ in batch]


def read_to_end(loader: DataLoader) -> tuple[list[int], dict[str, Any]]:
    """A whole ``for``, and the state taken in it after its last batch (torchdata: the epoch's end)."""
    got, state = [], loader.state_dict()
    for batch in loader:
        got.extend(i for i, _ in batch)
        state = loader.state_dict()
    return got, state


@pytest.mark.parametrize("dropping", ["loader", "sampler"])
def test_a_state_after_the_last_batch_drop_last_kept_is_the_epochs_end(sidecar: unstall.Sidecar, dataset: Path,
                                                                      dropping: str) -> None:
    """torch's drop_last: the loader drops a rank's incomplete last batch, the sampler the samples that would leave
    the ranks uneven; either way they are not delivered in that epoch, also not after a restore at its end."""
    ds = Dataset(NAME, sidecar=sidecar, loader=sample_id)

    def ranks(world: int) -> list[DataLoader]:
        return [DataLoader(ds, batch_size=BATCH, collate_fn=keep, drop_last=dropping == "loader",
                           sampler=DistributedSampler(ds, world, r, seed=SEED, drop_last=dropping == "sampler"))
                for r in range(world)]

    probe = ranks(WORLD)[0]
    it = iter(probe)
    next(it), next(it)
    assert probe.state_dict()["batches_yielded"] == 2, "mid-epoch, the batches handed out"
    four = ranks(WORLD)
    delivered, ends = map(list, zip(*(read_to_end(loader) for loader in four)))
    assert [len(x) for x in delivered] == [12] * WORLD and len(set().union(*delivered)) == 48
    after = merge_states([loader.state_dict() for loader in four])
    assert (after["epoch"], after["consumed"]) == (1, []), "taken once the for is over: the next epoch's start"
    job = merge_states(ends)
    assert job["consumed"] == [[0, N]], "the epoch's end: the 2 samples drop_last left out are not delivered in it"
    own = ranks(WORLD)[0]
    own.load_state_dict(ends[0])
    assert read(own) == [], "a rank's own state at the end: nothing left"
    three, fresh = ranks(3), ranks(3)
    for loader in three:
        loader.load_state_dict(job)
    assert [read(loader) for loader in three] == [[]] * 3, "the job state at the end: nothing left on 3 ranks"
    for loader in fresh:
        loader.set_epoch(1)
    assert [read(loader) for loader in three] == [read(loader) for loader in fresh], (
        "the next epoch is an uninterrupted 3-rank run's")


def test_a_batch_sampler_over_the_job_wide_order_is_elastic(sidecar: unstall.Sidecar, dataset: Path) -> None:
    ds = Dataset(NAME, sidecar=sidecar, loader=sample_id)

    def batched(world: int, rank: int, batch: int) -> DataLoader:
        sampler = DistributedSampler(ds, world, rank, seed=SEED)
        return DataLoader(ds, collate_fn=keep, batch_sampler=tud.BatchSampler(sampler, batch, drop_last=False))

    four = [batched(WORLD, r, BATCH) for r in range(WORLD)]
    first: list[int] = []
    iterators = [iter(loader) for loader in four]
    for it in iterators:
        first += [i for _ in range(2) for i, _ in next(it)]
    ranked = [loader.state_dict() for loader in four]
    assert ranked[1] == {
        "version": 1, "dataset": NAME, "epoch": 0, "batches_yielded": 2, "seed": SEED, "order": "global",
        "epoch_size": N, "consumed": [], "world_size": WORLD, "rank": 1, "chunk": BATCH, "drop_last": False}
    job = merge_states(ranked)
    assert job["consumed"] == [[0, 32]], "2 steps of 4 ranks x 4: a prefix"
    three = [batched(3, r, 5) for r in range(3)]
    for loader in three:
        loader.load_state_dict(job)
    assert Counter(first) + Counter(i for loader in three for i in read(loader)) == EVERY, (
        "restored on 3 ranks with batches of 5: every sample of the epoch exactly once")
    plain = [DataLoader(ds, batch_size=5, collate_fn=keep, sampler=DistributedSampler(ds, 3, r, seed=SEED))
             for r in range(3)]
    for loader in plain:
        loader.set_epoch(1)
    assert [read(loader) for loader in three] == [read(loader) for loader in plain], (
        "the next epoch is a 3-rank run's with sampler= and batch_size=")
    with pytest.raises(ValueError, match="deals batch_size=3 per step but its BatchSampler batches 4"):
        DataLoader(ds, batch_sampler=tud.BatchSampler(DistributedSampler(ds, 2, 0, batch_size=3), BATCH, False))


def test_taking_and_merging_states_needs_no_sidecar(start_sidecar: Callable[..., unstall.Sidecar],
                                                    dataset: Path) -> None:
    """Checkpoints anywhere: with the sidecar stopped (SIGSTOP), every rank's state_dict() and their merge still
    answer (a call to the sidecar would wait for it), at the first batch, mid-epoch and at the epoch's end."""
    private = start_sidecar("8MiB")
    private.register_dataset(NAME, dataset)
    ds = Dataset(NAME, sidecar=private, loader=sample_id)
    ranks = [DataLoader(ds, batch_size=BATCH, collate_fn=keep, sampler=DistributedSampler(ds, WORLD, r, seed=SEED))
             for r in range(WORLD)]
    its = [iter(loader) for loader in ranks]
    before = [loader.state_dict() for loader in ranks]  # before the first batch
    taken: list[tuple[int, list[dict[str, Any]]]] = []
    for step in range(len(ranks[0])):
        for it in its:
            next(it, None)
        if step in (0, 1, len(ranks[0]) - 1):
            send_signal(private.pid, signal.SIGSTOP)
            try:
                taken.append((step, [loader.state_dict() for loader in ranks]))
                job = merge_states(taken[-1][1])
            finally:
                os.kill(private.pid, signal.SIGCONT)
            assert job["epoch"] == 0
    assert merge_states(before)["consumed"] == [] and [s["batches_yielded"] for s in before] == [0] * WORLD
    assert [[s["batches_yielded"] for s in states] for _, states in taken[:2]] == [[1] * WORLD, [2] * WORLD]
    assert merge_states(taken[-1][1])["consumed"] == [[0, N]], "after every rank's last batch: the epoch's end"
