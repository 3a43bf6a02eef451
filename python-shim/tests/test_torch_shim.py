"""The torch layer and the Flight client against the in-process fake data plane (no JVM)."""

from __future__ import annotations

import pickle
from collections import Counter

import pytest
import torch
import torch.utils.data as tud

import unstall
from unstall.client import FlightClient
from unstall.torch import DataLoader, Dataset, EpochIndex, EpochSampler
from fake_sidecar import TOKEN, FakeSidecar


def keep(batch):  # a picklable collate_fn that keeps the (sample, target) list
    return batch


# -- EpochSampler -----------------------------------------------------------------------------


def test_epoch_sampler_tags_and_advances_per_iteration() -> None:
    s = EpochSampler(range(3))
    assert len(s) == 3 and s.epoch == 0
    assert list(s) == [EpochIndex(0, 0), EpochIndex(0, 1), EpochIndex(0, 2)]
    assert [ix.epoch for ix in s] == [1, 1, 1]
    s.set_epoch(7)
    s.session = 5  # a DataLoader's session on the local socket travels with each index
    assert set(s) == {EpochIndex(7, i, 5) for i in range(3)}
    assert s.epoch == 8 and s.state_dict() == {"epoch": 8}


def test_epoch_sampler_advances_only_when_iteration_starts() -> None:
    # torch calls iter() twice for the first multi-process epoch; only the consumed one counts.
    s = EpochSampler(range(2))
    iter(s)
    iter(s)
    assert next(iter(s)) == EpochIndex(0, 0)


def test_epoch_sampler_batched_and_forwarding_set_epoch() -> None:
    class Recording(tud.Sampler):
        def __init__(self) -> None:
            self.epochs: list[int] = []

        def set_epoch(self, e: int) -> None:
            self.epochs.append(e)

        def __iter__(self):
            return iter([[0, 1], [2]])

        def __len__(self) -> int:
            return 2

    inner = Recording()
    s = EpochSampler(inner, batched=True)
    assert list(s) == [[EpochIndex(0, 0), EpochIndex(0, 1)], [EpochIndex(0, 2)]]
    assert inner.epochs == []  # not forwarded unless set_epoch was called on the wrapper
    s.set_epoch(3)
    list(s)
    list(s)
    assert inner.epochs == [3, 4]
    with pytest.raises(ValueError):
        s.set_epoch(-1)


# -- Dataset / DataLoader over the fake data plane -------------------------------------------------


def test_dataset_getitem_and_getitems_are_one_doget(fake_sidecar: FakeSidecar) -> None:
    ds = Dataset("imgs", sidecar=fake_sidecar)
    assert len(ds) == 50 and ds.classes == [f"c{i}" for i in range(5)] and ds.class_to_idx["c3"] == 3
    sample, target = ds[7]
    assert sample == bytes([7]) * 107 and target == 2
    items = ds.__getitems__([3, 3, EpochIndex(4, 9)])
    assert [t for _, t in items] == [3, 3, 4]
    tickets = fake_sidecar.take_tickets()
    assert tickets == [(0, (7,)), (0, (3, 3)), (4, (9,))]


def test_dataset_without_labels_targets_the_key(fake_sidecar: FakeSidecar) -> None:
    ds = Dataset("recs", sidecar=fake_sidecar, loader=len, transform=lambda n: n * 2, target_transform=str.upper)
    assert ds[4] == (2 * 104, "K4")
    assert ds.classes == []


def test_dataloader_one_doget_per_batch_epochs_in_tickets(fake_sidecar: FakeSidecar) -> None:
    loader = DataLoader("imgs", batch_size=8, shuffle=True, seed=1, collate_fn=keep, sidecar=fake_sidecar)
    for expected_epoch in range(3):
        seen = Counter(t for batch in loader for _, t in batch)
        assert sum(seen.values()) == 50
    tickets = fake_sidecar.take_tickets()
    assert len(tickets) == 3 * 7
    assert [e for e, _ in tickets] == [0] * 7 + [1] * 7 + [2] * 7
    assert all(sorted(i for te, ids in tickets if te == e for i in ids) == list(range(50)) for e in range(3))


@pytest.mark.parametrize("persistent", [False, True])
def test_dataloader_workers_carry_epoch(fake_sidecar: FakeSidecar, persistent: bool) -> None:
    ds = Dataset("imgs", sidecar=fake_sidecar, loader=len)
    loader = DataLoader(ds, batch_size=10, num_workers=2, persistent_workers=persistent, collate_fn=keep)
    assert len(loader) == 5
    for _ in range(2):
        got = sorted(s for batch in loader for s, _ in batch)
        assert got == sorted(100 + i for i in range(50))
    loader.set_epoch(9)
    list(loader)
    tickets = fake_sidecar.take_tickets()
    assert sorted({e for e, _ in tickets}) == [0, 1, 9] and len(tickets) == 15


def test_default_collate_of_decoded_samples(fake_sidecar: FakeSidecar) -> None:
    loader = DataLoader("imgs", batch_size=4, loader=lambda b: torch.tensor(len(b)), sidecar=fake_sidecar)
    x, y = next(iter(loader))
    assert x.tolist() == [100, 101, 102, 103] and y.tolist() == [0, 1, 2, 3]


def test_dataloader_argument_checks(fake_sidecar: FakeSidecar) -> None:
    ds = Dataset("imgs", sidecar=fake_sidecar)
    with pytest.raises(ValueError, match="mutually exclusive"):
        DataLoader(ds, sampler=range(3), shuffle=True)
    with pytest.raises(ValueError, match="mutually exclusive"):
        DataLoader(ds, batch_sampler=[[0]], batch_size=2)
    with pytest.raises(ValueError, match="seed or generator"):
        DataLoader(ds, seed=1, generator=torch.Generator())
    with pytest.raises(ValueError, match="only apply when dataset is a name"):
        DataLoader(ds, transform=str)
    with pytest.raises(TypeError, match="unstall.torch.Dataset"):
        DataLoader(list(range(3)))  # type: ignore[arg-type]
    loader = DataLoader(ds, batch_sampler=[[1, 2], [3]], collate_fn=keep)
    assert [len(b) for b in loader] == [2, 1]


def test_wrong_ids_from_server_are_refused(fake_sidecar: FakeSidecar) -> None:
    fake_sidecar.lie_about_ids(True)
    ds = Dataset("imgs", sidecar=fake_sidecar)
    with pytest.raises(unstall.ProtocolMismatchError, match="refusing to feed"):
        ds.__getitems__([1, 2, 3])
    loader = DataLoader(ds, batch_size=5, num_workers=1, collate_fn=keep)
    with pytest.raises(unstall.ProtocolMismatchError, match="(?s)in DataLoader worker process 0.*refusing to feed"):
        list(loader)


def test_errors_keep_the_server_message(fake_sidecar: FakeSidecar) -> None:
    with fake_sidecar.flight_client() as c:
        with pytest.raises(unstall.DatasetNotFoundError, match="unknown dataset 'nope'") as err:
            c.fetch("nope", [0])
        assert isinstance(err.value, KeyError) and err.value.code == "NOT_FOUND"
        with pytest.raises(unstall.InvalidRequestError, match="sample id 50 is out of range for dataset 'imgs'"):
            c.fetch("imgs", [1, 50])
        assert c.fetch("imgs", [49]).num_rows == 1  # still serving
    with FlightClient(fake_sidecar.flight_location, "0" * 64) as bad:
        with pytest.raises(unstall.AuthenticationError):
            bad.fetch("imgs", [0])
    with FlightClient(fake_sidecar.flight_location, None) as none:
        with pytest.raises(unstall.AuthenticationError):
            none.describe("imgs")


def test_pickling_drops_the_connection_and_never_the_wrong_process(fake_sidecar: FakeSidecar) -> None:
    ds = Dataset("imgs", sidecar=fake_sidecar)
    ds[0]
    assert ds._client._conn is not None
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._client._conn is None and clone[1][1] == 1
    assert TOKEN not in repr(ds) and TOKEN not in repr(ds._client)


def test_spawned_workers_work(fake_sidecar: FakeSidecar) -> None:
    ds = Dataset("imgs", sidecar=fake_sidecar)
    loader = DataLoader(ds, batch_size=25, num_workers=1, multiprocessing_context="spawn", collate_fn=keep)
    assert sum(len(b) for b in loader) == 50


def test_torch_is_imported_lazily() -> None:
    import subprocess
    import sys

    code = "import sys, unstall; assert 'torch' not in sys.modules; unstall.Sidecar; print(unstall.DataLoader.__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "unstall.torch"
