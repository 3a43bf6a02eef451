"""unstall.device alone (no sidecar): the conversion math, the prefetch depth, the order host batches are let
go of, and the batch structures; the CUDA parts run where a CUDA device is."""

from __future__ import annotations

import collections
import gc
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from unstall.device import DevicePrefetcher, DeviceStats, ImageConversion, PinnedSlots, map_tensors  # noqa: E402
from unstall.shm_slots import SlotMaps  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))
from waits import wait_until  # noqa: E402

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device; this machine has none")
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])


def _images(layout: str, n: int = 3, h: int = 5, w: int = 7, seed: int = 0) -> Any:
    g = torch.Generator().manual_seed(seed)
    shape = (n, 3, h, w) if layout == "NCHW" else (n, h, w, 3)
    return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)


def _reference(x: Any, layout: str, dtype: Any) -> Any:
    """The textbook normalize of an NCHW float copy, then the cast."""
    nchw = x if layout == "NCHW" else x.permute(0, 3, 1, 2)
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    return ((nchw.float() / 255 - mean) / std).to(dtype)


def _folded(x: Any, layout: str, dtype: Any) -> Any:
    """The conversion's math on a contiguous NCHW float32 copy (one scale, one shift per channel, a multiply-add
    in float32, one rounding to ``dtype``): the layout, memory format and the uint8 input change no bit."""
    nchw = x if layout == "NCHW" else x.permute(0, 3, 1, 2)
    m, s = np.asarray(MEAN, np.float64), np.asarray(STD, np.float64)
    scale = torch.from_numpy((1 / (255 * s)).astype(np.float32)).view(1, 3, 1, 1)
    shift = torch.from_numpy((-m / s).astype(np.float32)).view(1, 3, 1, 1)
    return torch.addcmul(shift, nchw.float().contiguous(), scale).to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("fmt", ["contiguous_format", "channels_last"])
def test_uint8_to_normalized_float_in_the_asked_memory_format(device: str, layout: str, dtype: str, fmt: str) -> None:
    to, memory_format = getattr(torch, dtype), getattr(torch, fmt)
    x = _images(layout)
    out = ImageConversion(layout, to, MEAN, STD, memory_format)(x.to(device))
    assert out.dtype == to and out.device.type == device
    assert tuple(out.shape) == (3, 3, 5, 7), "NCHW whatever the host layout"
    assert out.is_contiguous(memory_format=memory_format)
    got = out.cpu()
    if device == "cpu":
        assert torch.equal(got, _folded(x, layout, to)), "bit for bit: the same op sequence"
    tol = {"float32": 1e-5, "float16": 4e-3, "bfloat16": 2e-2}[dtype]
    torch.testing.assert_close(got.float(), _reference(x, layout, to).float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("device", DEVICES)
def test_channels_last_from_nhwc_is_a_view_and_uint8_stays_uint8(device: str) -> None:
    x = _images("NHWC").to(device)
    out = ImageConversion("NHWC", memory_format=torch.channels_last)(x)
    assert out.dtype == torch.uint8 and out.data_ptr() == x.data_ptr(), "no pass over the data"
    assert torch.equal(out, x.permute(0, 3, 1, 2)) and out.is_contiguous(memory_format=torch.channels_last)
    kept = ImageConversion("NHWC")(x)
    assert torch.equal(kept, x) and kept.shape == x.shape, "no memory_format: the layout is kept"


def test_conversion_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="both mean and std"):
        ImageConversion("NCHW", torch.float32, MEAN, None)
    with pytest.raises(ValueError, match="float dtype"):
        ImageConversion("NCHW", torch.int32)
    with pytest.raises(ValueError, match="layout"):
        ImageConversion("CHW")
    with pytest.raises(ValueError, match="normalizes uint8"):
        ImageConversion("NCHW", torch.float32, MEAN, STD)(torch.zeros(1, 3, 2, 2))


class Source:
    """Host batches numbered 0..n-1 (a uint8 image tensor and a label tensor); records how far it was read and,
    given ``handed`` (the prefetcher's count of batches handed out), the most it was ever read ahead of that."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.pulled = 0
        self.handed: Callable[[], int] = lambda: 0
        self.most_ahead = 0

    def __iter__(self) -> Iterator[Any]:
        for i in range(self.n):
            self.pulled += 1
            self.most_ahead = max(self.most_ahead, self.pulled - self.handed())
            yield (torch.full((2, 3, 4, 4), i, dtype=torch.uint8), torch.tensor([i, -i]))


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_the_source_is_never_more_than_depth_batches_ahead(depth: int) -> None:
    src = Source(7)
    p = DevicePrefetcher(iter(src), "cpu", depth)
    src.handed = lambda: p.handed
    assert src.pulled == 0, "nothing is read before the first next()"
    handed = 0
    for images, labels in p:
        handed += 1
        assert int(images[0, 0, 0, 0]) == handed - 1 and labels.tolist() == [handed - 1, 1 - handed]
        # the prefetcher's thread reads ahead while the step runs, up to depth batches
        wait_until(lambda n=handed: p.pulled - n == min(depth, 7 - n), f"{depth} batches in flight")
        assert p.pulled == src.pulled and p.handed == handed
    assert src.most_ahead == depth, "never more than depth batches read ahead of the loop"
    assert handed == 7 and p.stats.batches == 7
    assert p.stats.bytes == 7 * (2 * 3 * 4 * 4 + 2 * 8)


def _slot(tmp_path: Path, name: str, size: int) -> str:
    p = tmp_path / name
    p.write_bytes(bytes(size))
    return str(p)


def test_host_batches_are_let_go_of_in_order_once_copied_and_the_copy_is_the_batch(tmp_path: Path) -> None:
    """Views of real slot files (SlotMaps): each batch is reported released in order, and only after its copy
    was made; the handed-out batch owns its memory, so the sidecar writing the slot again does not change it."""
    slots = SlotMaps()
    paths = [_slot(tmp_path, f"s{k}", 48) for k in range(3)]
    events: list[tuple[str, int]] = []

    def host() -> Iterator[Any]:
        for i in range(6):
            path = paths[i % 3]
            with open(path, "r+b") as f:  # the sidecar writes batch i into a free slot
                f.write(bytes([i]) * 48)
            events.append(("pulled", i))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # a read-only view
                yield torch.from_numpy(slots.view(path, np.dtype("u1"), (3, 16), 0, i))

    p = DevicePrefetcher(host(), "cpu", 2)
    got = []
    for _k, batch in enumerate(p):
        gc.collect()
        for _, b in slots.take_released():
            assert ("pulled", b) in events, "released only after it was read and copied"
            events.append(("released", b))
        got.append(batch)
    assert all(torch.equal(b, torch.full((3, 16), i, dtype=torch.uint8)) for i, b in enumerate(got)), \
        "each handed batch kept its bytes while its slot was written again"
    released = [b for kind, b in events if kind == "released"]
    assert released == sorted(released) == list(range(len(released)))
    p.close()
    gc.collect()
    released += [b for _, b in slots.take_released()]
    assert released == list(range(6)), "every slot is let go of, in order"


def test_an_error_of_the_source_comes_after_the_batches_before_it_and_close_closes_the_source() -> None:
    closed = []

    def failing() -> Iterator[Any]:
        try:
            yield torch.zeros(1)
            yield torch.ones(1)
            raise OSError("the sidecar went away")
        finally:
            closed.append(True)

    p = DevicePrefetcher(failing(), "cpu", 3)
    assert next(p).item() == 0 and next(p).item() == 1
    with pytest.raises(OSError, match="went away"):
        next(p)

    def endless() -> Iterator[Any]:
        try:
            while True:
                yield torch.zeros(1)
        finally:
            closed.append(True)

    q = DevicePrefetcher(endless(), "cpu", 2)
    next(q)
    q.close()
    assert closed == [True, True], "the generator's finally ran"
    with pytest.raises(StopIteration):
        next(q)


def test_batch_structures_are_kept() -> None:
    Pair = collections.namedtuple("Pair", "x y")
    batch = {"img": torch.arange(4), "meta": [Pair(torch.ones(2), "name"), (torch.zeros(1), 3)], "key": b"k"}
    out = next(DevicePrefetcher(iter([batch]), "cpu"))
    assert set(out) == {"img", "meta", "key"} and out["key"] == b"k"
    assert isinstance(out["meta"][0], Pair) and out["meta"][0].y == "name" and out["meta"][1][1] == 3
    assert torch.equal(out["img"], batch["img"]) and out["img"].data_ptr() != batch["img"].data_ptr(), "a copy"
    assert map_tensors(lambda t: t + 1, [torch.zeros(1), "s"])[1] == "s"


def test_stats_count_batches_bytes_and_hand_out_cpu_time() -> None:
    stats = DeviceStats()
    for _ in DevicePrefetcher(iter(Source(3)), "cpu", 2, stats=stats):
        pass
    assert stats.batches == 3 and stats.bytes == 3 * (96 + 16)
    assert stats.handout_cpu_s > 0 and stats.cpu_ms_per_batch == 1000 * stats.handout_cpu_s / 3
    assert stats.as_dict()["cpu_ms_per_batch"] == stats.cpu_ms_per_batch


def test_on_step_gets_the_loops_time_between_batches_not_across_a_marker() -> None:
    from unstall.prep.ahead import EPOCH_END

    steps: list[float] = []
    p = DevicePrefetcher(iter([torch.zeros(2), EPOCH_END, torch.ones(2)]), "cpu", 2, on_step=steps.append)
    out = list(p)
    assert out[1] is EPOCH_END and torch.equal(out[2], torch.ones(2))
    assert len(steps) == 2 and all(s > 0 for s in steps), steps  # after each batch, none after the marker


def test_slot_hooks_run_once_per_mapping_and_unmap_waits_for_the_last_view(tmp_path: Path) -> None:
    calls: list[tuple[str, str, Any]] = []
    slots = SlotMaps(on_map=lambda path, mm: (calls.append(("map", path, len(mm))), path)[1],
                     on_unmap=lambda path, token: calls.append(("unmap", path, token)))
    a, b = _slot(tmp_path, "a", 32), _slot(tmp_path, "b", 32)
    v1 = slots.view(a, np.dtype("u1"), (8,), 0, 0)
    v2 = slots.view(a, np.dtype("u1"), (8,), 0, 1)
    w = slots.view(b, np.dtype("u1"), (8,), 0, 2)
    assert calls == [("map", a, 32), ("map", b, 32)], "one registration per mapping, not per view"
    del w
    gc.collect()
    assert [c for c in calls if c[0] == "unmap"] == [], "a mapping in use by SlotMaps stays"
    slots.clear()
    assert ("unmap", b, b) in calls, "retired with no view left: unmapped at once"
    assert ("unmap", a, a) not in calls, "views of it are alive"
    del v1
    gc.collect()
    assert ("unmap", a, a) not in calls
    del v2
    gc.collect()
    assert calls.count(("unmap", a, a)) == 1, "unmapped once, when its last view is gone"


# ---------------------------------------------------------------------------------------------
# CUDA


@needs_cuda
def test_cuda_batches_equal_the_host_batches_and_wait_on_their_event() -> None:
    src = Source(5)
    p = DevicePrefetcher(iter(src), "cuda", 2)
    for i, (images, labels) in enumerate(p):
        assert images.is_cuda and labels.is_cuda
        # enqueued on the training stream, which waits for the side stream's copy of this batch only
        assert int(images.sum().item()) == i * images.numel() and labels.tolist() == [i, -i]
    p.close()


@needs_cuda
def test_cuda_conversion_runs_on_the_side_stream_and_the_result_is_ready_on_the_training_stream() -> None:
    x = _images("NHWC", n=8, h=64, w=64)
    conv = ImageConversion("NHWC", torch.bfloat16, MEAN, STD, torch.channels_last)
    p = DevicePrefetcher(iter([(x,)] * 3), "cuda", 2, convert=lambda b: (conv(b[0]),))
    expected = _reference(x, "NHWC", torch.bfloat16).float()
    for (out,) in p:
        assert out.is_contiguous(memory_format=torch.channels_last) and out.dtype == torch.bfloat16
        torch.testing.assert_close(out.float().cpu(), expected, atol=2e-2, rtol=2e-2)


@needs_cuda
def test_large_pageable_tensors_are_staged_and_pinned_ones_are_not() -> None:
    big = torch.full((1 << 21,), 7, dtype=torch.uint8)
    stats = DeviceStats()
    out = list(DevicePrefetcher(iter([(big,), (big.pin_memory(),)]), "cuda", 2, stats=stats))
    assert stats.staged_batches == 1 and all(int(o[0][0]) == 7 for o in out)


@needs_cuda
def test_pinned_slots_register_a_slot_mapping_or_warn_naming_it(tmp_path: Path) -> None:
    stats = DeviceStats()
    pinned = PinnedSlots(stats)
    slots = SlotMaps(on_map=pinned.on_map, on_unmap=pinned.on_unmap)
    path = _slot(tmp_path, "slot", 1 << 20)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        view = slots.view(path, np.dtype("u1"), (1 << 20,), 0, 0)
    if stats.slots_registered == 1:
        assert torch.from_numpy(view).is_pinned(), "registered memory is page-locked"
    else:
        assert stats.slots_refused == 1 and any(path in str(w.message) and "cudaHostRegister" in str(w.message)
                                                for w in caught)
    t = torch.from_numpy(view).to("cuda")
    assert int(t.sum()) == 0, "torch's next launch sees no left-over CUDA error"
    del view
    slots.clear()
    gc.collect()
    assert stats.slots_unregistered == stats.slots_registered
