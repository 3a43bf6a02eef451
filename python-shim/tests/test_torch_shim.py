"""The torch layer and the Flight client against the in-process fake data plane (no JVM)."""

from __future__ import annotations

import gc
import multiprocessing
import pickle
import random
from collections import Counter

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import unstall
from unstall.client import FlightClient
from unstall.sampling import batch_rng
from unstall.torch import DataLoader, Dataset, DistributedSampler, EpochIndex, EpochSampler
from fake_sidecar import TOKEN, FakeSidecar
from shim_batches import keep


def first_byte(payload: memoryview) -> int:
    return payload[0]


# -- EpochSampler -----------------------------------------------------------------------------


def _unseeded(ix: EpochIndex) -> EpochIndex:
    """``ix`` without its batch's seed (test_batch_seeds_follow_the_batches checks those)."""
    return ix._replace(batch_seed=None)


def test_epoch_sampler_tags_and_advances_per_iteration() -> None:
    s = EpochSampler(range(3))
    assert len(s) == 3 and s.epoch == 0
    assert [_unseeded(ix) for ix in s] == [EpochIndex(0, 0), EpochIndex(0, 1), EpochIndex(0, 2)]
    assert [ix.epoch for ix in s] == [1, 1, 1]
    s.set_epoch(7)
    s.session = 5  # a DataLoader's session on the local socket travels with each index
    assert {_unseeded(ix) for ix in s} == {EpochIndex(7, i, 5) for i in range(3)}
    assert s.epoch == 8 and s.state_dict()["epoch"] == 8


def test_epoch_sampler_advances_only_when_iteration_starts() -> None:
    # torch calls iter() twice for the first multi-process epoch; only the consumed one counts.
    s = EpochSampler(range(2))
    iter(s)
    iter(s)
    assert _unseeded(next(iter(s))) == EpochIndex(0, 0)


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
    assert [[_unseeded(ix) for ix in b] for b in s] == [[EpochIndex(0, 0), EpochIndex(0, 1)], [EpochIndex(0, 2)]]
    assert inner.epochs == [0]  # told every epoch: its order is a function of (its seed, epoch)
    s.set_epoch(3)
    list(s)
    list(s)
    assert inner.epochs == [0, 3, 4] and s.order == "set_epoch"
    with pytest.raises(ValueError):
        s.set_epoch(-1)


def _orders(s: EpochSampler, epochs: int) -> list[list[int]]:
    return [[ix.index for ix in s] for _ in range(epochs)]


def test_epoch_order_is_a_function_of_seed_and_epoch_only() -> None:
    # One sampler runs epochs 0..3; another, with the same base seed, starts at epoch 2 (a restart).
    full = _orders(EpochSampler(tud.RandomSampler(range(20)), seed=7), 4)
    assert len({tuple(o) for o in full}) == 4 and all(sorted(o) == list(range(20)) for o in full)
    late = EpochSampler(tud.RandomSampler(range(20)), seed=7, start_epoch=2)
    assert _orders(late, 2) == full[2:]
    assert _orders(EpochSampler(tud.RandomSampler(range(20)), seed=8), 1) != full[:1]
    # A user's generator: its initial seed is the base seed, however far it advanced.
    g = torch.Generator().manual_seed(7)
    torch.randperm(5, generator=g)
    assert _orders(EpochSampler(tud.RandomSampler(range(20), generator=g)), 4) == full
    # Neither: a base seed drawn once from torch's global RNG, kept in the state.
    torch.manual_seed(3)
    drawn = EpochSampler(tud.RandomSampler(range(20)))
    first = _orders(drawn, 2)
    again = EpochSampler(tud.RandomSampler(range(20)))
    again.load_state_dict({**drawn.state_dict(), "epoch": 1})
    assert drawn.state_dict()["order"] == "seed" and _orders(again, 1) == first[1:]


def test_epoch_sampler_state_resumes_mid_epoch_without_drawing_the_skipped_items_twice() -> None:
    s = EpochSampler(tud.BatchSampler(tud.RandomSampler(range(10)), 3, False), batched=True, seed=1)
    epochs = [[[ix.index for ix in b] for b in s] for _ in range(2)]
    r = EpochSampler(tud.BatchSampler(tud.RandomSampler(range(10)), 3, False), batched=True, seed=5)
    r.load_state_dict({"version": 1, "epoch": 1, "seed": 1, "skip": 2})
    assert r.state_dict() == {"version": 1, "epoch": 1, "seed": 1, "order": "seed", "skip": 2}
    assert [[ix.index for ix in b] for b in r] == epochs[1][2:]
    assert r.skip == 0 and r.epoch == 2
    r.load_state_dict({"version": 1, "epoch": 1, "seed": 1, "skip": 2})
    r.set_epoch(4)  # another epoch: the skip was for epoch 1 only
    assert sum(1 for _ in r) == 4
    with pytest.raises(ValueError, match="version"):
        r.load_state_dict({"epoch": 1})
    with pytest.raises(ValueError, match="'skip' must be a non-negative int"):
        r.load_state_dict({"version": 1, "epoch": 1, "seed": 1, "skip": -1})


def test_a_distributed_sampler_is_told_the_epoch_unless_its_caller_sets_it() -> None:
    ds = list(range(12))
    dist = tud.DistributedSampler(ds, num_replicas=2, rank=0, seed=4)
    s = EpochSampler(dist)
    ref = tud.DistributedSampler(ds, num_replicas=2, rank=0, seed=4)
    expected = []
    for e in range(3):
        ref.set_epoch(e)
        expected.append(list(ref))
    assert _orders(s, 2) == expected[:2]
    # The usual DDP loop sets the sampler's epoch itself (here: a restart at epoch 2): it is followed.
    restarted = EpochSampler(tud.DistributedSampler(ds, num_replicas=2, rank=0, seed=4))
    restarted.sampler.set_epoch(2)  # type: ignore[attr-defined]
    assert restarted.epoch == 2 and [ix.epoch for ix in restarted] == [2] * 6
    assert _orders(restarted, 0) == [] and restarted.epoch == 3


def test_a_sampler_that_cannot_be_reseeded_says_so() -> None:
    class Own(tud.Sampler):
        def __iter__(self):
            return iter([2, 0, 1])

        def __len__(self) -> int:
            return 3

    s = EpochSampler(Own())
    assert s.state_dict()["order"] == "sampler"
    with pytest.warns(UserWarning, match="Own can be neither told the epoch"):
        s.load_state_dict({"version": 1, "epoch": 1, "seed": 0, "skip": 1})
    assert EpochSampler(range(4)).state_dict()["order"] == "fixed"


def _draws() -> tuple[list[float], float, float]:
    """What a random augmentation draws: from torch's, python's and numpy's global RNGs."""
    return torch.rand(2).tolist(), random.random(), float(np.random.rand())


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def test_batch_rng_seeds_the_batch_and_gives_the_process_rngs_back() -> None:
    _seed_all(1)
    undisturbed = [_draws(), _draws()]
    _seed_all(1)
    with batch_rng([EpochIndex(0, 0, 0, 99), EpochIndex(0, 1, 0, 99)]):
        a = _draws()
    with batch_rng([EpochIndex(3, 7, 2, 99)]):  # the seed alone decides
        b = _draws()
    with batch_rng([EpochIndex(0, 0, 0, 98)]):
        c = _draws()
    assert a == b and a != c
    assert _draws() == undisturbed[0]
    with batch_rng([5, 6]):  # plain indices (a stock torch DataLoader): the process's own RNGs
        assert _draws() == undisturbed[1]


def test_batch_seeds_follow_the_batches() -> None:
    flat = EpochSampler(tud.RandomSampler(range(10)), batch_size=3, seed=1)
    batched = EpochSampler(tud.BatchSampler(tud.RandomSampler(range(10)), 3, False), batched=True, seed=1)
    epoch0 = [ix.batch_seed for ix in flat]
    assert [epoch0[k:k + 3] for k in range(0, 10, 3)] == [[ix.batch_seed for ix in b] for b in batched]
    assert len(set(epoch0)) == 4 and all(len(set(epoch0[k:k + 3])) == 1 for k in range(0, 10, 3))
    assert not set(epoch0) & {ix.batch_seed for ix in flat}  # another epoch, other seeds
    resumed = EpochSampler(tud.RandomSampler(range(10)), batch_size=3, seed=5)
    resumed.load_state_dict({"version": 1, "epoch": 0, "seed": 1, "skip": 6})
    assert [ix.batch_seed for ix in resumed] == epoch0[6:]


def test_batch_seeds_are_job_wide_over_a_distributed_sampler() -> None:
    ds = list(range(24))

    def seeds_of(sampler: tud.Sampler) -> dict[int, int]:
        return {ix.index: ix.batch_seed for ix in EpochSampler(sampler, batch_size=4, seed=0)}

    # unstall's: a batch is named by its first position in the job-wide order, so with 4 items per batch the
    # same batches draw alike on 2 and on 3 ranks.
    on = {w: [seeds_of(DistributedSampler(ds, num_replicas=w, rank=r, batch_size=4)) for r in range(w)]
          for w in (2, 3)}
    two, three = ({k: v for rank in on[w] for k, v in rank.items()} for w in (2, 3))
    assert two == three and len(two) == 24 and len(set(two.values())) == 6
    # torch's: its ranks' k-th batches are told apart.
    ranks = [seeds_of(tud.DistributedSampler(ds, num_replicas=2, rank=r)) for r in range(2)]
    assert len(set(ranks[0].values()) | set(ranks[1].values())) == 6


class Jitter:
    """A random augmentation: the sample with what it draws from torch's, python's and numpy's global RNGs."""

    def __call__(self, sample: int) -> tuple[int, tuple[list[float], float, float]]:
        return sample, _draws()


@pytest.mark.parametrize("workers", [0, 2])
def test_random_transforms_resume_exactly_on_any_num_workers(fake_sidecar: FakeSidecar, workers: int) -> None:
    ds = Dataset("imgs", sidecar=fake_sidecar, loader=first_byte, transform=Jitter())
    _seed_all(2)
    undisturbed = _draws()
    _seed_all(2)
    ref = DataLoader(ds, batch_size=8, shuffle=True, seed=3, collate_fn=keep)  # transforms in this process
    whole = list(ref)
    assert _draws() == undisturbed, "the transforms left the trainer's RNGs as they were"
    assert len({draws[1] for batch in whole for (_, draws), _ in batch}) == 50
    a = DataLoader(ds, batch_size=8, shuffle=True, seed=3, collate_fn=keep, num_workers=workers)
    it = iter(a)
    got = [next(it) for _ in range(3)]
    state = a.state_dict()
    del it, a
    b = DataLoader(ds, batch_size=8, shuffle=True, seed=3, collate_fn=keep, num_workers=2 - workers,
                   persistent_workers=workers == 0)
    b.load_state_dict(state)
    assert got + list(b) == whole


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
    for _expected_epoch in range(3):
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


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_state_dict_resumes_at_the_next_batch(fake_sidecar: FakeSidecar, workers: int) -> None:
    def ids(batch: list) -> list[int]:
        return [s for s, _ in batch]

    ds = Dataset("imgs", sidecar=fake_sidecar, loader=first_byte)  # a sample's bytes are its id
    ref = DataLoader(ds, batch_size=8, shuffle=True, collate_fn=keep)  # no seed: one drawn and kept
    whole = [[ids(b) for b in ref] for _ in range(2)]
    a = DataLoader(ds, batch_size=8, shuffle=True, collate_fn=keep, num_workers=workers)
    a.load_state_dict({**ref.state_dict(), "epoch": 0})
    assert [ids(b) for b in a] == whole[0]
    it = iter(a)
    got = [ids(next(it)) for _ in range(3)]  # workers prefetch ahead; 3 batches were handed out
    state = a.state_dict()
    assert state == {"version": 1, "dataset": "imgs", "epoch": 1, "batches_yielded": 3, "num_batches": 7,
                     "seed": ref.state_dict()["seed"], "order": "seed"}
    del it, a  # the loader holds its iterator (as torchdata's does): drop both, so that torch shuts the
    gc.collect()  # workers down and joins them: every ticket they prefetched has been sent by now
    fake_sidecar.take_tickets()
    b = DataLoader(ds, batch_size=8, shuffle=True, collate_fn=keep, num_workers=2 - workers)
    b.load_state_dict(state)
    assert b.state_dict() == state
    rest = [ids(x) for x in b]
    assert got + rest == whole[1]
    assert sorted(i for _, t in fake_sidecar.take_tickets() for i in t) == sorted(i for x in rest for i in x), \
        "the consumed batches are skipped in the sampler, never fetched"
    assert b.state_dict()["epoch"] == 2 and b.state_dict()["batches_yielded"] == 0
    with pytest.raises(ValueError, match="8 batches per epoch over dataset 'imgs'; this one has 7"):
        b.load_state_dict({**state, "num_batches": 8})
    with pytest.raises(ValueError, match="order is 'seed'; this one's is 'fixed'"):
        DataLoader(ds, batch_size=8, collate_fn=keep).load_state_dict(state)
    with pytest.raises(ValueError, match="state_dict\\(\\) needs in_order=True"):
        DataLoader(ds, batch_size=8, num_workers=1, in_order=False, collate_fn=keep).state_dict()


@pytest.mark.parametrize("persistent", [False, True])
def test_workers_of_an_iterator_collected_in_a_cycle_exit_on_their_own(fake_sidecar: FakeSidecar,
                                                                      persistent: bool) -> None:
    # An exception's traceback holds the loop's frames in a cycle: the iterator dies in the garbage collector.
    before = set(multiprocessing.active_children())
    loader = DataLoader(Dataset("imgs", sidecar=fake_sidecar), batch_size=5, num_workers=2,
                        persistent_workers=persistent, collate_fn=keep)
    it = iter(loader)
    next(it)
    workers = [p for p in multiprocessing.active_children() if p not in before]
    cycle: list = [it, loader]
    cycle.append(cycle)
    del it, loader, cycle
    gc.collect()  # torch's __del__ stops the workers and joins them, terminating those that did not stop
    assert len(workers) == 2 and [w.exitcode for w in workers] == [0, 0], "told to stop, not terminated"


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
