"""Hardened decoding with a real sidecar process and real files: decompression bombs, a TIFF renamed .jpg,
truncated and garbage images each get an error naming the dataset, sample and reason, or are skipped and
counted (``on_error="skip"``); the sidecar keeps serving within its memory budget."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from test_prep_support import SHIM, PrepEnv

import unstall  # noqa: E402  (after test_prep_support put this checkout's shim first)
from unstall import prep  # noqa: E402

SIZE = 16
PIPELINE = prep.Pipeline((prep.decode(), prep.random_resized_crop(SIZE), prep.hflip(), prep.normalize()))
BUDGET = 256 << 20  # the budget: a 30000x30000 decode took 5.3 GiB of resident memory against it

# Each bad file and what its error must say.
REASONS = {
    "bomb65535.jpg": "declares 65535x65535 pixels (4294836225), above the cap of 89478485 "
                     "(--max-decode-pixels / decode max_pixels)",
    "bomb30000.jpg": "declares 30000x30000 pixels (900000000), above the cap of 89478485",
    "garbage.jpg": "not an image: no image format starts with the bytes 00 01 02 03",
    "tiff_renamed.jpg": "a TIFF file (first bytes 49 49 2a 00",
    "truncated.jpg": "truncated JPEG: no end-of-image marker (FF D9)",
    "truncated.png": "truncated PNG: no IEND chunk",
}


def _encode(fmt: str, w: int, h: int, seed: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, fmt)
    return buf.getvalue()


def bomb(jpeg: bytes, w: int, h: int) -> bytes:
    """A decompression bomb: a small real JPEG whose frame header (SOF0) is patched to declare ``w x h``."""
    b = bytearray(jpeg)
    at = b.find(b"\xff\xc0")
    assert at > 0, "PIL writes baseline JPEGs (SOF0)"
    b[at + 5:at + 9] = h.to_bytes(2, "big") + w.to_bytes(2, "big")
    return bytes(b)


def make_mixed(root: Path) -> dict[str, bytes]:
    """10 good images (JPEG and PNG) in two classes, and the bad files of REASONS among them."""
    files: dict[str, bytes] = {}
    for i in range(10):
        fmt = "PNG" if i % 4 == 0 else "JPEG"
        files[f"c{i % 2}/good{i}.{'png' if fmt == 'PNG' else 'jpg'}"] = _encode(fmt, 40 + 5 * i, 30 + 3 * i, i)
    small = _encode("JPEG", 40, 30, 99)
    files["c0/bomb65535.jpg"] = bomb(small, 65535, 65535)
    files["c0/bomb30000.jpg"] = bomb(small, 30000, 30000)
    files["c1/garbage.jpg"] = bytes(range(256)) * 4
    files["c1/tiff_renamed.jpg"] = _encode("TIFF", 30, 30, 7)
    files["c1/truncated.jpg"] = _encode("JPEG", 64, 48, 8)[:-60]
    files["c1/truncated.png"] = _encode("PNG", 64, 48, 9)[:-30]
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    assert len(files["c0/bomb65535.jpg"]) < 4096, "a tiny file"
    return files


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrepEnv]:
    from unstall.sidecar import find_jar

    try:
        jar = find_jar()
    except unstall.SidecarStartError as e:
        pytest.skip(f"sidecar jar not built: {e}")
    tmp = tmp_path_factory.mktemp("prep-decode")
    root = tmp / "mixed"
    make_mixed(root)
    sidecar = unstall.Sidecar(home=tmp / "home", jar=jar, cache_capacity="16MiB", memory_budget=str(BUDGET),
                              java_options=["-Xmx256m"], start=True)
    try:
        sidecar.register_dataset("mixed", root)
        yield PrepEnv(sidecar, root, tmp)
    finally:
        sidecar.close()


def _keys(env: PrepEnv) -> dict[int, str]:
    """Sample id -> key, from a plain fetch (which does not decode)."""
    with env.client() as c:
        n = c.describe("mixed").num_samples
        rb = c.fetch("mixed", list(range(n)))
    return {int(i): str(k) for i, k in zip(rb.column("id").to_pylist(), rb.column("key").to_pylist())}


def _bad_ids(keys: dict[int, str]) -> dict[int, str]:
    return {i: Path(k).name for i, k in keys.items() if Path(k).name in REASONS}


def _assert_names_the_sample(e: unstall.DataError, env: PrepEnv, sample: int, key: str) -> None:
    assert isinstance(e, ValueError) and not isinstance(e, unstall.SidecarInternalError)
    assert (e.dataset, e.sample, e.key, e.file, e.offset) == ("mixed", sample, key, str(env.root / key), 0)
    assert e.reason is not None and REASONS[Path(key).name] in e.reason, e.reason


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_each_bad_image_fails_its_batch_naming_it_and_the_sidecar_keeps_serving(env: PrepEnv) -> None:
    keys = _keys(env)
    bad = _bad_ids(keys)
    assert len(bad) == len(REASONS) and len(keys) == 10 + len(REASONS)
    errors: dict[int, str] = {}
    raised: dict[int, unstall.DataError] = {}
    with env.client() as client:
        m = prep.join("mixed", PIPELINE, batch_size=1, shuffle=False, epochs=1, client=client, transport="flight")
        for b in range(m.num_batches):  # without shuffle, batch b is sample b
            try:
                images, _, ids = prep.batch_to_numpy(m.batch(0, b))
                assert ids.tolist() == [b] and images.shape == (1, 3, SIZE, SIZE)
            except unstall.DataError as e:  # bad data, not an internal error
                errors[b] = str(e)
                raised[b] = e
        m.leave()
        assert set(errors) == set(bad), errors
        for i, name in bad.items():
            assert f"dataset 'mixed' sample {i} ('{keys[i]}'): " in errors[i], errors[i]
            assert REASONS[name] in errors[i], errors[i]
            assert errors[i].endswith('prep with on_error="skip" leaves such samples out'), errors[i]
            _assert_names_the_sample(raised[i], env, i, keys[i])

        # A pipeline may raise the pixel cap up to OpenCV's own limit: the decode memory still refuses the
        # issue's 30000x30000 JPEG before OpenCV sees it (two resamplings: a pipeline the native path cannot take).
        big = prep.Pipeline((prep.decode(max_pixels=1 << 30), prep.random_resized_crop(2 * SIZE),
                             prep.resize((SIZE, SIZE))), dtype="uint8")
        m = prep.join("mixed", big, batch_size=1, shuffle=False, epochs=1, client=client, transport="flight")
        b30k = next(i for i, name in bad.items() if name == "bomb30000.jpg")
        with pytest.raises(unstall.DataError, match=r"decoding the JPEG 30000x30000 image takes about "
                           r"\d+ bytes of native memory, more than the sidecar's decode memory of \d+ bytes "
                           r"\(--decode-memory\)"):
            m.batch(0, b30k)
        m.leave()
        # The native crop-window path needs only the crop's rows (docs/ARCHITECTURE.md, "Native JPEG prep"): it
        # fits the budget and libjpeg names what is wrong with the bytes.
        native = prep.Pipeline((prep.decode(max_pixels=1 << 30), prep.random_resized_crop(SIZE)), dtype="uint8")
        m = prep.join("mixed", native, batch_size=1, shuffle=False, epochs=1, client=client, transport="flight")
        with pytest.raises(unstall.DataError, match=r"bomb30000.jpg'\): (libjpeg: |decoding the JPEG)"):
            m.batch(0, b30k)
        m.leave()

        # The same sidecar still serves: a plain fetch, and another group over shared memory.
        good = [i for i in keys if i not in bad]
        rb = client.fetch("mixed", good)
        assert [Path(k).name for k in rb.column("key").to_pylist()] == [Path(keys[i]).name for i in good]
        assert all((env.root / k).read_bytes() == p for k, p in zip(rb.column("key").to_pylist(),
                                                                   rb.column("payload").to_pylist()))
    with prep.PrepLoader("mixed", PIPELINE, batch_size=4, seed=2, epochs=1, on_error="skip",
                         sidecar=env.sidecar, with_ids=True) as loader:
        assert sorted(int(i) for _, _, ids in loader for i in ids) == sorted(good)

    stats = env.stats()["decode"]
    assert stats["memory_reserved_bytes"] == 0 and stats["memory_peak_bytes"] <= stats["memory_limit_bytes"]
    assert stats["memory_limit_bytes"] < BUDGET
    assert env.sidecar.pid is not None
    # Resident memory: the JVM (heap capped at 256 MiB, code, OpenCV) plus the off-heap budget (about 190 MiB
    # in all when measured); decoding the 30000x30000 image alone would take 2.7 GB.
    assert _peak_rss(env.sidecar.pid) < BUDGET + (512 << 20), _peak_rss(env.sidecar.pid)


def _tensors(loader_batches: Iterator[tuple[int, np.ndarray, np.ndarray]]) -> dict[tuple[int, int], np.ndarray]:
    out: dict[tuple[int, int], np.ndarray] = {}
    for epoch, images, ids in loader_batches:
        for x, i in zip(images, ids):
            out[(epoch, int(i))] = np.array(x)
    return out


def test_a_bad_image_is_a_data_error_over_shared_memory_and_from_a_prep_loader(env: PrepEnv) -> None:
    keys = _keys(env)
    bad = _bad_ids(keys)
    with env.client() as client:  # prep.next over the local socket, the batch in a shared-memory slot
        m = prep.join("mixed", PIPELINE, batch_size=1, seed=3, shuffle=False, epochs=1, client=client, transport="shm")
        assert m.shm
        for b in sorted(bad):
            with pytest.raises(unstall.DataError) as err:
                m.arrays(0, b)
            _assert_names_the_sample(err.value, env, b, keys[b])
        m.leave()
    with prep.PrepLoader("mixed", PIPELINE, batch_size=1, seed=4, shuffle=False, epochs=1, on_error="raise",
                         sidecar=env.sidecar) as loader:
        with pytest.raises(unstall.DataError) as err:
            list(loader)
    _assert_names_the_sample(err.value, env, min(bad), keys[min(bad)])


def test_on_error_skip_leaves_bad_images_out_says_which_and_training_goes_on(env: PrepEnv) -> None:
    import torch

    keys = _keys(env)
    bad = _bad_ids(keys)
    good = sorted(i for i in keys if i not in bad)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen: list[tuple[int, np.ndarray, np.ndarray]] = []
    with prep.PrepLoader("mixed", PIPELINE, batch_size=4, seed=5, epochs=2, on_error="skip", sidecar=env.sidecar,
                         with_ids=True) as loader:
        assert loader.membership.info["on_error"] == "skip"
        for epoch in range(2):
            for images, labels, ids in loader:
                assert images.shape[0] == labels.shape[0] == ids.shape[0] > 0
                loss = torch.nn.functional.cross_entropy(model(images), labels)  # a real training step
                opt.zero_grad()
                loss.backward()
                opt.step()
                seen.append((epoch, images.numpy(), ids.numpy()))
        skipped = list(loader.skipped)
        group = loader.membership.group
    for epoch in range(2):
        ids = sorted(int(i) for e, _, batch_ids in seen if e == epoch for i in batch_ids)
        assert ids == good, f"epoch {epoch}: every good sample once, never a bad one in its place"
        assert {s["id"] for s in skipped if s["epoch"] == epoch} == set(bad)
    for s in skipped:
        assert s["key"] == keys[s["id"]] and REASONS[bad[s["id"]]] in s["reason"], s
    st = env.group_stats(group)
    assert st["samples_skipped"] == 2 * len(bad) and st["samples_prepared"] == 2 * len(good)
    assert {s["id"] for s in st["skipped"]} == set(bad)

    # Each row is its own sample's tensor: the same as a group that prepares the good samples one per batch
    # (augmentation is drawn per (seed, epoch, sample), whatever the batch).
    expected: list[tuple[int, np.ndarray, np.ndarray]] = []
    with env.client() as client:
        m = prep.join("mixed", PIPELINE, batch_size=1, seed=5, epochs=2, client=client, transport="flight")
        for epoch in range(2):
            for b in range(m.num_batches):
                try:
                    images, _, ids = prep.batch_to_numpy(m.batch(epoch, b))
                except unstall.DataError:
                    continue  # a bad sample, on_error="raise"
                expected.append((epoch, images, ids))
    got, want = _tensors(iter(seen)), _tensors(iter(expected))
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=f"epoch {k[0]} sample {k[1]}")


def test_webp_is_decoded_only_when_the_pipeline_names_it(env: PrepEnv, tmp_path: Path) -> None:
    from PIL import features

    if not features.check("webp"):
        pytest.skip("this Pillow cannot write WebP")
    root = tmp_path / "webp"
    (root / "c0").mkdir(parents=True)
    (root / "c0" / "a.webp").write_bytes(_encode("WEBP", 48, 32, 3))
    (root / "c0" / "b.jpg").write_bytes(_encode("JPEG", 48, 32, 4))
    env.sidecar.register_dataset("webp", root)
    with env.client() as client:
        m = prep.join("webp", PIPELINE, batch_size=1, shuffle=False, epochs=1, client=client, transport="flight")
        with pytest.raises(unstall.DataError, match=r"sample 0 \('c0/a.webp'\): a WebP file \(first bytes "
                           r"52 49 46 46 .*not one of the formats the pipeline decodes: jpeg, png"):
            m.batch(0, 0)
        m.leave()
        webp = prep.Pipeline((prep.decode(formats=("jpeg", "png", "webp")), prep.center_crop(SIZE)), dtype="uint8")
        m = prep.join("webp", webp, batch_size=2, shuffle=False, epochs=1, client=client, transport="flight")
        images, _, ids = prep.batch_to_numpy(m.batch(0, 0))
        assert ids.tolist() == [0, 1] and images.shape == (2, 3, SIZE, SIZE) and images.std() > 0
        m.leave()


def test_on_error_is_checked_before_joining(env: PrepEnv) -> None:
    with pytest.raises(ValueError, match="on_error must be 'raise' or 'skip'"):
        prep.decode(on_error="ignore")
    with pytest.raises(ValueError, match="on_error applies to a sidecar pipeline's decode op"):
        prep.join("mixed", None, batch_size=2, on_error="skip", sidecar=env.sidecar)
    with pytest.raises(ValueError, match="contradicts the pipeline's decode op"):
        prep.join("mixed", prep.imagenet_train(SIZE, on_error="raise"), batch_size=2, on_error="skip",
                  sidecar=env.sidecar)
    with env.client() as client, pytest.raises(unstall.InvalidRequestError,
                                               match="prep op #0 'decode': \"formats\" may name jpeg, png and webp"):
        prep.join("mixed", {"ops": [prep.decode(formats=["tiff"]), prep.center_crop(8)]}, batch_size=2,
                  client=client)


TF_SCRIPT = r'''
import json, sys
import tensorflow as tf
import unstall, unstall.tf
from unstall import prep
client = unstall.FlightClient(sys.argv[1], sys.argv[2])
pipe = prep.Pipeline((prep.decode(), prep.random_resized_crop(16), prep.normalize()), layout="NHWC")
ds = unstall.tf.dataset("mixed", pipe, batch_size=4, seed=6, epochs=2, drop_last=True, on_error="skip",
                        with_ids=True, client=client)
out = {"spec": [str(s) for s in ds.element_spec], "ids": [int(i) for x, y, ids in ds for i in ids]}
model = tf.keras.Sequential([tf.keras.Input((16, 16, 3)), tf.keras.layers.Conv2D(2, 3),
                             tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(2)])
model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
out["fit_epochs"] = len(model.fit(ds.map(lambda x, y, i: (x, y)), epochs=1, verbose=0).history["loss"])
out["skipped"] = sorted({s["id"] for s in unstall.tf.membership(ds).skipped})
print("RESULT " + json.dumps(out))
'''


def test_tf_dataset_skips_bad_images_and_model_fit_goes_on(env: PrepEnv) -> None:
    keys = _keys(env)
    bad = _bad_ids(keys)
    env_vars = dict(os.environ, PYTHONPATH=str(SHIM), TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    p = subprocess.run([sys.executable, "-c", TF_SCRIPT, env.location, env.sidecar.token], env=env_vars,
                       capture_output=True, text=True, timeout=240)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and line, (p.stdout + p.stderr)[-4000:]
    out: dict[str, Any] = json.loads(line[0][7:])
    assert out["spec"][0] == "TensorSpec(shape=(None, 16, 16, 3), dtype=tf.float32, name=None)", \
        "skipping makes batches smaller, even with drop_last"
    good = sorted(i for i in keys if i not in bad)
    assert len(keys) % 4 == 0, "drop_last drops no position here"
    assert sorted(out["ids"]) == good, "every good sample once, never a bad one"
    assert out["fit_epochs"] == 1
    assert out["skipped"] == sorted(bad)
