"""Python-side transforms shared from DataLoader worker processes, and compressed Flight batches: a real sidecar,
real member processes with real torch worker processes and torchvision transforms."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from test_prep_support import BATCH, N_SAMPLES, SIZE, PrepEnv, start_env, start_member, wait_all
from waits import wait_until

from unstall import prep  # noqa: E402  (after test_prep_support put this checkout's shim first)

NUM_BATCHES = -(-N_SAMPLES // BATCH)
EPOCHS = 2


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrepEnv]:
    yield from start_env(tmp_path_factory.mktemp("prep-workers"))


def _members(env: PrepEnv, tmp: Path, workers: str, k: int = 2, seed: str = "5") -> tuple[list[Any], list[Path]]:
    outs = [tmp / f"w{i}.json" for i in range(k)]
    procs = [start_member(env.location, env.sidecar.token, o, "torch-pyw", seed, str(k), str(EPOCHS), "30", "0",
                          env={"UNSTALL_TEST_WORKERS": workers}) for o in outs]
    return procs, outs


def _check_shared_once(env: PrepEnv, results: list[dict[str, Any]]) -> dict[str, Any]:
    for r in results:
        for e in range(EPOCHS):
            batches = r["epochs"][str(e)]
            assert len(batches) == NUM_BATCHES
            assert sorted(i for b in batches for i in b["ids"]) == list(range(N_SAMPLES)), "every sample once"
    for e in range(EPOCHS):
        assert results[1]["epochs"][str(e)] == results[0]["epochs"][str(e)], "identical tensors in both members"
    assert results[0]["epochs"]["0"][0]["shape"] == [BATCH, 3, SIZE, SIZE]
    s = env.group_stats(results[0]["info"]["group"])
    assert s["prep"] == "members"
    assert s["batches_prepared_per_epoch"] == {str(e): NUM_BATCHES for e in range(EPOCHS)}, "each batch made once"
    assert sum(s["batches_uploaded_by_member"].values()) == EPOCHS * NUM_BATCHES
    assert s["batches_served"] == 2 * EPOCHS * NUM_BATCHES
    assert all(r["made"] == 0 for r in results), "the main processes made nothing: their workers did"
    return s


def test_two_members_with_two_worker_processes_each_share_every_batch_once(env: PrepEnv, tmp_path: Path) -> None:
    procs, outs = _members(env, tmp_path, f"2:{tmp_path}")
    logs = wait_all(procs)
    assert [p.returncode for p in procs] == [0, 0], logs
    results = [json.loads(o.read_text()) for o in outs]
    _check_shared_once(env, results)
    pids = {int(p) for p in (tmp_path / "pids").read_text().split()}
    assert len(pids) > 2, f"transforms ran in the members' worker processes, got pids {pids}"
    assert not pids & {r["pid"] for r in results}, "never in a member's main process"


def test_a_worker_killed_mid_epoch_loses_and_duplicates_no_batch(env: PrepEnv, tmp_path: Path) -> None:
    procs, outs = _members(env, tmp_path, f"2:{tmp_path}:hang", seed="6")
    victim = tmp_path / "victim"
    wait_until(lambda: victim.exists() and victim.read_text(), "a worker to hang in its transform", timeout=120)
    os.kill(int(victim.read_text()), signal.SIGKILL)  # it holds a claim on a batch
    logs = wait_all(procs)
    assert [p.returncode for p in procs] == [0, 0], logs
    s = _check_shared_once(env, [json.loads(o.read_text()) for o in outs])
    assert s["claims_released"] >= 1, "the dead worker's claim was given back, not left to expire"
    assert "exited unexpectedly" in "".join(logs)


def test_a_transform_that_raises_in_a_worker_is_raised_in_the_main_process_naming_batch_and_sample(
        env: PrepEnv, tmp_path: Path) -> None:
    procs, _ = _members(env, tmp_path, f"2:{tmp_path}:fail", k=1, seed="7")
    [log] = wait_all(procs)
    assert procs[0].returncode != 0
    assert "ValueError: Caught ValueError in DataLoader worker process" in log, log
    assert "making epoch 0 batch" in log and "sample id" in log and "this transform refuses every image" in log, log


def test_flight_members_get_lz4_and_zstd_batches_identical_to_uncompressed(env: PrepEnv) -> None:
    pipe = prep.imagenet_train(SIZE, dtype="uint8")
    join = dict(batch_size=BATCH, seed=11, group_size=3, epochs=1, transport="flight", client=env.client())
    members = {c: prep.join("imgs", pipe, compression=c, **join) for c in (None, "lz4", "zstd")}
    assert members["lz4"].info["compression"] == "lz4" and "compression" not in members[None].info
    got: dict[Any, list[np.ndarray]] = {c: [] for c in members}
    for b in range(NUM_BATCHES):
        for c, m in members.items():
            arr, _, ids = m.arrays(0, b)
            got[c].append(np.array(arr))
    for c in ("lz4", "zstd"):
        for raw, comp in zip(got[None], got[c]):
            assert raw.dtype == comp.dtype == np.uint8 and raw.tobytes() == comp.tobytes(), f"{c}: byte-identical"
    s = env.group_stats(members[None].group)
    for c in ("lz4", "zstd"):
        sent = s["compression"][c]
        assert sent["batches_sent"] == NUM_BATCHES
        assert sent["raw_bytes_sent"] >= sum(a.nbytes for a in got[None])
        assert 0 < sent["compressed_bytes_sent"], sent
    assert s["compression"]["staging_bytes"] == 0, "compressed copies freed with their batches"
    with pytest.raises(ValueError, match="compression"):
        prep.join("imgs", pipe, compression="gzip", **join)
