"""Coordinated prep with real PyTorch: a real sidecar process, real JPEG/PNG files, member processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from test_prep_support import BATCH, N_SAMPLES, PIPELINE_NCHW, SIZE, PrepEnv, start_env, wait_all

import unstall  # noqa: E402  (after test_prep_support put this checkout's shim first)
from unstall import prep  # noqa: E402

NUM_BATCHES = -(-N_SAMPLES // BATCH)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrepEnv]:
    yield from start_env(tmp_path_factory.mktemp("prep-torch"))


def _check_members_agree(results: list[dict], epochs: list[int]) -> None:
    for r in results:
        for e in epochs:
            batches = r["epochs"][str(e)]
            assert len(batches) == NUM_BATCHES
            ids = sorted(i for b in batches for i in b["ids"])
            assert ids == list(range(N_SAMPLES)), f"member {r['pid']} epoch {e}: every sample exactly once"
    for e in epochs:
        first = results[0]["epochs"][str(e)]
        for other in results[1:]:
            assert other["epochs"][str(e)] == first, f"epoch {e}: identical batches across members"


def test_three_torch_jobs_share_one_group_and_each_batch_is_prepared_once(env: PrepEnv, tmp_path: Path) -> None:
    outs = [tmp_path / f"m{i}.json" for i in range(3)]
    procs = [env.member(o, "torch", "1", "3", "2", "30", "0") for o in outs]  # shared memory (same host)
    logs = wait_all(procs)
    assert [p.returncode for p in procs] == [0, 0, 0], logs
    results = [json.loads(o.read_text()) for o in outs]
    groups = {r["info"]["group"] for r in results}
    assert len(groups) == 1, "same dataset, pipeline, seed and batch size: one group"
    assert {r["info"]["start_epoch"] for r in results} == {0}
    assert all(r["info"]["shm"] for r in results), "members on the sidecar's host map /dev/shm batches"
    _check_members_agree(results, [0, 1])
    b0 = results[0]["epochs"]["0"][0]
    assert b0["shape"] == [BATCH, 3, SIZE, SIZE]
    assert results[0]["epochs"]["0"] != results[0]["epochs"]["1"], "epochs reshuffle"

    s = env.group_stats(groups.pop())
    assert s["batches_prepared_per_epoch"] == {"0": NUM_BATCHES, "1": NUM_BATCHES}, "prepared once per epoch"
    assert s["batches_prepared"] == 2 * NUM_BATCHES
    assert s["samples_prepared"] == 2 * N_SAMPLES
    assert s["batches_served"] == 3 * 2 * NUM_BATCHES
    assert 0 < s["staging_peak_bytes"] <= s["staging_limit_bytes"]
    assert s["staged_batches_peak"] <= s["window"]
    assert s["state"] == "closed" and s["dropped"] == []


@pytest.mark.parametrize("transport", ["flight", "shm"])
def test_a_killed_member_is_dropped_and_the_others_finish(env: PrepEnv, tmp_path: Path, transport: str) -> None:
    outs = [tmp_path / f"m{i}.json" for i in range(3)]
    # Member 2 SIGKILLs itself after 2 batches (a shared-memory member dies holding a mapped batch);
    # member_timeout 1.5 s. The seed differs per transport: two separate groups.
    seed = "2" if transport == "flight" else "12"
    procs = [env.member(o, "torch", seed, "3", "2", "1.5", "2" if i == 2 else "0", "NCHW", transport)
             for i, o in enumerate(outs)]
    logs = wait_all(procs)
    assert procs[2].returncode == -9
    assert [p.returncode for p in procs[:2]] == [0, 0], logs
    results = [json.loads(o.read_text()) for o in outs]
    _check_members_agree(results[:2], [0, 1])
    killed = results[2]
    assert len(killed["epochs"]["0"]) == 2
    assert killed["epochs"]["0"] == results[0]["epochs"]["0"][:2], "it saw the group's batches until it died"
    assert killed["info"]["shm"] == (transport == "shm")
    s = env.group_stats(killed["info"]["group"])
    assert [d["member"] for d in s["dropped"]] == [killed["info"]["member"]]
    assert "no heartbeat" in s["dropped"][0]["reason"]
    assert s["batches_prepared_per_epoch"] == {"0": NUM_BATCHES, "1": NUM_BATCHES}
    assert 0 < s["staging_peak_bytes"] <= s["staging_limit_bytes"]


def _crops(env: PrepEnv, seed: int) -> dict[int, np.ndarray]:
    with env.client() as client, prep.PrepLoader(
        "imgs", PIPELINE_NCHW, batch_size=BATCH, seed=seed, epochs=1, client=client, with_ids=True, copy=True
    ) as loader:
        out = {}
        for images, _labels, ids in loader:
            for img, i in zip(images.numpy(), ids.numpy()):
                out[int(i)] = img
        return out


def test_the_same_seed_gives_the_same_crops(env: PrepEnv) -> None:
    a, b, c = _crops(env, 5), _crops(env, 5), _crops(env, 6)
    assert sorted(a) == list(range(N_SAMPLES))
    for i in range(N_SAMPLES):
        np.testing.assert_array_equal(a[i], b[i])
    assert sum(not np.array_equal(a[i], c[i]) for i in range(N_SAMPLES)) > N_SAMPLES // 2
    # Normalized with ImageNet mean/std: values of real pixels land in about [-2.2, 2.7].
    x = np.stack(list(a.values()))
    assert x.dtype == np.float32 and x.shape == (N_SAMPLES, 3, SIZE, SIZE)
    assert -2.2 < x.min() < 0 < x.max() < 2.7


def test_shared_memory_slots_are_reused_and_a_held_tensor_never_changes(env: PrepEnv) -> None:
    """The sidecar writes a /dev/shm slot again only after the member's views of the batch in it are gone: a
    trainer that keeps some batches' tensors sees them unchanged, while the batches it lets go of make room."""
    import torch

    with env.client() as client:
        loader = prep.PrepLoader("imgs", PIPELINE_NCHW, batch_size=BATCH, seed=21, epochs=3, transport="shm",
                                 client=client)
        kept: list[tuple[torch.Tensor, torch.Tensor]] = []  # (the loader's tensor, a copy of it)
        seen = 0
        for _epoch in range(3):
            for b, (images, _labels) in enumerate(loader):
                seen += images.shape[0]
                if b % 2 == 0:  # hold every other batch to the end
                    kept.append((images, images.clone()))
        assert loader.membership.shm and seen == 3 * N_SAMPLES
        for held, copy in kept:
            assert torch.equal(held, copy), "a tensor the trainer holds never changes"
        s = env.group_stats(loader.membership.group)
        slots = s["shm_slots"]
        assert slots["reused"] > 0, slots  # the batches let go of were written again
        assert slots["created"] < 3 * NUM_BATCHES, slots
        assert 0 < s["staging_peak_bytes"] <= s["staging_limit_bytes"]


def test_shared_memory_members_ask_prep_next_on_the_local_socket(env: PrepEnv) -> None:
    """A shared-memory member's per-batch prep.next goes over the sidecar's local socket (the join reply names it),
    not a gRPC round trip; a socket that does not take the connection leaves the member on Flight, which reads
    every batch the same way."""
    with env.client() as client:
        a = prep.join("imgs", PIPELINE_NCHW, batch_size=BATCH, seed=31, epochs=1, transport="shm", client=client)
        assert a.shm and a.info["local"].endswith("/data.sock"), a.info
        batches = a.epoch_arrays(0)
        _, _, ids = next(batches)
        seen = ids.tolist()
        assert a._local is not None and a._local.connection_id is not None, "prep.next went over the local socket"
        seen += [i for _, _, ids in batches for i in ids.tolist()]
        assert sorted(seen) == list(range(N_SAMPLES))

        b = prep.join("imgs", PIPELINE_NCHW, batch_size=BATCH, seed=32, epochs=1, transport="shm", client=client)
        b.info["local"] = str(Path(env.tmp) / "no-such.sock")
        got = [i for _, _, ids in b.epoch_arrays(0) for i in ids.tolist()]
        assert b._local is None and b._local_refused == b.info["local"]
        assert sorted(got) == list(range(N_SAMPLES))


def test_staging_memory_stays_within_its_bound(env: PrepEnv) -> None:
    one = BATCH * 3 * SIZE * SIZE * 4 + BATCH * 512 + (256 << 10)
    with env.client() as client:
        m = prep.join("imgs", PIPELINE_NCHW, batch_size=BATCH, seed=9, window=64, staging_bytes=3 * one,
                      epochs=1, client=client)
        assert m.info["window"] < 64, "the window shrinks to what staging_bytes holds"
        n = sum(rb.num_rows for rb in m.epoch(0))
        assert n == N_SAMPLES
        s = env.group_stats(m.group)
        assert s["staging_limit_bytes"] == 3 * one
        assert 0 < s["staging_peak_bytes"] <= s["staging_limit_bytes"]
        assert s["staged_batches_peak"] <= m.info["window"]
        with pytest.raises(unstall.SidecarError, match="staging_bytes 1000 cannot hold one batch"):
            prep.join("imgs", PIPELINE_NCHW, batch_size=BATCH, seed=10, staging_bytes=1000, client=client)


def test_the_window_is_tuned_unless_given_or_autotune_is_off(env: PrepEnv) -> None:
    with env.client() as client:
        tuned = prep.join("imgs", PIPELINE_NCHW, batch_size=BATCH, seed=11, epochs=1, client=client)
        off = prep.join("imgs", PIPELINE_NCHW, batch_size=BATCH, seed=12, epochs=1, autotune=False, client=client)
        for m in (tuned, off):
            assert sum(rb.num_rows for rb in m.epoch(0)) == N_SAMPLES
        a = env.group_stats(tuned.group)["autotune"]
        assert a["window_tuned"] and a["threads_tuned"]
        assert 1 <= a["threads"] <= a["max_threads"] and a["window"] <= a["max_window"]
        b = env.group_stats(off.group)["autotune"]
        assert not b["window_tuned"] and not b["threads_tuned"] and b["decisions_total"] == 0
        assert b["window"] == off.info["window"]


def test_raw_groups_share_batches_without_prep(env: PrepEnv) -> None:
    with env.client() as client, prep.PrepLoader("imgs", None, batch_size=BATCH, seed=3, epochs=1, client=client,
                                                 with_ids=True) as loader:
        got = [(payloads, labels, ids) for payloads, labels, ids in loader]
    files = {p.name: p.read_bytes() for p in env.root.rglob("*") if p.is_file()}
    assert sorted(int(i) for _, _, ids in got for i in ids) == list(range(N_SAMPLES))
    assert all(isinstance(p, bytes) and p in files.values() for payloads, _, _ in got for p in payloads)


def test_bad_input_names_the_thing(env: PrepEnv) -> None:
    with env.client() as client:
        bad = {"ops": [{"op": "decode"}, {"op": "blur", "sigma": 2}]}
        with pytest.raises(unstall.InvalidRequestError, match="prep op #1 'blur': unknown op"):
            prep.join("imgs", bad, batch_size=4, client=client)
        with pytest.raises(unstall.InvalidRequestError, match="random_resized_crop.*\"scale\""):
            prep.join("imgs", {"ops": [{"op": "decode"}, prep.random_resized_crop(8, scale=(0.9, 0.1))]},
                      batch_size=4, client=client)
        with pytest.raises(unstall.DatasetNotFoundError, match="nope"):
            prep.join("nope", PIPELINE_NCHW, batch_size=4, client=client)
        with pytest.raises(ValueError, match="batch_size"):
            prep.join("imgs", PIPELINE_NCHW, batch_size=0, client=client)
        m = prep.join("imgs", PIPELINE_NCHW, batch_size=4, seed=77, client=client)
        m.leave()
        with pytest.raises(unstall.DatasetNotFoundError, match=f"member {m.member} was left"):
            m.batch(0, 0)


def test_python_side_transforms_are_made_once_and_shared(env: PrepEnv, tmp_path: Path) -> None:
    outs = [tmp_path / f"py{i}.json" for i in range(2)]
    procs = [env.member(o, "torch-py", "4", "2", "2", "30", "0") for o in outs]
    logs = wait_all(procs)
    assert [p.returncode for p in procs] == [0, 0], logs
    results = [json.loads(o.read_text()) for o in outs]
    assert results[0]["info"]["group"] == results[1]["info"]["group"]
    _check_members_agree(results, [0, 1])  # torchvision crops made by one member, used by both
    assert results[0]["epochs"]["0"][0]["shape"] == [BATCH, 3, SIZE, SIZE]
    assert sum(r["made"] for r in results) == 2 * NUM_BATCHES, "each batch made by exactly one member"
    s = env.group_stats(results[0]["info"]["group"])
    assert s["prep"] == "members"
    assert s["batches_prepared_per_epoch"] == {"0": NUM_BATCHES, "1": NUM_BATCHES}
    assert s["batches_served"] == 2 * 2 * NUM_BATCHES
    assert sorted(s["batches_uploaded_by_member"].values()) == sorted(r["made"] for r in results if r["made"])
