"""Batches on the device with a real sidecar: ``PrepLoader(device=...)`` and ``unstall.torch.DataLoader(device=...)``
against the host batches, one group for members that ask for the same thing, exactly-once resume with batches
in flight, and every shared-memory slot let go of. ``device="cpu"`` runs the same code path as CUDA (without
streams); the CUDA tests run where a CUDA device is."""

from __future__ import annotations

import gc
import warnings
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
import torch

from test_prep_support import BATCH, N_SAMPLES, PIPELINE_NCHW, PrepEnv, start_env

import unstall  # noqa: E402  (after test_prep_support put this checkout's shim first)
from unstall import prep  # noqa: E402
from unstall.device import ImageConversion  # noqa: E402
from unstall.torch import DataLoader, Dataset, tensor_loader  # noqa: E402
from fault_trials import make_dataset  # noqa: E402
from waits import wait_until  # noqa: E402

PIPELINE_U8 = dict(PIPELINE_NCHW, ops=PIPELINE_NCHW["ops"][:-1], dtype="uint8")
NORMALIZE = PIPELINE_NCHW["ops"][-1]
NUM_BATCHES = -(-N_SAMPLES // BATCH)
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device; this machine has none")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrepEnv]:
    yield from start_env(tmp_path_factory.mktemp("device"))


def _read(env: PrepEnv, pipeline: Any, seed: int, transport: str = "auto", epochs: int = 1,
          **kwargs: Any) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Every batch of ``epochs`` epochs of one loader, on the CPU (copies: the loader's own memory is let go)."""
    with env.client() as client, prep.PrepLoader("imgs", pipeline, batch_size=BATCH, seed=seed, epochs=epochs,
                                                 client=client, with_ids=True, transport=transport,
                                                 **kwargs) as loader:
        return [tuple(t.cpu().clone() for t in b) for _ in range(epochs) for b in loader]  # type: ignore[misc]


def _assert_same(a: list, b: list) -> None:
    assert len(a) == len(b) == NUM_BATCHES
    for x, y in zip(a, b):
        assert all(torch.equal(u, v) and u.dtype == v.dtype for u, v in zip(x, y))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("transport", ["shm", "flight"])
def test_uint8_device_batches_equal_the_host_batches_bit_for_bit(env: PrepEnv, device: str, transport: str) -> None:
    seed = 100 + (transport == "shm")
    host = _read(env, PIPELINE_U8, seed, transport, copy=True)
    on_device = _read(env, PIPELINE_U8, seed, transport, device=device)
    _assert_same(host, on_device)
    assert sorted(int(i) for _, _, ids in host for i in ids) == list(range(N_SAMPLES))


@pytest.mark.parametrize("device", DEVICES)
def test_a_normalizing_member_on_a_device_joins_the_uint8_group_and_normalizes_there(env: PrepEnv,
                                                                                     device: str) -> None:
    """A float pipeline ending in normalize is prepared as uint8 and normalized on the device: the member joins
    the group of a uint8 member with the same pipeline, and its batches are the torch normalize of that
    member's uint8 batches, and close to the sidecar's own float batches."""
    seed = 110
    with env.client() as client:
        common = dict(batch_size=BATCH, seed=seed, epochs=1, client=client, with_ids=True, group_size=2)
        u8 = prep.PrepLoader("imgs", PIPELINE_U8, copy=True, **common)
        dev = prep.PrepLoader("imgs", PIPELINE_NCHW, device=device, **common)
        assert dev.membership.group == u8.membership.group, "the transformed pipeline is what joins"
        assert dev.membership.dtype == "uint8"
        ref = ImageConversion("NCHW", torch.float32, NORMALIZE["mean"], NORMALIZE["std"])
        pairs = [(a[0], b) for a, b in zip(u8, dev)]
        u8.close()
        dev.close()
    host_float = _read(env, PIPELINE_NCHW, seed, copy=True)
    assert len(pairs) == len(host_float) == NUM_BATCHES
    for (raw, (images, labels, ids)), (sidecar_float, _, sidecar_ids) in zip(pairs, host_float):
        assert images.device.type == device and labels.device.type == device and ids.device.type == device
        assert images.dtype == torch.float32 and torch.equal(ids.cpu(), sidecar_ids)
        if device == "cpu":
            assert torch.equal(images, ref(raw)), "bit for bit: the same op sequence on the same uint8 batch"
        # the sidecar normalizes before rounding to uint8: at most half a level apart
        torch.testing.assert_close(images.cpu(), sidecar_float, atol=0.5 / 255 / min(NORMALIZE["std"]) + 1e-5,
                                   rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_channels_last_bfloat16_batches(env: PrepEnv, device: str) -> None:
    host = _read(env, PIPELINE_U8, 120, copy=True)
    got = _read(env, dict(PIPELINE_NCHW, dtype="bfloat16"), 120, device=device, memory_format=torch.channels_last)
    ref = ImageConversion("NCHW", torch.bfloat16, NORMALIZE["mean"], NORMALIZE["std"], torch.channels_last)
    for (raw, _, ids), (images, _, dev_ids) in zip(host, got):
        assert torch.equal(ids, dev_ids) and images.dtype == torch.bfloat16 and images.shape == raw.shape
        if device == "cpu":
            assert torch.equal(images, ref(raw))
        else:
            torch.testing.assert_close(images.float(), ref(raw).float(), atol=2e-2, rtol=2e-2)


def test_state_dict_with_batches_in_flight_resumes_exactly_once(env: PrepEnv) -> None:
    seed = 130
    whole = _read(env, PIPELINE_NCHW, seed, epochs=2, device="cpu")
    with env.client() as client:
        kwargs = dict(batch_size=BATCH, seed=seed, epochs=2, client=client, with_ids=True, device="cpu",
                      device_prefetch=3)
        first = prep.PrepLoader("imgs", PIPELINE_NCHW, **kwargs)
        consumed = [tuple(t.clone() for t in b) for b in first]  # epoch 0
        it = iter(first)
        consumed += [tuple(t.clone() for t in next(it)) for _ in range(2)]
        state = first.state_dict()
        assert (state["epoch"], state["batches_yielded"]) == (1, 2), "the batches in flight are not counted"
        del it
        first.close()
        resumed = prep.PrepLoader("imgs", PIPELINE_NCHW, **kwargs)
        resumed.load_state_dict(state)
        rest = [tuple(t.clone() for t in b) for b in resumed]
        resumed.close()
    assert len(consumed) + len(rest) == 2 * NUM_BATCHES
    for x, y in zip(consumed + rest, whole):
        assert all(torch.equal(u, v) for u, v in zip(x, y)), "continues exactly where the loop was"


def _three_epochs(env: PrepEnv, seed: int) -> list[list]:
    """Three epochs' host batches as the sidecar serves them, each epoch's list apart."""
    host = _read(env, PIPELINE_U8, seed, epochs=3, copy=True)
    return [host[e * NUM_BATCHES:(e + 1) * NUM_BATCHES] for e in range(3)]


def _three_epoch_loader(client: Any, seed: int) -> Any:
    return prep.PrepLoader("imgs", PIPELINE_U8, batch_size=BATCH, seed=seed, epochs=3, client=client, with_ids=True,
                           device="cpu", device_prefetch=2)


def test_the_next_epochs_first_batches_are_in_flight_before_its_for_and_another_epoch_drops_them(env: PrepEnv) -> None:
    epochs = _three_epochs(env, 135)
    with env.client() as client, _three_epoch_loader(client, 135) as loader:
        _assert_same(epochs[0], [tuple(t.clone() for t in b) for b in loader])
        assert loader._epochs.kept is not None and loader._epochs.kept[0] == 1, "the prefetcher is kept for epoch 1"
        kept = loader._epochs.kept[2]
        wait_until(lambda: kept.pulled - kept.handed == 2, "epoch 1's first 2 batches read before its for")
        loader.set_epoch(2)  # not the epoch kept in flight: that prefetcher is closed, epoch 2 read from its start
        _assert_same(epochs[2], [tuple(t.clone() for t in b) for b in loader])
        assert kept._closed and kept.handed == NUM_BATCHES + 1, "epoch 0 and its end handed out, none of epoch 1"
        assert loader._epochs.kept is None, "3 epochs declared: nothing read past them"


def test_a_loop_that_leaves_an_epoch_early_gets_the_next_epochs_batches_read_ahead_once(env: PrepEnv) -> None:
    """The loop leaves an epoch without the call that ends it while the prefetcher already reads the next epoch's
    first batches: it kept the iterator after the last batch (as ``zip`` of two loaders does), or broke off before
    the last batch. The next ``for`` gets those batches (the sidecar refuses a member reading a batch twice: "already
    read past"); the epoch broken off loses its last batch only."""
    import itertools

    epochs = _three_epochs(env, 150)
    with env.client() as client, _three_epoch_loader(client, 150) as loader:
        it = iter(loader)  # epoch 0, read to its last batch and kept: the loop never asks for its end
        got0 = [tuple(t.clone() for t in b) for b in itertools.islice(it, NUM_BATCHES)]
        live = loader._epochs.live
        wait_until(lambda: live.pulled == NUM_BATCHES + 2, "epoch 0's end and epoch 1's first batch read ahead")
        got1 = []
        for b in loader:  # epoch 1, while epoch 0's iterator is still open
            got1.append(tuple(t.clone() for t in b))
            if len(got1) == NUM_BATCHES - 1:
                break  # epoch 2's first batch is read ahead already (depth 2: the last batch, the end, then it)
        got2 = [tuple(t.clone() for t in b) for b in loader]
        del it
    _assert_same(epochs[0], got0)
    assert len(got1) == NUM_BATCHES - 1
    for x, y in zip(got1, epochs[1]):
        assert all(torch.equal(u, v) for u, v in zip(x, y)), "epoch 1 as the sidecar serves it, to the break"
    _assert_same(epochs[2], got2)


@pytest.mark.parametrize("device", DEVICES)
def test_an_abandoned_iterator_lets_go_of_every_slot(env: PrepEnv, device: str) -> None:
    with env.client() as client:
        loader = prep.PrepLoader("imgs", PIPELINE_NCHW, batch_size=BATCH, seed=140, epochs=2, client=client,
                                 transport="shm", device=device, device_prefetch=2)
        it = iter(loader)
        kept = next(it)
        slots = loader.membership._slots
        assert loader.membership.shm and slots.held() >= 1, "batches in flight hold their slots"
        del it
        gc.collect()
        assert slots.held() == 0, "abandoned mid-epoch: every slot let go of (the handed batch is a copy)"
        n = sum(1 for _ in loader)  # the next epoch runs: the sidecar got the releases
        assert n == NUM_BATCHES and kept[0].shape[0] == BATCH
        loader.close()
        if device == "cuda":
            s = loader.device_stats
            assert s.slots_registered + s.slots_refused >= 1
            assert s.slots_unregistered == s.slots_registered, "every registered slot unregistered at close"


@needs_cuda
def test_cuda_slots_are_pinned_or_the_fallback_is_named(env: PrepEnv) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _read(env, PIPELINE_U8, 150, transport="shm", device="cuda")
    assert len(got) == NUM_BATCHES
    refused = [w for w in caught if "cudaHostRegister refused" in str(w.message)]
    assert len(refused) <= 1, "said once"


# ---------------------------------------------------------------------------------------------
# The drop-in DataLoader


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("device-loader") / "data"
    return root, make_dataset(root, 60, size=512)


def _loader(sidecar: unstall.Sidecar, root: Path, device: Optional[str] = None, **kwargs: Any) -> DataLoader:
    ds = Dataset("device-drop-in", root=root, loader=tensor_loader, sidecar=sidecar)
    return DataLoader(ds, batch_size=8, shuffle=True, seed=9, num_workers=2, device=device,
                      collate_fn=_collate, **kwargs)


def _collate(samples: list) -> dict[str, Any]:
    """A nested batch: a dict holding a tensor and a (tensor, list) pair."""
    return {"payload": torch.stack([s for s, _ in samples]),
            "meta": (torch.tensor([label for _, label in samples]), ["x"] * len(samples))}


@pytest.mark.parametrize("device", DEVICES)
def test_drop_in_dataloader_device_batches_equal_the_plain_loaders(sidecar: unstall.Sidecar, files: tuple,
                                                                   device: str) -> None:
    root, _ = files
    plain = list(_loader(sidecar, root))
    on_device = _loader(sidecar, root, device)
    assert on_device.pin_memory == (device == "cuda")
    got = list(on_device)
    assert len(got) == len(plain) == 60 // 8 + 1
    for a, b in zip(plain, got):
        assert b["payload"].device.type == device and b["meta"][1] == a["meta"][1]
        assert torch.equal(a["payload"], b["payload"].cpu()) and torch.equal(a["meta"][0], b["meta"][0].cpu())
    assert on_device.device_stats.batches == len(plain)


def test_drop_in_dataloader_state_counts_the_batches_handed_out(sidecar: unstall.Sidecar, files: tuple) -> None:
    root, _ = files
    whole = [b["payload"] for b in _loader(sidecar, root)]
    first = _loader(sidecar, root, "cpu", device_prefetch=3)
    it = iter(first)
    head = [next(it)["payload"] for _ in range(3)]
    state = first.state_dict()
    assert state["batches_yielded"] == 3, "not the 3 more in flight"
    del it
    resumed = _loader(sidecar, root, "cpu")
    resumed.load_state_dict(state)
    rest = [b["payload"] for b in resumed]
    assert len(head) + len(rest) == len(whole)
    assert all(torch.equal(a, b) for a, b in zip(head + rest, whole))
