"""A training job checkpoints its loader's ``state_dict()`` mid-epoch, is SIGKILLed, and a new process
restores it: the concatenated sample sequence (ids and bytes) equals an uninterrupted run's, and the
restored loader fetches (or has the sidecar prepare) only what it had not consumed yet.

Jobs run in fresh interpreters (``resume_job.py``), as a user's script does: a real sidecar, real torch
DataLoaders with worker processes, real prep groups.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

import unstall
from unstall import prep
from waits import wait_until
from datagen import make_image_folder
from test_prep_support import BATCH, N_SAMPLES, PIPELINE_NCHW, PrepEnv, start_env

HERE = Path(__file__).parent
N = 24  # samples of the DataLoader's dataset
BATCH_SIZE = 4
EPOCHS = 3


def run(spec: dict[str, Any], home: Path, tmp_path: Path, killed: bool = False, **env: str) -> dict[str, Any]:
    """resume_job.py in a fresh interpreter; its JSON line, or (``killed``) its checkpoint."""
    checkpoint = tmp_path / f"checkpoint-{len(list(tmp_path.glob('checkpoint-*')))}.pt"
    environ = dict(os.environ, UNSTALL_HOME=str(home), UNSTALL_EPOCH_LOG="0", **env)
    for var in ("UNSTALL_SIDECAR", "UNSTALL_CONTROL_PORT", "UNSTALL_TRANSPORT"):
        environ.pop(var, None)
    p = subprocess.run([sys.executable, str(HERE / "resume_job.py"), json.dumps({**spec, "checkpoint": str(checkpoint)})],
                       env=environ, capture_output=True, text=True, timeout=300)
    if killed:
        assert p.returncode == -signal.SIGKILL, p.stdout[-2000:] + p.stderr[-4000:]
        return {"checkpoint": str(checkpoint), **torch.load(checkpoint)}
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def whole_epochs(seen: list[list[Any]], epochs: int, n: int) -> None:
    for e in range(epochs):
        assert sorted(i for se, i, _ in seen if se == e) == list(range(n)), f"epoch {e}: every sample once"


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("resume") / "imgs"
    make_image_folder(root, ["a", "b", "c"], per_class=N // 3, seed=31, extras=False)
    return root


def test_a_killed_dataloader_job_resumes_at_the_next_batch(sidecar: unstall.Sidecar, images: Path,
                                                           tmp_path: Path) -> None:
    sidecar.register_dataset("resume", images)
    spec = {"kind": "dataloader", "dataset": "resume", "batch_size": BATCH_SIZE, "epochs": EPOCHS, "num_workers": 2}
    # No seed: the killed job draws its base seed from torch's global RNG; the checkpoint carries it.
    ck = run({**spec, "kill_at": [1, 2]}, sidecar.home, tmp_path, killed=True)
    state = ck["loader"]
    assert state == {"version": 1, "dataset": "resume", "epoch": 1, "batches_yielded": 3, "num_batches": N // BATCH_SIZE,
                     "seed": state["seed"], "order": "seed"}, "3 batches of epoch 1 handed out (workers prefetched more)"
    whole = run({**spec, "seed": state["seed"]}, sidecar.home, tmp_path)  # uninterrupted, with that base seed
    whole_epochs(whole["seen"], EPOCHS, N)
    assert len({tuple(i for e, i, _ in whole["seen"] if e == k) for k in range(EPOCHS)}) == EPOCHS, "epochs reshuffle"
    consumed = ck["seen"]
    assert consumed == whole["seen"][: len(consumed)] and len(consumed) == (N + 3 * BATCH_SIZE)
    for workers in (2, 0):  # the same number of workers, or another
        resumed = run({**spec, "num_workers": workers, "restore": ck["checkpoint"]}, sidecar.home, tmp_path)
        assert consumed + resumed["seen"] == whole["seen"], f"{workers} workers: the run continues as if never killed"
        assert resumed["session_samples"] == len(resumed["seen"]), "the consumed batches were skipped, never fetched"
        assert resumed["state"] == {**state, "epoch": EPOCHS, "batches_yielded": 0}
    sha = {i: h for _, i, h in whole["seen"]}
    assert len(set(sha.values())) == N and all(h == sha[i] for _, i, h in consumed), "ids and bytes agree"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrepEnv]:
    yield from start_env(tmp_path_factory.mktemp("resume-prep"))


def test_a_killed_prep_group_member_resumes_and_the_skipped_batches_are_never_prepared(env: PrepEnv,
                                                                                       tmp_path: Path) -> None:
    nb = -(-N_SAMPLES // BATCH)
    spec = {"kind": "prep", "location": env.location, "dataset": "imgs", "pipeline": PIPELINE_NCHW,
            "batch_size": BATCH, "seed": 51, "epochs": EPOCHS}
    token = {"UNSTALL_TOKEN": env.sidecar.token}
    whole = run(spec, env.sidecar.home, tmp_path, **token)
    whole_epochs(whole["seen"], EPOCHS, N_SAMPLES)
    ck = run({**spec, "kill_at": [1, 2], "member_timeout": 1}, env.sidecar.home, tmp_path, killed=True, **token)
    state = ck["loader"]
    assert state == {"version": 1, "dataset": "imgs", "epoch": 1, "batches_yielded": 3, "epoch_size": nb,
                     "consumed": [], "world_size": 1, "rank": 0, "chunk": 1, "batch_size": BATCH, "seed": 51,
                     "start_epoch": 0}
    consumed = ck["seen"]
    assert consumed == whole["seen"][: len(consumed)]
    # The killed member's group closes once it is dropped (no heartbeat): the restored job starts a new one.
    groups = set(env.stats()["groups"])
    wait_until(lambda: all(env.group_stats(g)["state"] == "closed" for g in groups),
               "the killed member is dropped and its group closes")
    resumed = run({**spec, "restore": ck["checkpoint"]}, env.sidecar.home, tmp_path, **token)
    assert consumed + resumed["seen"] == whole["seen"], "the prepared batches continue as if never killed"
    s = env.group_stats(resumed["group"])
    assert resumed["group"] not in groups
    assert s["batches_prepared_per_epoch"] == {"1": nb - 3, "2": nb}, "nothing before the checkpoint was prepared"
    assert s["batches_served"] == 2 * nb - 3 and s["state"] == "closed"


def test_a_prep_member_restored_at_an_epochs_end_reads_it_empty_then_the_next_epoch(env: PrepEnv) -> None:
    nb = -(-N_SAMPLES // BATCH)
    kwargs: dict[str, Any] = dict(batch_size=BATCH, seed=52, epochs=3, with_ids=True)

    def ids(loader: prep.PrepLoader) -> list[list[int]]:
        return [b[2].tolist() for b in loader]

    with env.client() as client:
        first = prep.PrepLoader("imgs", PIPELINE_NCHW, client=client, **kwargs)
        whole = []
        for batch in first:
            whole.append(batch[2].tolist())
            inside = first.state_dict()  # after the epoch's last batch, before the loop ended
        after = first.state_dict()
        whole_next = ids(first)
        first.close()
        assert (inside["epoch"], inside["batches_yielded"], after["epoch"], after["batches_yielded"]) == (0, nb, 1, 0)
        for state, first_for in ((inside, []), (after, whole_next)):
            resumed = prep.PrepLoader("imgs", PIPELINE_NCHW, client=client, **kwargs)
            resumed.load_state_dict(state)
            assert resumed.state_dict() == state
            got = [ids(resumed), ids(resumed)]
            resumed.close()
            assert got[0] == first_for, "at the end of epoch 0 the first for is empty; after its loop, epoch 1"
            assert got[1 if state is inside else 0] == whole_next, "then epoch 1, as the uninterrupted run read it"
    assert sorted(i for b in whole for i in b) == list(range(N_SAMPLES))
