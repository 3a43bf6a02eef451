"""Datasets in an S3 bucket: a real S3-API server (S3Proxy in its own JVM), objects uploaded with boto3, a
real sidecar configured the AWS way (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...), and real torch DataLoaders.

Needs ``tests/target/s3proxy.classpath`` (``mvn -pl tests -am package``); skipped without it.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
import torchvision

import unstall
from unstall.sidecar import find_java
from unstall.torch import DataLoader, Dataset, pil_loader
from conftest import SidecarFactory
from batches import keep
from datagen import make_image_folder
from s3proxy import ACCESS_KEY, SECRET_KEY, S3Proxy, S3ProxyMissing

boto3 = pytest.importorskip("boto3")

BUCKET = "train"
CLASSES = ["cat", "dog", "zebra"]


@pytest.fixture(scope="session")
def s3_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Proxy]:
    """S3Proxy (transient blob store) on a free loopback port, as its own process."""
    try:
        proxy = S3Proxy(tmp_path_factory.mktemp("s3proxy") / "s3proxy.log", java=find_java(),
                        access_key=ACCESS_KEY, secret_key=SECRET_KEY)
    except S3ProxyMissing as e:
        pytest.skip(str(e))
    with proxy:
        yield proxy


@pytest.fixture(scope="session")
def s3_endpoint(s3_proxy: S3Proxy) -> str:
    return s3_proxy.endpoint


@pytest.fixture(scope="session")
def s3(s3_proxy: S3Proxy) -> Any:
    """A boto3 client for uploads and deletions, the way users upload datasets."""
    client = s3_proxy.client()
    client.create_bucket(Bucket=BUCKET)
    return client


def upload_tree(s3: Any, local: Path, prefix: str) -> dict[str, bytes]:
    """Uploads every file below ``local`` to ``s3://BUCKET/prefix/...``; returns relative path -> bytes."""
    files = {}
    for p in sorted(local.rglob("*")):
        if p.is_file():
            rel = p.relative_to(local).as_posix()
            data = p.read_bytes()
            s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{rel}", Body=data)
            files[rel] = data
    return files


@pytest.fixture(scope="session")
def image_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local ImageFolder (real JPEG/PNG, a nested directory, upper-case extensions, a non-image file)."""
    return make_image_folder(tmp_path_factory.mktemp("s3imgs"), CLASSES, per_class=8, seed=5)


@pytest.fixture(scope="session")
def s3_images(s3: Any, image_root: Path) -> dict[str, bytes]:
    return upload_tree(s3, image_root, "imgs")


def aws_env(monkeypatch: pytest.MonkeyPatch, endpoint: str, secret: str = SECRET_KEY) -> None:
    """What an S3 user exports before starting the trainer (and so the sidecar)."""
    for var in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_S3_FORCE_PATH_STYLE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    # No read-ahead: a sample is read when its batch is asked for, so "deleted mid-epoch" is deterministic.
    monkeypatch.setenv("UNSTALL_PREFETCH_WINDOW_BYTES", "0")


@pytest.fixture(scope="session")
def s3_sidecar(start_sidecar: SidecarFactory, s3_endpoint: str) -> unstall.Sidecar:
    """A sidecar whose environment points the AWS SDK at the S3 server (it inherits ours at start)."""
    with pytest.MonkeyPatch.context() as mp:
        aws_env(mp, s3_endpoint)
        return start_sidecar("64MiB")


def digest_and_image(data: bytes) -> tuple[str, torch.Tensor]:
    """Loader: the payload's SHA-256 (to check bytes and coverage) and the decoded image as floats."""
    image = torchvision.transforms.functional.pil_to_tensor(pil_loader(data))
    return hashlib.sha256(data).hexdigest(), image.float().div_(255)


def collate(items: list[tuple[tuple[str, torch.Tensor], int]]) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    return [s[0] for s, _ in items], torch.stack([s[1] for s, _ in items]), torch.tensor([y for _, y in items])


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 2])
def test_training_over_a_bucket_sees_every_object_once_per_epoch(
    s3_sidecar: unstall.Sidecar, s3_images: dict[str, bytes], image_root: Path, num_workers: int
) -> None:
    tv = torchvision.datasets.ImageFolder(str(image_root))
    name = f"s3-imgs-w{num_workers}"
    ds = Dataset(name, root=f"s3://{BUCKET}/imgs", sidecar=s3_sidecar, loader=digest_and_image)
    assert ds.info.uri == f"s3://{BUCKET}/imgs/"
    assert ds.classes == tv.classes and len(ds) == len(tv.samples) == 24
    keys = [Path(p).relative_to(image_root).as_posix() for p, _ in tv.samples]
    batch = ds.fetch(range(len(ds)))  # torchvision's order, labels and the uploaded objects' exact bytes
    assert batch.column("key").to_pylist() == keys
    assert batch.column("label").to_pylist() == [label for _, label in tv.samples]
    assert batch.column("payload").to_pylist() == [s3_images[k] for k in keys]

    expected = Counter((hashlib.sha256(s3_images[k]).hexdigest(), label) for k, (_, label) in zip(keys, tv.samples))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 24 * 32, len(CLASSES)))
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(ds, batch_size=5, shuffle=True, seed=7, num_workers=num_workers,
                        persistent_workers=num_workers > 0, collate_fn=collate)
    for _ in range(2):
        seen: Counter[tuple[str, int]] = Counter()
        for digests, x, y in loader:
            assert x.shape[1:] == (3, 24, 32)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            assert torch.isfinite(loss)
            seen.update(zip(digests, y.tolist()))
        assert seen == expected
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))

    st = s3_sidecar.stats().dataset(name)
    total = sum(len(s3_images[k]) for k in keys)
    # epoch 0: the fetch above, then the loader's first epoch; epoch 1 comes from the cache (64 MiB), not S3
    e0 = st.epoch(0)
    assert e0.samples == 48 and e0.hits + e0.misses == 48 and e0.storage_bytes + e0.cache_bytes == 2 * total
    assert st.epoch(1) == unstall.protocol.EpochStats(24, 24, 0, 0, total)


def test_tfrecord_shards_in_a_bucket(s3_sidecar: unstall.Sidecar, s3: Any, tmp_path: Path) -> None:
    from datagen import make_tfrecord_shards

    records = make_tfrecord_shards(tmp_path, shards=2, per_shard=6, seed=9)
    upload_tree(s3, tmp_path, "tfr")
    ds = Dataset("s3-tfr", root=f"s3://{BUCKET}/tfr", format="tfrecord", sidecar=s3_sidecar)
    loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, collate_fn=keep)
    assert Counter(item for b in loader for item in b) == Counter((r.data, r.key) for r in records)


def test_a_missing_bucket_is_named_and_the_sidecar_keeps_serving(
    s3_sidecar: unstall.Sidecar, s3_endpoint: str, s3_images: dict[str, bytes]
) -> None:
    with pytest.raises(unstall.SidecarError) as e:
        Dataset("s3-nobucket", root="s3://no-such-bucket/imgs", sidecar=s3_sidecar)
    assert f"bucket 'no-such-bucket' does not exist at {s3_endpoint}" in str(e.value)
    batch = Dataset("s3-after-missing", root=f"s3://{BUCKET}/imgs", sidecar=s3_sidecar).fetch([0, 23])
    assert batch.column("payload").to_pylist() == [s3_images[k] for k in batch.column("key").to_pylist()]


def test_an_object_deleted_mid_epoch_names_it_and_the_sidecar_keeps_serving(
    s3_sidecar: unstall.Sidecar, s3: Any, tmp_path: Path
) -> None:
    make_image_folder(tmp_path, ["a", "b"], per_class=6, seed=8, extras=False)
    files = upload_tree(s3, tmp_path, "mid")
    tv = torchvision.datasets.ImageFolder(str(tmp_path))
    order = [(Path(p).relative_to(tmp_path).as_posix(), label) for p, label in tv.samples]
    ds = Dataset("s3-mid", root=f"s3://{BUCKET}/mid", sidecar=s3_sidecar)
    loader = DataLoader(ds, batch_size=2, shuffle=False, num_workers=2, collate_fn=keep)
    it = iter(loader)
    assert next(it) == [(files[k], label) for k, label in order[:2]]
    victim = order[-1][0]  # in the last batch: no worker has asked for it yet (no read-ahead, see aws_env)
    s3.delete_object(Bucket=BUCKET, Key=f"mid/{victim}")
    with pytest.raises(unstall.DataFileNotFoundError) as e:
        for _ in it:
            pass
    assert f"dataset 's3-mid' sample {len(order) - 1}: file 's3://{BUCKET}/mid/{victim}' no longer exists" in str(e.value)
    assert ds[3] == (files[order[3][0]], order[3][1])  # the sidecar still serves the dataset's other objects


def test_bad_credentials_are_refused_naming_the_location(
    start_sidecar: SidecarFactory, s3_endpoint: str, s3_images: dict[str, bytes]
) -> None:
    with pytest.MonkeyPatch.context() as mp:
        aws_env(mp, s3_endpoint, secret="not-the-secret")
        bad = start_sidecar("1MiB")
    try:
        with pytest.raises(unstall.SidecarError) as e:
            bad.register_dataset("s3-badcreds", f"s3://{BUCKET}/imgs")
        msg = str(e.value)
        assert f"s3://{BUCKET}/imgs/: access denied by {s3_endpoint}" in msg and "HTTP 403" in msg
        assert "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE" in msg
        assert bad.list_datasets() == []  # nothing half-registered; the sidecar still answers
    finally:
        bad.close()


def test_parquet_files_in_a_bucket(s3_sidecar: unstall.Sidecar, s3: Any, tmp_path: Path) -> None:
    from datagen import make_parquet_files
    from format_checks import check_parquet

    rows = make_parquet_files(tmp_path / "pq", files=2, rows=17, row_group_size=4, seed=4)
    upload_tree(s3, tmp_path / "pq", "pq")
    ds = Dataset("s3-pq", root=f"s3://{BUCKET}/pq", format="parquet", options={"label": "label"}, sidecar=s3_sidecar)
    check_parquet(ds, rows)


def test_hdf5_file_in_a_bucket_is_indexed_and_read_by_ranges(
    s3_sidecar: unstall.Sidecar, s3: Any, tmp_path: Path
) -> None:
    from datagen import make_hdf5_file
    from format_checks import check_hdf5

    path = tmp_path / "h5" / "train.h5"
    make_hdf5_file(path, rows=26, seed=6)
    upload_tree(s3, tmp_path / "h5", "h5")
    for dataset in ("images", "features"):
        ds = Dataset(f"s3-h5-{dataset}", root=f"s3://{BUCKET}/h5/train.h5", format="hdf5",
                     options={"dataset": dataset, "label": "labels"}, sidecar=s3_sidecar)
        check_hdf5(ds, path, dataset)
    # a truncated object is named with the offset its data would need
    data = path.read_bytes()
    s3.put_object(Bucket=BUCKET, Key="h5cut/cut.h5", Body=data[: len(data) // 2])
    with pytest.raises(unstall.SidecarError, match=r"s3://train/h5cut/cut.h5.*\(\d+ bytes\)"):
        Dataset("s3-h5-cut", root=f"s3://{BUCKET}/h5cut/cut.h5", format="hdf5", options={"dataset": "features"},
                sidecar=s3_sidecar)


def test_a_truncated_parquet_object_is_named(s3_sidecar: unstall.Sidecar, s3: Any, tmp_path: Path) -> None:
    from datagen import make_parquet_files

    make_parquet_files(tmp_path / "pq", files=1, rows=6, row_group_size=3)
    data = (tmp_path / "pq" / "part-0.parquet").read_bytes()
    s3.put_object(Bucket=BUCKET, Key="pqcut/part-0.parquet", Body=data[:-40])
    with pytest.raises(unstall.SidecarError, match=rf"s3://train/pqcut/part-0.parquet' \({len(data) - 40} bytes\)"):
        Dataset("s3-pq-cut", root=f"s3://{BUCKET}/pqcut", format="parquet", sidecar=s3_sidecar)
@pytest.mark.parametrize("fmt", ["webdataset", "npy", "npz", "csv"])
def test_formats_in_a_bucket(s3_sidecar: unstall.Sidecar, s3: Any, tmp_path: Path, fmt: str) -> None:
    """Each format's files, written by its reference writer and uploaded: every sample exactly, with its label,
    over 2 epochs of a 2-worker DataLoader; then a truncated copy is refused naming its object and offset."""
    from format_cases import assert_epochs, csv_case, npy_case, npz_case, webdataset_case

    make = {"webdataset": lambda r: webdataset_case(r, payload=True), "npy": npy_case, "npz": npz_case,
            "csv": csv_case}[fmt]
    case = make(tmp_path / "data")
    files = upload_tree(s3, tmp_path / "data", f"fmt-{fmt}")
    single = case.root.is_file()
    root = f"s3://{BUCKET}/fmt-{fmt}" + (f"/{case.root.name}" if single else "")
    assert_epochs(case, f"s3-fmt-{fmt}", s3_sidecar, root)

    victim = case.root.name if single else max(files, key=lambda k: len(files[k]))
    data = files[victim]
    # A CSV cut between fields reads as a shorter valid file: cut it inside a quoted field instead.
    cut = data.rindex(b',"') + 3 if fmt == "csv" else len(data) * 2 // 3
    s3.put_object(Bucket=BUCKET, Key=f"fmt-{fmt}-cut/{victim}", Body=data[:cut])
    with pytest.raises(unstall.SidecarError, match=rf"s3://{BUCKET}/fmt-{fmt}-cut/{victim}' at byte offset \d+"):
        Dataset(f"s3-fmt-{fmt}-cut", root=f"s3://{BUCKET}/fmt-{fmt}-cut/{victim}", format=fmt,
                options=None if fmt != "npz" else {"array": "x_train"}, sidecar=s3_sidecar)
