"""``decode(device="mixed")``: the sidecar serves a prep group's stored JPEG bytes and ``PrepLoader(device=...)``
decodes, crops, flips and normalizes them on its device, each sample's window and flip drawn as the sidecar draws
them. Against the sidecar's own CPU path for the same seed, through a real sidecar: the same samples in the same
order, every crop within the pixel bound of docs/PREP.md ("Decoding on the GPU"), with either decode backend
(nvImageCodec's region decode, torchvision's whole-image decode). ``device="cpu"`` runs the backends' CPU decoders
through the same code; the CUDA case (nvJPEG) runs where a GPU is. test_prep_mixed_backends.py compares the
backends."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from test_prep_native import _images
from test_prep_support import PrepEnv, start_env
from waits import wait_until

from unstall import prep  # noqa: E402  (after test_prep_support put this checkout's shim first)

# uint8 units, over every pixel of every crop: the bound docs/PREP.md states for the mixed path against the CPU path
MAX_MEAN_DIFF = 1.5
MAX_P99_DIFF = 8


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrepEnv, list[Path]]]:
    tmp = tmp_path_factory.mktemp("prep-mixed")
    for e in start_env(tmp):
        paths = _images(tmp / "jpegs")
        e.sidecar.register_dataset("jpegs", tmp / "jpegs")
        yield e, paths


def _epochs(e: PrepEnv, pipeline: prep.Pipeline, device: Any = None, epochs: int = 2, dataset: str = "jpegs",
            **kw: Any) -> list[list[tuple[int, np.ndarray, int]]]:
    """Each epoch's ``(id, image as HWC uint8 or float, label)`` in the order served."""
    out = []
    with e.client() as client, prep.PrepLoader(dataset, pipeline, batch_size=4, seed=7, shuffle=True, epochs=epochs,
                                                client=client, with_ids=True, copy=True, device=device,
                                                **kw) as loader:
        for _ in range(epochs):
            epoch = []
            for images, labels, ids in loader:
                arr = images.float().cpu().numpy() if images.dtype != np.uint8 else images.cpu().numpy()
                for img, label, i in zip(arr, labels.cpu().numpy(), ids.cpu().numpy()):
                    epoch.append((int(i), img, int(label)))
            out.append(epoch)
    return out


def _compare(cpu: list[list[tuple[int, np.ndarray, int]]], mixed: list[list[tuple[int, np.ndarray, int]]]) -> None:
    diffs = []
    for e_cpu, e_mixed in zip(cpu, mixed, strict=True):
        assert [(i, label) for i, _, label in e_cpu] == [(i, label) for i, _, label in e_mixed]
        for (i, a, _), (_, b, _) in zip(e_cpu, e_mixed):
            assert a.shape == b.shape, f"sample {i}"
            diffs.append(np.abs(a.astype(np.int16) - b.astype(np.int16)).ravel())
    d = np.concatenate(diffs)
    assert d.mean() <= MAX_MEAN_DIFF and np.percentile(d, 99) <= MAX_P99_DIFF, \
        (float(d.mean()), float(np.percentile(d, 99)), int(d.max()))


def _devices() -> list[str]:
    import torch

    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _has_nvimgcodec() -> bool:
    from unstall.prep.nvimgcodec_decode import import_nvimgcodec

    try:
        import_nvimgcodec()
    except ImportError:
        return False
    return True


NEEDS_NVIMGCODEC = pytest.mark.skipif(not _has_nvimgcodec(), reason="needs NVIDIA nvImageCodec (pip install "
                                      "nvidia-nvimgcodec-cu13 nvidia-nvjpeg; python-shim/requirements-dev.txt has it)")
BACKENDS = ["torchvision", pytest.param("nvimgcodec", marks=NEEDS_NVIMGCODEC)]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif("cuda" not in _devices(), reason="needs a CUDA GPU (nvJPEG)"))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
def test_mixed_decode_gives_the_cpu_paths_samples_crops_and_flips(env: tuple[PrepEnv, list[Path]],
                                                                     device: str, backend: str) -> None:
    e, paths = env
    cpu = _epochs(e, prep.imagenet_train(48, dtype="uint8", layout="NHWC"))
    mixed = _epochs(e, prep.imagenet_train(48, dtype="uint8", layout="NHWC", decode_device="mixed",
                                           decode_backend=backend), device)
    assert len(cpu[0]) == len(paths) and sorted(i for i, _, _ in cpu[0]) == list(range(len(paths)))
    assert [i for i, _, _ in cpu[0]] != [i for i, _, _ in cpu[1]]  # reshuffled: each epoch's own draws
    _compare(cpu, mixed)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_eval_pipeline_resizes_and_center_crops_the_same_window(env: tuple[PrepEnv, list[Path]],
                                                                   backend: str) -> None:
    e, _ = env
    ops = (prep.resize(56), prep.center_crop(48))
    cpu = _epochs(e, prep.Pipeline((prep.decode(), *ops), layout="NHWC", dtype="uint8"), epochs=1)
    mixed = _epochs(e, prep.Pipeline((prep.decode(device="mixed", backend=backend), *ops), layout="NHWC",
                                     dtype="uint8"), "cpu", epochs=1)
    _compare(cpu, mixed)


def test_normalized_bfloat16_channels_last_is_the_uint8_crop_normalized(env: tuple[PrepEnv, list[Path]]) -> None:
    import torch

    e, _ = env
    u8 = _epochs(e, prep.imagenet_train(48, dtype="uint8", decode_device="mixed"), "cpu", epochs=1)
    bf = _epochs(e, prep.imagenet_train(48, dtype="bfloat16", decode_device="mixed"), "cpu", epochs=1,
                 memory_format=torch.channels_last)
    mean = np.array(prep.IMAGENET_MEAN).reshape(3, 1, 1) * 255
    std = np.array(prep.IMAGENET_STD).reshape(3, 1, 1) * 255
    for (i, a, _), (j, b, _) in zip(u8[0], bf[0], strict=True):
        assert i == j and b.shape == a.shape  # NCHW (channels_last strides)
        np.testing.assert_allclose(b, (a - mean) / std, atol=0.02, rtol=0.01, err_msg=f"sample {i}")


def test_bad_input_names_the_thing(env: tuple[PrepEnv, list[Path]], tmp_path: Path) -> None:
    e, _ = env
    with pytest.raises(ValueError, match="pass device="):
        prep.PrepLoader("jpegs", prep.imagenet_train(48, decode_device="mixed"), batch_size=4, sidecar=e.sidecar)
    with pytest.raises(ValueError, match="'cpu'.*'mixed'.*'gpu'"):
        prep.decode(device="gpu")
    with pytest.raises(ValueError, match="cannot run the op 'rotate' on the GPU"):
        prep.PrepLoader("jpegs", {"ops": [{"op": "decode", "device": "mixed"}, {"op": "rotate"}], "dtype": "uint8"},
                        batch_size=4, device="cpu", sidecar=e.sidecar)
    bad = tmp_path / "bad"
    (bad / "c0").mkdir(parents=True)
    (bad / "c0" / "a.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg at all")
    e.sidecar.register_dataset("bad-mixed", bad)
    with e.client() as client, prep.PrepLoader("bad-mixed", prep.imagenet_train(48, decode_device="mixed"),
                                                batch_size=1, device="cpu", client=client, epochs=1) as loader:
        with pytest.raises(ValueError, match=r"sample 0 .*a\.jpg"):
            next(iter(loader))


def test_hybrid_the_sidecar_prepares_its_share_of_each_batch_and_the_device_the_rest(
        env: tuple[PrepEnv, list[Path]]) -> None:
    """``cpu_load=0.5``: of each batch of 4 the sidecar prepares the first 2 (bit for bit the CPU path's), the device
    decodes the other 2 (within the bound); the same samples in the same order."""
    e, paths = env
    cpu = _epochs(e, prep.imagenet_train(48, dtype="uint8", layout="NHWC"))
    pipe = prep.Pipeline((prep.decode(device="mixed", cpu_load=0.5), prep.random_resized_crop(48), prep.hflip()),
                         layout="NHWC", dtype="uint8")
    hybrid = _epochs(e, pipe, "cpu")
    _compare(cpu, hybrid)
    for e_cpu, e_hybrid in zip(cpu, hybrid):
        for k, ((i, a, _), (_, b, _)) in enumerate(zip(e_cpu, e_hybrid)):
            if k % 4 < 2 and k < len(paths) - len(paths) % 4:
                np.testing.assert_array_equal(a, b, err_msg=f"sample {i}, prepared by the sidecar")
    groups = [g for g in e.stats()["groups"].values() if g.get("prep") == "hybrid"]
    assert groups and groups[-1]["hybrid"]["cpu_rows"] == 2 and groups[-1]["hybrid"]["auto"] is False
    assert groups[-1]["hybrid"]["samples_prepared"] >= len(paths) and groups[-1]["hybrid"]["samples_encoded"] > 0


CAP = 10_000  # the sidecar's --max-decode-pixels in the test below, far under its default


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrepEnv]:
    """A sidecar started with ``--max-decode-pixels CAP`` serving two datasets of a 40x40 JPEG and a 150x100 one
    (above the cap, under the default): ``big-second`` (ids 0, 1) and ``big-first`` (the big one is id 0)."""
    from PIL import Image

    tmp = tmp_path_factory.mktemp("prep-mixed-caps")
    for e in start_env(tmp, extra_args=["--max-decode-pixels", str(CAP)]):
        rng = np.random.default_rng(5)
        for name, big in (("big-second", ("b.jpg",)), ("big-first", ("a.jpg",))):
            for f in ("a.jpg", "b.jpg"):
                (h, w) = (100, 150) if f in big else (40, 40)
                (tmp / name / "c0").mkdir(parents=True, exist_ok=True)
                Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(tmp / name / "c0" / f, "JPEG")
            e.sidecar.register_dataset(name, tmp / name)
        yield e


@pytest.mark.parametrize("cpu_load", [0, 0.5])
def test_the_device_refuses_what_the_sidecar_is_configured_to_refuse(capped: PrepEnv, cpu_load: float) -> None:
    """The sidecar's ``--max-decode-pixels`` (its join answer's ``decode_limits``) caps the device's decode as it
    caps the sidecar's: an image above it and under the default fails its batch with an error naming the sample
    and the cap, on the device rows and, hybrid (``cpu_load=0.5``: of each batch of 2 the sidecar prepares the
    first), on the sidecar's rows alike; never dropped, never fed."""
    pipe = prep.Pipeline((prep.decode(device="mixed", cpu_load=cpu_load), prep.random_resized_crop(48), prep.hflip()),
                         layout="NHWC", dtype="uint8")
    reason = rf"decompression bomb\? the jpeg header declares 150x100 pixels \(15000\), above the cap of {CAP} " \
             r"\(--max-decode-pixels / decode max_pixels\)"
    cases = [("big-second", rf"decode\(device='mixed'\): sample 1 \(c0/b\.jpg\): {reason}")]
    if cpu_load:  # the sidecar's own refusal, in the same words, on the row its CPUs prepare
        cases.append(("big-first", rf"dataset 'big-first' sample 0 \('c0/a\.jpg'\): {reason}"))
    else:
        cases.append(("big-first", rf"decode\(device='mixed'\): sample 0 \(c0/a\.jpg\): {reason}"))
    for dataset, why in cases:
        with capped.client() as client, prep.PrepLoader(dataset, pipe, batch_size=2, shuffle=False, epochs=1,
                                                         device="cpu", client=client) as loader:
            with pytest.raises(ValueError, match=why):
                list(loader)


def test_hybrid_auto_tunes_the_split_and_still_serves_every_sample_once(env: tuple[PrepEnv, list[Path]]) -> None:
    e, paths = env
    pipe = prep.imagenet_train(48, dtype="bfloat16", decode_device="mixed")
    pipe = prep.Pipeline((prep.decode(device="mixed", cpu_load="auto"), *pipe.ops[1:]), dtype="bfloat16")
    got = _epochs(e, pipe, "cpu", epochs=3)
    for epoch in got:
        assert sorted(i for i, _, _ in epoch) == list(range(len(paths)))
    groups = [g for g in e.stats()["groups"].values() if g.get("prep") == "hybrid" and g["hybrid"]["auto"]]
    assert groups, e.stats()["groups"]
    h = groups[-1]["hybrid"]
    assert 0 <= h["cpu_rows"] <= 4 and h["samples_prepared"] + h["samples_encoded"] >= 3 * len(paths)
    decisions = groups[-1]["autotune"]["decisions"]
    assert all(d["what"] != "cpu_rows" or d["why"] for d in decisions)


@pytest.mark.parametrize("transport", ["shm", "flight"])
def test_hybrid_auto_splits_from_the_members_measured_decode_and_step(env: tuple[PrepEnv, list[Path]],
                                                                      transport: str) -> None:
    """The member times its device's decode and its training step (a small conv net on each batch, outside
    ``next()``) and sends them with each read (``prep.next`` over shared memory, the PREP ticket over Flight); the
    sidecar's stats show them and its split decisions cite them with its own seconds per sample."""
    import torch

    e, _ = env
    pipe = prep.Pipeline((prep.decode(device="mixed", cpu_load="auto"), prep.random_resized_crop(48), prep.hflip()),
                         layout="NHWC", dtype="uint8")
    model = torch.nn.Sequential(*(torch.nn.Conv2d(c, 64, 3, padding=1) for c in (3, 64, 64)))

    def rates_decision() -> Any:
        for images, _ in loader:  # one epoch, each batch through the model
            with torch.no_grad():
                model(images.permute(0, 3, 1, 2).float())
        groups = [g for g in e.stats()["groups"].values() if g.get("prep") == "hybrid" and g["state"] == "running"]
        cited = [d for d in groups[-1]["autotune"]["decisions"] if d["what"] == "cpu_rows"
                 and d["why"].startswith("rates: ")] if groups else []
        return (groups[-1], cited) if cited else None

    with e.client() as client, prep.PrepLoader("jpegs", pipe, batch_size=4, seed=7, client=client,
                                                device="cpu", transport=transport) as loader:
        group, cited = wait_until(rates_decision, "a split decision from the member's rates")
        assert loader.membership.shm == (transport == "shm")
    h = group["hybrid"]
    assert h["device_s_per_sample"] > 0 and h["step_s"] > 0 and h["sidecar_s_per_sample"] > 0, h
    assert h["members_reporting"] == 1 and h["split_rule"] == "rates" and 0 <= h["target_cpu_rows"] <= 4, h
    for d in cited:
        assert "sidecar a=" in d["why"] and "device d=" in d["why"] and "step S=" in d["why"], d


def test_bad_hybrid_settings_name_the_field(env: tuple[PrepEnv, list[Path]]) -> None:
    e, _ = env
    with pytest.raises(ValueError, match="cpu_load must be a number in \\[0, 1\\] or 'auto'"):
        prep.decode(device="mixed", cpu_load=2)
    with pytest.raises(ValueError, match="cpu_load splits a decode\\(device='mixed'\\)"):
        prep.decode(cpu_load=0.5)
    from unstall.prep.membership import join

    with e.client() as client, pytest.raises(Exception, match="hybrid.*uint8, NHWC"):
        join("jpegs", prep.imagenet_train(48), batch_size=4, client=client, hybrid={"cpu_load": 0.5})


def test_hybrid_with_every_sample_prepared_by_the_sidecar_decodes_nothing_on_the_device(
        env: tuple[PrepEnv, list[Path]]) -> None:
    e, _ = env
    cpu = _epochs(e, prep.imagenet_train(48, dtype="uint8", layout="NHWC"), epochs=1)
    pipe = prep.Pipeline((prep.decode(device="mixed", cpu_load=1.0), prep.random_resized_crop(48), prep.hflip()),
                         layout="NHWC", dtype="uint8")
    hybrid = _epochs(e, pipe, "cpu", epochs=1)
    assert [i for i, _, _ in cpu[0]] == [i for i, _, _ in hybrid[0]]
    for (i, a, _), (_, b, _) in zip(cpu[0], hybrid[0]):
        np.testing.assert_array_equal(a, b, err_msg=f"sample {i}")


@pytest.mark.parametrize("cpu_load", [0, 0.5])
def test_the_jobs_of_a_search_on_one_device_decode_each_batch_once(env: tuple[PrepEnv, list[Path]],
                                                                    cpu_load: float) -> None:
    """Two members of one group on one device (``device_share``, the default): each batch is decoded by one of them
    and handed to the other (shared memory here; CUDA IPC handles on a GPU), and both read exactly what a member
    decoding alone reads, bit for bit; in a hybrid group too (the sidecar's rows are part of the batch handed)."""
    e, paths = env
    pipe = prep.Pipeline((prep.decode(device="mixed", cpu_load=cpu_load), prep.random_resized_crop(48), prep.hflip()),
                         layout="NHWC", dtype="uint8")
    alone = _epochs(e, pipe, "cpu", device_share=False)
    got: list[list[list[tuple[int, np.ndarray, int]]]] = [[], []]
    with e.client() as c1, e.client() as c2:
        common = dict(batch_size=4, seed=7, shuffle=True, epochs=2, with_ids=True, device="cpu", group_size=2)
        members = [prep.PrepLoader("jpegs", pipe, client=c, **common) for c in (c1, c2)]
        assert members[0].membership.group == members[1].membership.group
        for _ in range(2):
            for g in got:
                g.append([])
            for batches in zip(*members):
                for g, (images, labels, ids) in zip(got, batches):
                    g[-1].extend((int(i), img, int(label))
                                 for img, label, i in zip(images.numpy(), labels.numpy(), ids.numpy()))
        stats = [m.share_stats for m in members]
        for m in members:
            m.close()
    for g in got:
        assert [[(i, label) for i, _, label in ep] for ep in g] == [[(i, label) for i, _, label in ep] for ep in alone]
        for ep, ep_alone in zip(g, alone):
            for (i, a, _), (_, b, _) in zip(ep, ep_alone):
                np.testing.assert_array_equal(a, b, err_msg=f"sample {i}")
    batches = 2 * -(-len(paths) // 4)
    assert all(s is not None for s in stats)
    assert sum(s.decoded for s in stats) == batches, stats  # one decode of each batch for the two jobs
    assert sum(s.received for s in stats) == batches and sum(s.served for s in stats) == batches, stats
    assert all(s.fallbacks == 0 for s in stats), stats


@pytest.mark.parametrize("cpu_load", [0, 0.5])
def test_over_shared_memory_the_same_samples_and_pixels_as_over_flight_and_every_slot_let_go(
        env: tuple[PrepEnv, list[Path]], cpu_load: float) -> None:
    """A raw group (``cpu_load=0``) and a hybrid one staging in shared memory: the member maps each batch's payloads
    (and the sidecar's rows) from the group's /dev/shm slots instead of receiving them over gRPC, and reads exactly
    the samples, labels and pixels a Flight member reads, and holds none of the slots it mapped once the loop is
    done."""
    e, paths = env
    pipe = prep.Pipeline((prep.decode(device="mixed", cpu_load=cpu_load), prep.random_resized_crop(48), prep.hflip()),
                         layout="NHWC", dtype="uint8")
    flight = _epochs(e, pipe, "cpu", transport="flight", device_share=False)
    got: list[list[tuple[int, np.ndarray, int]]] = []
    with e.client() as client, prep.PrepLoader("jpegs", pipe, batch_size=4, seed=7, shuffle=True, epochs=3,
                                                client=client, with_ids=True, device="cpu", transport="shm",
                                                device_share=False) as loader:
        m = loader.membership
        assert m.shm, "the group stages in shared memory"
        for _ in range(2):
            got.append([(int(i), img.numpy(), int(label)) for images, labels, ids in loader
                        for img, label, i in zip(images, labels, ids)])
    wait_until(lambda: gc.collect() >= 0 and m._slots.held() == 0, "every slot view let go of")
    assert [[(i, label) for i, _, label in ep] for ep in got] == [[(i, label) for i, _, label in ep] for ep in flight]
    for e_flight, e_shm in zip(flight, got):
        assert sorted(i for i, _, _ in e_shm) == list(range(len(paths)))
        for (i, a, _), (_, b, _) in zip(e_flight, e_shm):
            np.testing.assert_array_equal(a, b, err_msg=f"sample {i}")
