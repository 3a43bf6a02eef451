"""The never-evict cache, counted by the sidecar: storage reads per epoch match capacity arithmetic
exactly (equal-size samples, capacity = k samples)."""

from __future__ import annotations

from pathlib import Path

import pytest

from unstall.protocol import EpochStats
from unstall.torch import DataLoader, Dataset
from batches import keep
from datagen import make_image_folder, make_tfrecord_shards

SIZE = 4096  # every sample is exactly this many bytes
K = 5  # the cache holds exactly K samples


@pytest.mark.parametrize("num_workers", [0, 2])
def test_imagefolder_epochs_after_the_first_hit_exactly_k(start_sidecar, tmp_path: Path, num_workers: int) -> None:
    root = tmp_path / "imgs"
    make_image_folder(root, ["a", "b", "c", "d"], per_class=4, seed=5, equal_size=SIZE)
    n = 16
    sidecar = start_sidecar(cache_capacity=K * SIZE)
    ds = Dataset("eq", root=root, sidecar=sidecar)
    assert len(ds) == n and ds.info.total_bytes == n * SIZE
    loader = DataLoader(ds, batch_size=3, shuffle=True, seed=0, num_workers=num_workers,
                        persistent_workers=num_workers > 0, collate_fn=keep)
    for _ in range(3):
        assert sum(len(b) for b in loader) == n
    stats = sidecar.stats()
    st = stats.dataset("eq")
    assert st.epoch(0) == EpochStats(samples=n, hits=0, misses=n, storage_bytes=n * SIZE, cache_bytes=0)
    for e in (1, 2):  # MinIO: the first K admitted stay; every later epoch hits exactly K
        assert st.epoch(e) == EpochStats(samples=n, hits=K, misses=n - K, storage_bytes=(n - K) * SIZE,
                                         cache_bytes=K * SIZE)
    assert st.total.storage_bytes == (n + 2 * (n - K)) * SIZE
    assert (stats.cache.capacity_bytes, stats.cache.used_bytes, stats.cache.entries) == (K * SIZE, K * SIZE, K)


def test_tfrecord_cache_arithmetic_and_zero_storage_when_it_fits(start_sidecar, tmp_path: Path) -> None:
    make_tfrecord_shards(tmp_path / "small", shards=2, per_shard=6, size=SIZE, seed=6)
    make_tfrecord_shards(tmp_path / "fits", shards=1, per_shard=4, size=SIZE, seed=7)
    sidecar = start_sidecar(cache_capacity=K * SIZE)
    # "fits" first: its 4 records take 4 of the K slots, so "small" gets 1.
    fits = Dataset("fits", root=tmp_path / "fits", format="tfrecord", sidecar=sidecar)
    small = Dataset("small", root=tmp_path / "small", format="tfrecord", sidecar=sidecar)
    for ds in (fits, small):
        loader = DataLoader(ds, batch_size=4, shuffle=True, collate_fn=keep)
        for _ in range(2):
            list(loader)
    st = sidecar.stats()
    assert st.dataset("fits").epoch(1) == EpochStats(4, 4, 0, 0, 4 * SIZE)
    assert st.dataset("small").epoch(1) == EpochStats(12, 1, 11, 11 * SIZE, SIZE)
    assert st.cache.entries == K and st.cache.used_bytes == K * SIZE


def test_zero_capacity_disables_the_cache(start_sidecar, tmp_path: Path) -> None:
    make_tfrecord_shards(tmp_path / "r", shards=1, per_shard=3, size=100, seed=8)
    sidecar = start_sidecar(cache_capacity=0)
    ds = Dataset("nocache", root=tmp_path / "r", format="tfrecord", sidecar=sidecar)
    for epoch in range(2):
        ds.fetch([0, 1, 2], epoch=epoch)
    assert sidecar.stats().dataset("nocache").epoch(1) == EpochStats(3, 0, 3, 300, 0)
