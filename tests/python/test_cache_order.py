"""``DataLoader(order="cache_first")`` over a real sidecar whose MinIO cache holds a third of the dataset: every
sample once per epoch, the order a function of (seed, epoch, cache snapshot), moves bounded by the window, cached
samples served first in each window, the misses read ahead in the order they are served, and a mid-epoch state
that a new loader (on a sidecar with another cache) continues in exactly the same order."""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import pytest
import torch.utils.data as tud
from torchvision.datasets import ImageFolder

from batches import keep
from datagen import make_image_folder
from unstall.cache_order import cache_first, decode_snapshot, encode_snapshot, snapshot_digest, window_positions
from unstall.sampling import EpochSampler
from unstall.recovery import Deadlines
from unstall.torch import DataLoader, Dataset
from waits import send_signal, wait_until

SIZE = 4096
N = 48  # 4 classes of 12
K = 16  # samples the cache holds: the dataset is 3x the cache
BATCH = 4
W = 4 * BATCH  # the default window
SEED = 5


def _dataset(tmp_path: Path) -> tuple[Path, dict[bytes, int]]:
    root = tmp_path / "imgs"
    make_image_folder(root, ["a", "b", "c", "d"], per_class=N // 4, seed=9, equal_size=SIZE)
    files = [Path(path) for path, _ in ImageFolder(str(root)).samples]
    ids = {p.read_bytes(): i for i, p in enumerate(files)}
    assert len(ids) == N, "every sample's bytes differ: they name it"
    return root, ids


def _epoch(loader: DataLoader, ids: dict[bytes, int]) -> list[int]:
    return [ids[payload] for batch in loader for payload, _ in batch]


def _seeded(epoch: int) -> list[int]:
    """The plain order of ``epoch``: what ``shuffle=True, seed=SEED`` draws without reordering."""
    s = EpochSampler(tud.RandomSampler(range(N)), seed=SEED)
    s.set_epoch(epoch)
    return [i.index for i in s]


def _first_half_hits(order: list[int], cached: np.ndarray) -> float:
    """The hit fraction of the first half of every window of ``order``."""
    firsts = [order[p] for p in range(len(order)) if p % W < W // 2]
    return float(np.mean(cached[firsts]))


def test_window_positions_keep_each_position_once_within_its_window() -> None:
    rng = np.random.default_rng(0)
    for n, w in [(0, 3), (1, 1), (10, 1), (37, 8), (64, 16)]:
        hits = rng.random(n) < 0.4
        pos = window_positions(hits, w)
        assert sorted(pos.tolist()) == list(range(n))
        assert all(p // w == j // w for j, p in enumerate(pos.tolist())), "no sample leaves its window"
        for start in range(0, n, w):
            served = hits[pos[start:start + w]]
            assert list(served) == sorted(served, reverse=True), "a window's hits come before its misses"
    cached = rng.random(100) < 0.3
    assert np.array_equal(decode_snapshot(encode_snapshot(cached), 100, "t"), cached)
    with pytest.raises(ValueError, match="t: 'cache_snapshot' holds 104 bits, not those of a dataset of 90 samples"):
        decode_snapshot(encode_snapshot(cached), 90, "t")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_each_sample_once_deterministic_for_the_snapshot_and_cached_first(start_sidecar, tmp_path: Path,
                                                                         num_workers: int) -> None:
    root, ids = _dataset(tmp_path)
    sidecar = start_sidecar(cache_capacity=K * SIZE)
    ds = Dataset("cachefirst", root=root, sidecar=sidecar)
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, seed=SEED, num_workers=num_workers, order="cache_first",
                        persistent_workers=num_workers > 0, collate_fn=keep)
    for epoch in range(3):
        snapshot = ds.cached()  # what the loader's one query at the epoch's start sees: nothing runs in between
        served = _epoch(loader, ids)
        assert sorted(served) == list(range(N)), f"epoch {epoch}: every sample exactly once"
        seeded = _seeded(epoch)
        assert served == cache_first(seeded, snapshot, W), "the order is a function of (seed, epoch, snapshot)"
        stats = loader.order_stats
        assert stats is not None and stats.epoch == epoch and stats.window == W
        assert stats.snapshot_digest == snapshot_digest(snapshot)
        moved = [abs(served.index(i) - seeded.index(i)) for i in range(N)]
        assert stats.max_displacement == max(moved) < W
        assert stats.cached == int(snapshot.sum()) == (0 if epoch == 0 else K)
        seen = loader.stats()
        assert (seen.order_spearman, seen.order_max_displacement) == (stats.spearman, stats.max_displacement)
        if epoch == 0:  # a cold cache: nothing to serve first, the seeded order as it is
            assert served == seeded and stats.spearman == 1.0
        else:
            assert _first_half_hits(served, snapshot) > _first_half_hits(seeded, snapshot)
            assert 0.0 < stats.spearman < 1.0
    st = sidecar.stats().dataset("cachefirst")
    assert [st.epoch(e).hits for e in (1, 2)] == [K, K], "MinIO's hits, whatever the order"

    again = DataLoader(ds, batch_size=BATCH, shuffle=True, seed=SEED, order="cache_first", collate_fn=keep)
    again.set_epoch(2)
    digest = snapshot_digest(ds.cached())
    assert digest == loader.order_stats.snapshot_digest, "MinIO never evicts: the same snapshot as epoch 2's"
    assert _epoch(again, ids) == served, "another loader, same seed, epoch and snapshot: the same order"


def test_a_mid_epoch_state_continues_the_same_order_on_another_cache(start_sidecar, tmp_path: Path) -> None:
    root, ids = _dataset(tmp_path)
    warm = start_sidecar(cache_capacity=K * SIZE)
    ds = Dataset("resumed", root=root, sidecar=warm)
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, seed=SEED, order="cache_first", collate_fn=keep)
    _epoch(loader, ids)  # fills the cache
    flight = Dataset("resumed", sidecar=warm, transport="flight")
    assert np.array_equal(flight.cached(), ds.cached()), "the cached action answers as the local socket's CACHED"
    it = iter(loader)
    head = [ids[payload] for _ in range(5) for payload, _ in next(it)]
    state = loader.state_dict()
    rest = [ids[payload] for batch in it for payload, _ in batch]
    assert state["batches_yielded"] == 5 and state["cache_window"] == W and "cache_snapshot" in state
    assert sorted(head + rest) == list(range(N))
    assert head + rest != _seeded(1), "epoch 1 was reordered (the restore below would not tell otherwise)"

    cold = start_sidecar(cache_capacity=K * SIZE)  # an empty cache: a new snapshot would give another order
    restored = DataLoader(Dataset("resumed", root=root, sidecar=cold), batch_size=BATCH, shuffle=True, seed=SEED,
                          order="cache_first", collate_fn=keep)
    restored.load_state_dict(state)
    assert restored.state_dict() == state, "a restored state, taken again before iterating, is the same"
    assert _epoch(restored, ids) == rest, "the very next batch on, in the same order"
    snapshot = restored.dataset.cached()
    assert _epoch(restored, ids) == cache_first(_seeded(2), snapshot, W), "the next epoch: the new sidecar's snapshot"

    plain = DataLoader(ds, batch_size=BATCH, shuffle=True, seed=SEED, collate_fn=keep)
    with pytest.raises(ValueError, match="order='cache_first'; this one's order is 'sampler'"):
        plain.load_state_dict(state)
    other = DataLoader(ds, batch_size=BATCH, shuffle=True, seed=SEED, order="cache_first", order_window=8,
                       collate_fn=keep)
    with pytest.raises(ValueError, match="order_window=16; this loader's is 8"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="order='sampler'; this one's order is 'cache_first'"):
        restored.load_state_dict(plain.state_dict())
    with pytest.raises(ValueError, match="order must be one of 'sampler', 'cache_first', got 'cached'"):
        DataLoader(ds, order="cached")
    with pytest.raises(ValueError, match="order_window .* must be an int >= 1, got 0"):
        DataLoader(ds, order="cache_first", order_window=0)


def test_the_misses_are_read_ahead_in_the_order_they_are_served(start_sidecar, tmp_path: Path) -> None:
    root, ids = _dataset(tmp_path)
    ahead = 2 * BATCH  # the sidecar's prefetch window: samples it reads beyond those served
    sidecar = start_sidecar(cache_capacity=K * SIZE,
                            extra_args=["--prefetch-window", str(ahead), "--prefetch-window-bytes", "1MiB"])
    ds = Dataset("ahead", root=root, sidecar=sidecar)
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, seed=SEED, order="cache_first", collate_fn=keep)
    _epoch(loader, ids)
    snapshot = ds.cached()
    planned = cache_first(_seeded(1), snapshot, W)

    def read() -> int:
        return sidecar.stats().dataset("ahead").epoch(1).storage_bytes

    it = iter(loader)
    first = [ids[payload] for payload, _ in next(it)]  # the plan went out as the epoch started
    # The prefetcher walks the served order up to `ahead` positions past the samples served, skipping the cached:
    # after one batch it has read exactly the misses up to there, not the seeded order's next misses.
    reach = BATCH + ahead + 1
    wait_until(lambda: read() == SIZE * int(np.count_nonzero(~snapshot[planned[:reach]])),
               "the misses of the first positions of the served order read ahead")
    rest = [ids[payload] for batch in it for payload, _ in batch]
    assert first + rest == planned
    e = sidecar.stats().dataset("ahead").epoch(1)
    assert e.hits == K and e.storage_bytes == (N - K) * SIZE, "every miss read once"
    assert e.prefetch_hits >= int(np.count_nonzero(~snapshot[planned[BATCH:reach]])), \
        "the misses read ahead while the first batch was in hand were served from the read-ahead"
    assert loader.stats().prefetch_hits == e.prefetch_hits


def test_a_sidecar_without_prefetch_serves_the_same_order(start_sidecar, tmp_path: Path) -> None:
    root, ids = _dataset(tmp_path)
    sidecar = start_sidecar(cache_capacity=K * SIZE, extra_args=["--prefetch-window-bytes", "0"])
    ds = Dataset("noahead", root=root, sidecar=sidecar)
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, seed=SEED, order="cache_first", collate_fn=keep)
    with pytest.warns(RuntimeWarning, match="'noahead', order='cache_first': the sidecar refused the read-ahead plan"):
        assert sorted(_epoch(loader, ids)) == list(range(N))
    snapshot = ds.cached()
    assert _epoch(loader, ids) == cache_first(_seeded(1), snapshot, W), "warned once, then reordered as ever"
    assert sidecar.stats().dataset("noahead").epoch(1).prefetch_hits == 0


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_sidecar_killed_mid_epoch_changes_nothing_of_the_order(start_sidecar, tmp_path: Path,
                                                                 num_workers: int) -> None:
    root, ids = _dataset(tmp_path)
    fast = Deadlines(call=5.0, index=60.0, health_interval=0.3, health=1.5, recovery=120.0)
    sidecar = start_sidecar(cache_capacity=K * SIZE, deadlines=fast)
    ds = Dataset("restarted", root=root, sidecar=sidecar)
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, seed=SEED, num_workers=num_workers, order="cache_first",
                        persistent_workers=num_workers > 0, collate_fn=keep)
    assert sorted(_epoch(loader, ids)) == list(range(N))
    snapshot = ds.cached()
    served: list[int] = []
    for step, batch in enumerate(loader):
        served.extend(ids[payload] for payload, _ in batch)
        if step == 3:
            send_signal(sidecar.pid, signal.SIGKILL)
    assert served == cache_first(_seeded(1), snapshot, W), "the epoch's order was fixed when it started"
    wait_until(lambda: sidecar.restarts == 1 and sidecar.healthy(), "the restarted sidecar")
    for epoch in (2, 3):  # each epoch reordered from the new sidecar's snapshot
        snapshot = ds.cached()
        after = _epoch(loader, ids)
        assert sorted(after) == list(range(N)), f"epoch {epoch}, on the new sidecar, is whole"
        assert after == cache_first(_seeded(epoch), snapshot, W)
        assert loader.order_stats is not None and loader.order_stats.epoch == epoch
        assert loader.order_stats.cached == K, "the rest of epoch 1 filled the new sidecar's cache"
