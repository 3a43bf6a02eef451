"""Real sidecar, real DataLoader: every sample exactly once per epoch, right labels, exact bytes."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
import torchvision

import unstall
from unstall.torch import DataLoader, Dataset, decode_image, pil_loader
from batches import keep
from datagen import make_image_folder, make_tfrecord_shards

CLASSES = ["cat", "dog", "zebra"]


@pytest.fixture(scope="module")
def image_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("imgs"), CLASSES, per_class=9, seed=1)


@pytest.fixture(scope="module")
def tfrecord_root(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("tfr")
    return root, make_tfrecord_shards(root, shards=3, per_shard=11, seed=2)


def test_imagefolder_matches_torchvision(sidecar: unstall.Sidecar, image_root: Path) -> None:
    tv = torchvision.datasets.ImageFolder(str(image_root))
    ds = Dataset("tv-order", root=image_root, sidecar=sidecar)
    assert ds.classes == tv.classes and ds.class_to_idx == tv.class_to_idx
    assert len(ds) == len(tv.samples) == 27
    assert ds.info.total_bytes == sum(Path(p).stat().st_size for p, _ in tv.samples)
    batch = ds.fetch(range(len(ds)))
    assert batch.column("key").to_pylist() == [str(Path(p).relative_to(image_root)) for p, _ in tv.samples]
    assert batch.column("label").to_pylist() == [label for _, label in tv.samples]
    assert batch.column("payload").to_pylist() == [Path(p).read_bytes() for p, _ in tv.samples]


def test_same_decoded_tensors_as_torchvision(sidecar: unstall.Sidecar, image_root: Path) -> None:
    tv = torchvision.datasets.ImageFolder(str(image_root), transform=torchvision.transforms.PILToTensor())
    ours = Dataset("tv-decode", root=image_root, sidecar=sidecar, loader=pil_loader,
                   transform=torchvision.transforms.PILToTensor())
    raw = Dataset("tv-decode", sidecar=sidecar, loader=decode_image)
    for i in (0, 5, 26):
        (a, la), (b, lb), (c, _) = tv[i], ours[i], raw[i]
        assert la == lb and torch.equal(a, b) and torch.equal(a, c)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_imagefolder_each_sample_once_then_from_cache(
    sidecar: unstall.Sidecar, image_root: Path, num_workers: int
) -> None:
    tv = torchvision.datasets.ImageFolder(str(image_root))
    expected = Counter((Path(p).read_bytes(), label) for p, label in tv.samples)
    name = f"imgs-w{num_workers}"
    loader = DataLoader(name, root=str(image_root), sidecar=sidecar, batch_size=4, shuffle=True, seed=3,
                        num_workers=num_workers, collate_fn=keep)
    for _ in range(2):
        got = Counter(item for batch in loader for item in batch)
        assert got == expected
    st = sidecar.stats().dataset(name)
    total = sum(len(b) * n for (b, _), n in expected.items())
    assert st.epoch(0) == unstall.protocol.EpochStats(27, 0, 27, total, 0)
    assert st.epoch(1) == unstall.protocol.EpochStats(27, 27, 0, 0, total)  # capacity >= dataset: no storage reads
    assert sorted(st.epochs) == [0, 1]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_tfrecord_each_record_once(sidecar: unstall.Sidecar, tfrecord_root, num_workers: int) -> None:
    root, records = tfrecord_root
    name = f"tfr-w{num_workers}"
    ds = Dataset(name, root=root, format="tfrecord", sidecar=sidecar)
    assert ds.classes == [] and len(ds) == 33 and ds.info.total_bytes == sum(len(r.data) for r in records)
    batch = ds.fetch(range(len(ds)))
    assert batch.column("key").to_pylist() == [r.key for r in records]
    assert batch.column("label").null_count == len(records)
    loader = DataLoader(ds, batch_size=5, shuffle=True, num_workers=num_workers, persistent_workers=num_workers > 0,
                        collate_fn=keep)
    expected = Counter((r.data, r.key) for r in records)
    for _ in range(2):
        assert Counter(item for b in loader for item in b) == expected
    st = sidecar.stats().dataset(name)
    # epoch 0 of the stats includes the fetch above, then the loader's first epoch
    assert st.epoch(1).samples == 33 and st.epoch(1).hits == 33 and st.epoch(1).storage_bytes == 0


def test_single_file_tfrecord(sidecar: unstall.Sidecar, tfrecord_root) -> None:
    root, records = tfrecord_root
    ds = Dataset("tfr-one", root=root / "part-00001.tfrecord", format="tfrecord", sidecar=sidecar)
    assert len(ds) == 11
    assert [ds[i] for i in (0, 10)] == [(records[11].data, records[11].key), (records[21].data, records[21].key)]


def test_registration_is_idempotent_and_listed(sidecar: unstall.Sidecar, image_root: Path) -> None:
    a = sidecar.register_dataset("again", image_root)
    assert sidecar.register_dataset("again", image_root) == a
    assert "again" in {d.name for d in sidecar.list_datasets()}
    assert sidecar.describe("again") == a
    with sidecar.flight_client() as c:  # the data plane describes it the same way
        assert c.describe("again") == a
        assert "again" in {d.name for d in c.list_datasets()}
        assert c.stats().cache.policy == "minio"


def _damaged_png(size: int = 48) -> bytes:
    """A PNG whose image data has one byte changed and its CRC made right: libpng meets the error inflating it, which
    ends the process in torchvision's ``decode_png``."""
    import io
    import zlib

    import numpy as np
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(5).integers(0, 256, (size, size, 3), dtype=np.uint8)).save(out, "PNG")
    b = bytearray(out.getvalue())
    at = b.index(b"IDAT")
    length = int.from_bytes(b[at - 4:at], "big")
    b[at + 4 + length // 2] ^= 0xFF
    b[at + 4 + length:at + 8 + length] = zlib.crc32(b[at:at + 4 + length]).to_bytes(4, "big")
    return bytes(b)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_damaged_png_is_refused_naming_the_sample_not_a_crashed_worker(
    sidecar: unstall.Sidecar, tmp_path: Path, num_workers: int
) -> None:
    root = tmp_path / "imgs"
    make_image_folder(root, CLASSES, per_class=2, seed=3, extras=False)
    (root / CLASSES[1] / "damaged.png").write_bytes(_damaged_png())
    ds = Dataset(f"damaged-png-{num_workers}", root=root, sidecar=sidecar, loader=decode_image)
    keys = ds.fetch(range(len(ds))).column("key").to_pylist()
    assert all(ds[i][0].shape[0] == 3 for i, k in enumerate(keys) if k != f"{CLASSES[1]}/damaged.png"), \
        "every other sample decodes"
    dl = DataLoader(ds, batch_size=len(ds), num_workers=num_workers, collate_fn=keep)
    with pytest.raises(ValueError, match="decode_image: the PNG decoder rejected it") as e:
        next(iter(dl))
    assert f"in dataset 'damaged-png-{num_workers}', sample '{CLASSES[1]}/damaged.png'" in str(e.value) + "".join(
        getattr(e.value, "__notes__", []))
