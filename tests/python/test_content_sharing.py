"""Content sharing that is verified (issue 11): a dataset is served a cache entry only under a digest of
its own bytes. Two datasets whose files have the same sizes but other bytes never share entries, an
imported manifest of other content grants no hit (each claim is refused on first read, and counted), and a
persisted manifest of files rewritten under the same size and mtime is relearned, not trusted.

Every test reads through the real DataLoader of a real sidecar and compares every sample with its file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pytest
import torch

import unstall
from unstall.protocol import DatasetStats
from unstall.torch import DataLoader, Dataset

from batches import keep

CLASSES = ("c0", "c1", "c2", "c3")
PER_CLASS = 6  # 24 samples, as in the report
N = len(CLASSES) * PER_CLASS


def write_folder(root: Path, seed: int, sizes: Sequence[int]) -> list[bytes]:
    """An image folder of random bytes, sample i of ``sizes[i]`` bytes; returns the files' bytes in the
    sidecar's sample order (torchvision's: class, then file name). The same sizes with another seed give
    a dataset of the same shape and other content."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(N):
        path = root / CLASSES[i // PER_CLASS] / f"img{i % PER_CLASS:02d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = rng.integers(0, 256, sizes[i], dtype=np.uint8).tobytes()
        path.write_bytes(data)
        out.append(data)
    return out


def files_of(root: Path) -> list[Path]:
    return [root / CLASSES[i // PER_CLASS] / f"img{i % PER_CLASS:02d}.jpg" for i in range(N)]


SIZES = [3000 + 97 * (i % 7) for i in range(N)]


class Shuffled(torch.utils.data.Sampler[int]):
    """Another permutation each epoch, remembered so the test knows which sample each position asked for."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.epoch = 0
        self.orders: dict[int, list[int]] = {}

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        order = np.random.default_rng(self.epoch).permutation(self.n).tolist()
        self.orders[self.epoch] = order
        return iter(order)

    def __len__(self) -> int:
        return self.n


def read_epochs(ds: Dataset, own: list[bytes], epochs: int, start_epoch: int = 0, num_workers: int = 2) -> None:
    """Epochs ``start_epoch`` to ``start_epoch + epochs - 1`` of a shuffled DataLoader over ``ds``; every
    sample must be its own file's bytes."""
    sampler = Shuffled(len(ds))
    loader = DataLoader(ds, batch_size=5, sampler=sampler, num_workers=num_workers, collate_fn=keep,
                        persistent_workers=num_workers > 0, start_epoch=start_epoch)
    for epoch in range(start_epoch, start_epoch + epochs):
        got = [sample for batch in loader for sample, _ in batch]
        order = sampler.orders[epoch]
        wrong = [i for i, data in zip(order, got) if data != own[i]]
        assert len(got) == len(own) and not wrong, (
            f"dataset {ds.name!r} epoch {epoch}: samples {wrong} are not their own file's bytes")


def check_sample_order(ds: Dataset, root: Path) -> None:
    """The ids the tests index ``own`` by are the files in torchvision's order."""
    keys = ds.fetch(list(range(N)), epoch=99).column("key").to_pylist()
    assert keys == [str(p.relative_to(root)) for p in files_of(root)]


CONFIGS = {
    "minio": dict(cache_capacity="1MiB"),
    "lru": dict(cache_capacity="1MiB", extra_args=["--cache-policy", "lru"]),
    "disk": dict(cache_capacity=0, extra_args=["--disk-cache-dir"]),  # the tier's directory is appended
}


def start(start_sidecar, config: str, tmp_path: Path) -> unstall.Sidecar:
    opts = dict(CONFIGS[config])
    if config == "disk":
        opts["extra_args"] = [*opts["extra_args"], str(tmp_path / "disk")]
    return start_sidecar(**opts)


def served_from_tiers(sidecar: unstall.Sidecar, name: str, epoch: int) -> int:
    e = sidecar.stats().dataset(name).epoch(epoch)
    return e.hits + e.disk_hits


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_datasets_of_the_same_sizes_and_other_bytes_never_share_entries(start_sidecar, tmp_path: Path,
                                                                          config: str) -> None:
    sidecar = start(start_sidecar, config, tmp_path)
    own = {name: write_folder(tmp_path / name, seed, SIZES) for name, seed in (("first", 1), ("second", 2))}
    datasets = {name: Dataset(f"{name}-{config}", root=tmp_path / name, sidecar=sidecar) for name in own}
    for name, ds in datasets.items():  # the first is cached before the second reads a byte
        read_epochs(ds, own[name], epochs=2)
    for name, ds in datasets.items():  # and the first again, after the second was cached
        read_epochs(ds, own[name], epochs=1, start_epoch=2)
        # from the second epoch on every sample came from a cache tier: the check ran on cached bytes
        for epoch in (1, 2):
            assert served_from_tiers(sidecar, ds.name, epoch) == N, sidecar.stats().dataset(ds.name)
    assert sidecar.stats().cache.shared_bytes == 0
    check_sample_order(datasets["first"], tmp_path / "first")


@pytest.mark.parametrize("config", ["minio", "disk"])
def test_an_imported_manifest_of_other_content_grants_no_hit_and_mismatches_are_counted(
        start_sidecar, tmp_path: Path, config: str) -> None:
    sidecar = start(start_sidecar, config, tmp_path)
    exporter = write_folder(tmp_path / "a", 1, SIZES)
    read_epochs(Dataset(f"a-{config}", root=tmp_path / "a", sidecar=sidecar), exporter, epochs=1)
    manifest = sidecar.home / "a.manifest"  # manifests live under the sidecar home (or an --allow-root)
    exported = sidecar.export_manifest(f"a-{config}", manifest)
    assert (exported.known, exported.num_samples) == (N, N)

    other = write_folder(tmp_path / "other", 2, SIZES)  # the sizes the manifest lists, other bytes
    ds = Dataset(f"other-{config}", root=tmp_path / "other", sidecar=sidecar,
                 options={"manifest": str(manifest)})
    read_epochs(ds, other, epochs=2)
    st = sidecar.stats().dataset(ds.name)
    assert (st.epoch(0).hits, st.epoch(0).disk_hits) == (0, 0), "the exporter's entries were served"
    assert (st.epoch(0).verify_mismatches, st.epoch(0).verified) == (N, 0)
    assert st.epoch(0).storage_bytes == sum(SIZES), "each sample read from its own storage"
    assert st.epoch(1).verify_mismatches == 0, "a claim is checked once"
    assert served_from_tiers(sidecar, ds.name, 1) == N, "its own bytes' entries serve the next epoch"

    # The same manifest given to a dataset of the exporter's content: every claim holds.
    assert write_folder(tmp_path / "same", 1, SIZES) == exporter
    same = Dataset(f"same-{config}", root=tmp_path / "same", sidecar=sidecar,
                   options={"manifest": str(manifest)})
    read_epochs(same, exporter, epochs=1, num_workers=0)
    e0 = sidecar.stats().dataset(same.name).epoch(0)
    assert (e0.verified, e0.verify_mismatches) == (N, 0)


def test_a_persisted_manifest_of_files_rewritten_under_the_same_size_and_mtime_is_relearned(
        start_sidecar, tmp_path: Path) -> None:
    size = 3 * 4096  # the change lies between the 4 KiB edges that a file's pin checks
    old = write_folder(tmp_path / "data", 3, [size] * N)
    disk = ["--disk-cache-dir", str(tmp_path / "disk")]

    def run(expected: list[bytes]) -> DatasetStats:
        """Two epochs through a new sidecar on the same disk tier (stopped after, which checkpoints)."""
        with start_sidecar(cache_capacity=0, extra_args=disk) as sidecar:
            read_epochs(Dataset("d", root=tmp_path / "data", sidecar=sidecar), expected, epochs=2, num_workers=0)
            return sidecar.stats().dataset("d")

    run(old)
    assert list((tmp_path / "disk" / "manifests").glob("*.manifest")), "the manifest was persisted"
    unchanged = run(old)
    assert unchanged.epoch(0).disk_hits == N, "a restart trusts the manifest of unchanged files"

    new = []
    for path, data in zip(files_of(tmp_path / "data"), old):
        st = os.stat(path)
        middle = bytes(b ^ 0x5A for b in data[4096:8192])
        changed = data[:4096] + middle + data[8192:]
        path.write_bytes(changed)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # as a copy that preserves times leaves it
        assert os.stat(path).st_mtime_ns == st.st_mtime_ns and os.stat(path).st_size == size
        new.append(changed)

    rewritten = run(new)
    assert rewritten.epoch(0).disk_hits == 0, "entries of the old bytes were served"
    assert rewritten.epoch(0).storage_bytes == N * size, "the digests were relearned from storage"
    assert rewritten.epoch(1).disk_hits == N
