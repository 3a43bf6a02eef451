"""``prep.PrepLoader(order="cache_first")`` over a real sidecar whose MinIO cache holds a third of the dataset: the
group reorders each epoch's seeded order cached samples first within windows of ``order_window`` positions, from one
snapshot per epoch; every member reads that one order, every sample once per epoch; a loader restored mid-epoch on
a restarted sidecar (another cache) continues the very same order."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import numpy as np

from datagen import make_image_folder
from unstall import prep
from unstall.cache_order import cache_first, decode_snapshot
from unstall.recovery import Deadlines
from unstall.torch import Dataset
from waits import send_signal, wait_until

SIZE = 4096
N = 48  # 4 classes of 12
K = 16  # samples the cache holds: the dataset is 3x the cache
BATCH = 4
W = 8
SEED = 5


def _register(sidecar: Any, tmp_path: Path, name: str) -> None:
    root = tmp_path / name
    make_image_folder(root, ["a", "b", "c", "d"], per_class=N // 4, seed=9, equal_size=SIZE, extras=False)
    sidecar.register_dataset(name, root)


def _loader(sidecar: Any, name: str, **kwargs: Any) -> prep.PrepLoader:
    return prep.PrepLoader(name, None, batch_size=BATCH, seed=SEED, with_ids=True, sidecar=sidecar,
                           transport="flight", **kwargs)


def _epoch(loader: prep.PrepLoader) -> list[int]:
    return [int(i) for _payloads, _labels, ids in loader for i in ids.tolist()]


def _snapshot(loader: prep.PrepLoader, epoch: int) -> np.ndarray:
    text = loader.membership.cache_snapshot(epoch)
    assert text is not None, f"the member knows epoch {epoch}'s snapshot"
    return decode_snapshot(text, N, "test")


def test_members_read_one_cache_first_order_each_sample_once(start_sidecar, tmp_path: Path) -> None:
    sidecar = start_sidecar(cache_capacity=K * SIZE)
    _register(sidecar, tmp_path, "shared")
    with _loader(sidecar, "shared", epochs=3) as plain:  # the seeded order (another group: "order" is in the key)
        seeded = [_epoch(plain) for _ in range(3)]
    members = [_loader(sidecar, "shared", epochs=3, group_size=2, order="cache_first", order_window=W)
               for _ in range(2)]
    read: list[list[list[int]]] = [[], []]
    snapshots: list[list[np.ndarray]] = [[], []]  # a member keeps the snapshot of the epoch it reads only

    def run(k: int) -> None:
        for epoch in range(3):
            read[k].append(_epoch(members[k]))
            snapshots[k].append(_snapshot(members[k], epoch))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert members[0].membership.group == members[1].membership.group, "one group"
    for epoch in range(3):
        order = read[0][epoch]
        assert read[1][epoch] == order, f"epoch {epoch}: both members read the same order"
        assert sorted(order) == list(range(N)), f"epoch {epoch}: every sample exactly once"
        snapshot = snapshots[0][epoch]
        assert np.array_equal(snapshots[1][epoch], snapshot), f"epoch {epoch}: one snapshot for the group"
        assert snapshot.sum() == K, "the seeded group's epochs filled the cache"
        assert order == cache_first(seeded[epoch], snapshot, W), "the shim's rule on the group's seeded order"
        for start in range(0, N, W):
            hits = snapshot[order[start:start + W]].tolist()
            assert hits == sorted(hits, reverse=True), f"epoch {epoch}: a window's hits come before its misses"
        # MinIO keeps the first K samples whose reads finished in epoch 0 (two producers and the read-ahead run at
        # once, so which ones is the machine's timing); the later epochs' seeded orders put misses before hits
        if epoch > 0:
            assert order != seeded[epoch], f"epoch {epoch}: reordered"
    stats = members[0].membership.group_stats()
    assert (stats["order"], stats["order_window"]) == ("cache_first", W)
    assert stats["remote_workers"].startswith("refused: a cache_first order")
    for m in members:
        m.close()

    with _loader(sidecar, "shared", epochs=1, order="cache_first", order_window=W) as again:
        first = _epoch(again)
        assert np.array_equal(_snapshot(again, 0), snapshots[0][0]), "MinIO never evicts"
    assert first == read[0][0], "another group, same seed and snapshot: the same order"


def test_a_member_restored_mid_epoch_on_a_restarted_sidecar_reads_the_rest(start_sidecar, tmp_path: Path) -> None:
    fast = Deadlines(call=5.0, index=60.0, health_interval=0.3, health=1.5, recovery=120.0)
    sidecar = start_sidecar(cache_capacity=K * SIZE, deadlines=fast)
    _register(sidecar, tmp_path, "resumed")
    loader = _loader(sidecar, "resumed", epochs=2, order="cache_first", order_window=W)
    assert sorted(_epoch(loader)) == list(range(N))  # fills the cache
    served: list[int] = []
    state: dict[str, Any] = {}
    for step, (_payloads, _labels, ids) in enumerate(loader):
        served.extend(int(i) for i in ids.tolist())
        if step == 2:
            state = loader.state_dict()
            send_signal(sidecar.pid, signal.SIGKILL)
    assert sorted(served) == list(range(N)), "the member rejoined the restarted sidecar in the same order"
    assert loader.membership.rejoins == 1
    snapshot = _snapshot(loader, 1)
    assert snapshot.sum() == K and served[:W] != sorted(served[:W]), "epoch 1 was ordered from a warm cache"
    assert state["batches_yielded"] == 3 and state["cache_window"] == W
    assert state["cache_snapshot"] == loader.membership.cache_snapshot(1)
    loader.close()
    wait_until(lambda: sidecar.restarts == 1 and sidecar.healthy(), "the restarted sidecar")

    now = Dataset("resumed", sidecar=sidecar, transport="flight").cached()
    assert now.sum() == K and not np.array_equal(now, snapshot), "the restarted sidecar caches others"
    restored = _loader(sidecar, "resumed", epochs=2, order="cache_first", order_window=W)
    restored.load_state_dict(state)
    assert _epoch(restored) == served[3 * BATCH:], "exactly the rest of the epoch, in the same order"
    restored.close()
