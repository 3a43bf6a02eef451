"""Clairvoyant prefetch from a real DataLoader: the loader sends the epoch's order, the sidecar reads ahead
within its window, and every sample still arrives exactly once, byte for byte, with MinIO's arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest
from torchvision.datasets import ImageFolder

from batches import keep
from datagen import make_image_folder
from unstall.torch import DataLoader, Dataset

SIZE = 4096
K = 4


@pytest.mark.parametrize("num_workers", [0, 2])
def test_clairvoyant_loader_reads_each_miss_once_and_ahead(start_sidecar, tmp_path: Path, num_workers: int) -> None:
    root = tmp_path / "imgs"
    make_image_folder(root, ["a", "b", "c", "d"], per_class=10, seed=9, equal_size=SIZE)
    files = [Path(path) for path, _ in ImageFolder(str(root)).samples]
    n = len(files)
    sidecar = start_sidecar(
        cache_capacity=K * SIZE,
        extra_args=["--prefetch-window-bytes", str(12 * 8192), "--prefetch-window", "12", "--prefetch-threads", "2"],
    )
    ds = Dataset("ahead", root=root, sidecar=sidecar)
    loader = DataLoader(ds, batch_size=4, shuffle=True, seed=3, num_workers=num_workers, clairvoyant=True,
                        persistent_workers=num_workers > 0, collate_fn=keep)
    stored = sorted(p.read_bytes() for p in files)
    for epoch in range(2):
        seen = []
        for batch in loader:
            seen.extend(payload for payload, _ in batch)
        assert sorted(seen) == stored, f"epoch {epoch}: every sample exactly once, byte for byte"
    st = sidecar.stats().dataset("ahead")
    assert st.epoch(0).storage_bytes == n * SIZE
    assert st.epoch(1).hits == K
    assert st.epoch(1).storage_bytes == (n - K) * SIZE, "prefetch reads each miss exactly once"
    assert st.epoch(0).prefetch_hits + st.epoch(1).prefetch_hits > 0
