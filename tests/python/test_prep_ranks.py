"""Data-parallel ranks in a prep group, with a real sidecar: ranks are processes of a real torch.distributed (gloo)
job (``prep_rank.py``), each a member of the group that takes its rank and world size from torch.distributed and
reads its share of every epoch; the group prepares each batch once. 4 ranks interrupted mid-epoch (one a batch
behind), their states gathered and merged, restore on 2 and on 3 ranks: over the interrupted epoch every sample is
delivered exactly once, and the next epoch equals an uninterrupted run's on the new world size. The same for
Python-side transforms made in DataLoader-style worker processes. One launch per world size, each running several
scenarios in the same processes."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest
from prep_rank import BATCH, FINGERPRINT, transform
from ranks import rank_env, run_ranks
from test_prep_support import N_SAMPLES, PIPELINE_NCHW, PrepEnv, start_env
from waits import send_signal

from unstall import prep  # noqa: E402  (after test_prep_support put this checkout's shim first)
from unstall.elastic import merge_states  # noqa: E402

NUM_BATCHES = -(-N_SAMPLES // BATCH)  # 10: the last one partial
EPOCHS = 2
SEED = 5
EVERY = Counter(range(N_SAMPLES))
BEHIND = [2, 2, 1, 2]  # rank 2 a step behind: batch 6, its second, is not read
LOCKSTEP_WINDOW = 2  # fewer than the 4 ranks: the group's window counts steps of 4 batches

Rank = dict[str, Any]  # one rank's record of a run: its group and its loops
Runs = dict[str, list[Rank]]  # run name -> per rank


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrepEnv]:
    yield from start_env(tmp_path_factory.mktemp("prep-ranks"))


def launch(env: PrepEnv, tmp: Path, world: int, runs: list[dict[str, Any]]) -> Runs:
    out = tmp / "out"
    out.mkdir(parents=True)
    run_ranks("prep_rank.py", [{"rank": r, "world": world, "rendezvous": str(tmp / "rendezvous"), "out": str(out),
                                "seed": SEED, "runs": runs} for r in range(world)],
              rank_env(UNSTALL_HOME=str(env.sidecar.home), UNSTALL_EPOCH_LOG="0"), tmp)
    records = {run["name"]: [json.loads((out / f"{run['name']}-rank{r}.json").read_text()) for r in range(world)]
               for run in runs}
    for name, ranks in records.items():
        assert ranks[0]["closed"] == {"members": [], "dropped": []}, \
            f"{name}: each rank's close() took it out of the group at once (none left to the member timeout)"
    return records


def job(tmp: Path, run: str, loop: int) -> Path:
    return tmp / "out" / f"{run}-{loop}-job.json"


def ids(ranks: list[Rank], loop: int) -> Counter[int]:
    return Counter(i for r in ranks for batch_ids, _ in r["loops"][loop]["batches"] for i in batch_ids)


def batches(ranks: list[Rank], loop: int) -> list[list[Any]]:
    return [r["loops"][loop]["batches"] for r in ranks]


def yielded(ranks: list[Rank], loop: int) -> list[int]:
    return [r["loops"][loop]["state"]["batches_yielded"] for r in ranks]


def stats(env: PrepEnv, ranks: list[Rank]) -> dict[str, Any]:
    assert len({r["group"] for r in ranks}) == 1, "every rank of a run is a member of one group"
    return env.group_stats(ranks[0]["group"])


def prep_run(name: str, loops: list[Any], **extra: Any) -> dict[str, Any]:
    return {"name": name, "loader": "prep", "epochs": EPOCHS, "loops": loops, **extra}


def transform_run(name: str, loops: list[Any], **extra: Any) -> dict[str, Any]:
    return {"name": name, "loader": "transform", "num_workers": 1, "epochs": 1, "loops": loops, **extra}


@pytest.fixture(scope="module")
def four(env: PrepEnv, tmp_path_factory: pytest.TempPathFactory) -> tuple[Runs, Path]:
    """One launch of 4 ranks: an uninterrupted run of 2 epochs, interruptions of a ``PrepLoader`` (over shared
    memory) and of a ``SharedTransformLoader`` with a worker process per rank, rank 2 a batch behind, and both
    loaders read in lockstep (an allreduce each step) with a window smaller than the world size."""
    tmp = tmp_path_factory.mktemp("four")
    return launch(env, tmp, 4, [prep_run("whole", [None, None], transport="shm"),
                                prep_run("behind", [BEHIND], transport="shm"),
                                transform_run("transform-behind", [BEHIND]),
                                prep_run("lockstep", [None], transport="shm", epochs=1, window=LOCKSTEP_WINDOW,
                                         lockstep=True),
                                transform_run("transform-lockstep", [None], window=LOCKSTEP_WINDOW,
                                              lockstep=True)]), tmp


def test_ranks_in_lockstep_with_a_window_below_the_world_size_read_every_sample_once(
        env: PrepEnv, four: tuple[Runs, Path]) -> None:
    """At each step the 4 ranks read 4 consecutive batches and wait for each other, so the group prepares its
    window in steps of 4 batches: with a window of 2 batches they would wait for the slowest rank, which waits for
    them at the allreduce."""
    runs, _ = four
    for run in ("lockstep", "transform-lockstep"):
        ranks = runs[run]
        assert ids(ranks, 0) == EVERY, f"{run}: every sample once"
        assert [len(b) for b in batches(ranks, 0)] == [3, 3, 2, 2], run
        s = stats(env, ranks)
        assert s["window"] == LOCKSTEP_WINDOW, run
        assert s["batches_prepared_per_epoch"] == {"0": NUM_BATCHES}, f"{run}: each batch prepared once"


@pytest.fixture(scope="module", params=[2, 3])
def restored(request: pytest.FixtureRequest, env: PrepEnv, four: tuple[Runs, Path],
             tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Runs]:
    """One launch of 2 (or 3) ranks: an uninterrupted run, the 4 ranks' interrupted job restored (2 ranks: over
    Flight), their state after epoch 0's last batch restored, and (3 ranks) the interrupted transforms restored."""
    world, (_, tmp4) = request.param, four
    transport = "flight" if world == 2 else "shm"
    runs = [prep_run("whole", [None, None], transport=transport),
            prep_run("behind", [None, None], transport=transport, load=str(job(tmp4, "behind", 0))),
            prep_run("end", [None, None], transport=transport, load=str(job(tmp4, "whole", 0)))]
    if world == 3:
        runs.append(transform_run("transform-behind", [None], load=str(job(tmp4, "transform-behind", 0))))
    return world, launch(env, tmp_path_factory.mktemp(f"on{world}"), world, runs)


def test_four_ranks_read_their_shares_and_their_interrupted_states_merge(env: PrepEnv,
                                                                         four: tuple[Runs, Path]) -> None:
    runs, tmp = four
    whole = runs["whole"]
    for e in range(EPOCHS):
        assert [r["loops"][e]["epoch"] for r in whole] == [e] * 4
        assert ids(whole, e) == EVERY, f"epoch {e}: every sample once, none padded"
    assert [len(b) for b in batches(whole, 0)] == [3, 3, 2, 2], "rank r reads batches r, r + 4, ..."
    s = stats(env, whole)
    assert s["batches_prepared_per_epoch"] == {str(e): NUM_BATCHES for e in range(EPOCHS)}
    assert s["batches_served"] == EPOCHS * NUM_BATCHES, "each batch read by the one rank whose it is"
    assert s["state"] == "closed" and s["members"] == [], "every rank finished after its own last batch"

    for run in ("behind", "transform-behind"):
        ranks = runs[run]
        assert yielded(ranks, 0) == BEHIND
        states = [r["loops"][0]["state"] for r in ranks]
        assert all(st["world_size"] == 4 and st["epoch_size"] == NUM_BATCHES and st["consumed"] == [] for st in states)
        assert [st["rank"] for st in states] == [0, 1, 2, 3], "each rank's from torch.distributed"
        merged = json.loads(job(tmp, run, 0).read_text())
        assert merged["kind"] == "job" and merged["consumed"] == [[0, 6], [7, 8]], run
        s = stats(env, ranks)
        assert s["state"] == "closed" and s["members"] == [], f"{run}: every interrupted rank left the group"
    for r, rank in enumerate(runs["behind"]):
        assert rank["loops"][0]["batches"] == whole[r]["loops"][0]["batches"][:BEHIND[r]], \
            "an interrupted rank read the first batches of its share, as prepared for the uninterrupted run"
    assert json.loads(job(tmp, "whole", 0).read_text())["consumed"] == [[0, NUM_BATCHES]]
    assert [(r["loops"][0]["after"]["epoch"], r["loops"][0]["after"]["batches_yielded"]) for r in whole] == [(1, 0)] * 4, \
        "taken once the for is over: the next epoch's start (torchdata's)"


def test_a_four_rank_job_restores_on_two_and_three_ranks(env: PrepEnv, four: tuple[Runs, Path],
                                                         restored: tuple[int, Runs]) -> None:
    (runs4, _), (world, runs) = four, restored
    whole, behind = runs["whole"], runs["behind"]
    label = f"the 4 ranks' interrupted job on {world} ranks"
    for e in range(EPOCHS):
        assert ids(whole, e) == EVERY, f"{world} ranks uninterrupted, epoch {e}: every sample once"
    assert ids(runs4["behind"], 0) + ids(behind, 0) == EVERY, f"{label}: every sample of the epoch exactly once"
    assert [r["loops"][0]["epoch"] for r in behind] == [0] * world
    assert yielded(behind, 0) == [len(b) for b in batches(behind, 0)], "each rank's state: its share's end"
    assert batches(behind, 1) == batches(whole, 1), f"{label}: the next epoch is an uninterrupted {world}-rank run's"
    s = stats(env, behind)
    # positions from the first one a restored rank needs (batch 6) are prepared once; nothing before it
    assert s["batches_prepared_per_epoch"] == {"0": NUM_BATCHES - 6, "1": NUM_BATCHES}, label
    assert s["batches_served"] == 3 + NUM_BATCHES, f"{label}: batches 6, 8 and 9, then a whole epoch"
    assert s["state"] == "closed" and s["members"] == []
    s = stats(env, whole)
    assert s["batches_prepared_per_epoch"] == {str(e): NUM_BATCHES for e in range(EPOCHS)}

    end = runs["end"]
    assert [r["loops"][0]["batches"] for r in end] == [[]] * world, "a state after epoch 0's last batch: its end"
    assert batches(end, 1) == batches(whole, 1), "then epoch 1, as an uninterrupted run reads it"

    if world == 3:
        rest = runs["transform-behind"]
        assert ids(runs4["transform-behind"], 0) + ids(rest, 0) == EVERY, \
            "transforms in worker processes: every sample of the interrupted epoch exactly once"
        s = stats(env, rest)
        # batches 6, 8 and 9, each made once by a worker; none the job consumed (a worker claims the ranks' batches)
        assert s["batches_prepared_per_epoch"] == {"0": 3} and s["batches_served"] == 3
        assert s["state"] == "closed" and s["members"] == []


def test_a_state_of_another_batch_size_is_refused(env: PrepEnv, four: tuple[Runs, Path]) -> None:
    state = json.loads(job(four[1], "behind", 0).read_text())
    with pytest.raises(ValueError, match="taken with batch_size 4; this loader has 8"):
        prep.PrepLoader("imgs", PIPELINE_NCHW, batch_size=8, seed=SEED, rank=0, world_size=2,
                        client=env.client()).load_state_dict(state)


def test_ranks_of_one_process_each_make_their_own_batches(env: PrepEnv) -> None:
    """Explicit ``rank``/``world_size``, the ranks loaders of this one process read in turn, Python-side transforms
    made by each rank's main process: each makes the batches of its share, and only those."""
    ranks = [prep.SharedTransformLoader("imgs", transform(), fingerprint=FINGERPRINT, batch_size=BATCH, seed=SEED,
                                        with_ids=True, rank=r, world_size=3, group_size=3, epochs=1,
                                        client=env.client()) for r in range(3)]
    for loader in ranks:
        loader.membership  # noqa: B018  (all join before any reads)
    its = [iter(loader) for loader in ranks]
    got: list[list[int]] = [[], [], []]
    for step in range(NUM_BATCHES):
        for r, it in enumerate(its):
            batch = next(it, None)
            if batch is not None:
                got[r].extend(int(i) for i in batch[2])
        if step == 1:  # checkpoints anywhere: the states and their merge need no call to the (stopped) sidecar
            send_signal(env.sidecar.pid, signal.SIGSTOP)
            try:
                states = [loader.state_dict() for loader in ranks]
                merged = merge_states(states, what="SharedTransformLoader")
            finally:
                os.kill(env.sidecar.pid, signal.SIGCONT)
            assert [st["batches_yielded"] for st in states] == [2, 2, 2] and merged["consumed"] == [[0, 6]]
    assert Counter(i for r in got for i in r) == EVERY
    assert [loader.made for loader in ranks] == [4, 3, 3]
    s = env.group_stats(ranks[0].membership.group)
    assert s["batches_prepared_per_epoch"] == {"0": NUM_BATCHES} and s["batches_served"] == NUM_BATCHES
    assert s["state"] == "closed"
