"""SlotMaps alone: views over a slot file, and which batches are reported released (no sidecar)."""

from __future__ import annotations

import gc
import warnings
from pathlib import Path

import numpy as np
import pytest

from unstall.shm_slots import SlotMaps


def _slot(tmp_path: Path, name: str, values: np.ndarray, extra: int = 64) -> str:
    p = tmp_path / name
    p.write_bytes(values.tobytes() + b"\0" * extra)  # a slot is sized for a whole batch: longer than this one
    return str(p)


def test_a_view_is_the_batch_at_the_start_of_the_slot_and_read_only(tmp_path: Path) -> None:
    values = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    maps = SlotMaps()
    v = maps.view(_slot(tmp_path, "s0", values), np.dtype("<f4"), (2, 3, 4), 0, 0)
    np.testing.assert_array_equal(v, values)
    assert not v.flags.writeable
    with pytest.raises(ValueError):
        v[0, 0, 0] = 1


def test_a_batch_is_reported_once_when_its_last_view_is_gone(tmp_path: Path) -> None:
    values = np.arange(16, dtype=np.uint8).reshape(2, 8)
    path = _slot(tmp_path, "s0", values)
    maps = SlotMaps()
    a = maps.view(path, np.dtype("u1"), (2, 8), 3, 7)
    b = maps.view(path, np.dtype("u1"), (1, 8), 3, 8)  # the next batch in the same slot
    row = a[1]  # a view of a view keeps the batch alive, and so does a view of that
    col = row.reshape(2, 4).T
    del a, row
    gc.collect()
    assert maps.take_released() == []
    np.testing.assert_array_equal(col, values[1].reshape(2, 4).T)
    del col
    gc.collect()
    assert maps.take_released() == [[3, 7]]
    assert maps.take_released() == [], "each release is reported once"
    del b
    gc.collect()
    assert maps.take_released() == [[3, 8]]


def test_a_torch_tensor_over_the_view_keeps_the_batch_held(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    values = np.arange(8, dtype=np.float32)
    maps = SlotMaps()
    t = torch.from_numpy(maps.view(_slot(tmp_path, "s0", values), np.dtype("<f4"), (8,), 0, 1).copy())
    assert maps.take_released() == [[0, 1]], "a copy does not hold the slot"
    with warnings.catch_warnings():  # torch warns (once per process) that the mapping is not writable
        warnings.simplefilter("ignore", UserWarning)
        t = torch.from_numpy(maps.view(_slot(tmp_path, "s1", values), np.dtype("<f4"), (8,), 0, 2))
    gc.collect()
    assert maps.take_released() == []
    assert float(t.sum()) == float(values.sum())
    t = t[2:].view(torch.int32)  # a torch view of the tensor keeps it too
    gc.collect()
    assert maps.take_released() == []
    del t
    gc.collect()
    assert maps.take_released() == [[0, 2]]


def test_mappings_of_retired_slots_are_dropped(tmp_path: Path) -> None:
    values = np.zeros(4, dtype=np.uint8)
    maps = SlotMaps(limit=2)
    old = _slot(tmp_path, "old", values)
    maps.view(old, np.dtype("u1"), (4,), 0, 0)
    Path(old).unlink()  # the sidecar retired it
    for i in range(3):
        maps.view(_slot(tmp_path, f"s{i}", values), np.dtype("u1"), (4,), 0, i + 1)
    assert old not in maps._maps and len(maps._maps) <= 2
