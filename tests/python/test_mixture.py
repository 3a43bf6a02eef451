"""``unstall.torch.Mixture`` through a real sidecar and real torch DataLoaders: three npy datasets whose rows
are ``[source tag, row index]``, so every delivered sample says which source and sample it is."""

from __future__ import annotations

import math
import re
import warnings
from collections import Counter
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import pytest
import torch

import unstall
from unstall.torch import DataLoader, Dataset, DistributedSampler, EpochIndex, Mixture

SIZES = {"mix-a": 12, "mix-b": 5, "mix-c": 20}  # mix-b is upsampled, mix-c downsampled at these weights
WEIGHTS = (2, 1.5, 1)
BATCH = 4

Draw = Tuple[int, int]  # (source index, sample index in that source)


@pytest.fixture(scope="module")
def sources(sidecar: unstall.Sidecar, tmp_path_factory: pytest.TempPathFactory) -> List[Dataset]:
    out = []
    for tag, (name, n) in enumerate(SIZES.items()):
        root = tmp_path_factory.mktemp(name)
        np.save(root / "rows.npy", np.stack([np.full(n, tag), np.arange(n)], axis=1).astype(np.int64))
        out.append(Dataset(name, root=root, format="npy", sidecar=sidecar))
    return out


def mixture(sources: Sequence[Dataset], weights: Sequence[float] = WEIGHTS, **kwargs: Any) -> Mixture:
    return Mixture(list(zip(sources, weights)), **kwargs)


def epochs(loader: DataLoader, count: int) -> List[List[Draw]]:
    """The draws each of ``count`` epochs delivered, in order, read from the samples themselves."""
    return [[(int(t), int(i)) for batch in loader for t, i in batch.tolist()] for _ in range(count)]


def test_each_batch_boundary_holds_the_proportions_within_one_sample(sources: List[Dataset]) -> None:
    m = mixture(sources)
    assert len(m) == sum(SIZES.values()) and m.transport == "shm"
    w = np.asarray(WEIGHTS) / sum(WEIGHTS)
    assert m.weights == tuple(w)
    for e, drawn in enumerate(epochs(DataLoader(m, batch_size=BATCH, num_workers=2), 2)):
        assert len(drawn) == len(m)
        assert drawn == list(zip(*(a.tolist() for a in m.draws(range(len(m)), e)))), "served as the mixture maps them"
        for end in [*range(BATCH, len(m), BATCH), len(m)]:
            counts = Counter(t for t, _ in drawn[:end])
            lag = [abs(counts[i] - end * w[i]) for i in range(len(w))]
            assert max(lag) < 1, f"epoch {e}, first {end} samples: counts {dict(counts)}, shares {end * w}"


def test_each_source_is_read_in_a_permutation_then_a_fresh_one(sources: List[Dataset]) -> None:
    m = mixture(sources, samples_per_epoch=60)
    (drawn,) = epochs(DataLoader(m, batch_size=BATCH), 1)
    for tag, n in enumerate(SIZES.values()):
        order = [i for t, i in drawn if t == tag]
        rounds = [order[k:k + n] for k in range(0, len(order), n)]
        assert len(rounds) == math.ceil(len(order) / n)
        for r, part in enumerate(rounds):
            assert len(set(part)) == len(part), f"source {tag} round {r}: no sample twice before all were drawn"
            assert len(part) < n or sorted(part) == list(range(n)), f"source {tag} round {r}: every sample once"
    b = [i for t, i in drawn if t == 1]
    assert len(b) > 2 * SIZES["mix-b"] and b[:5] != b[5:10], "an upsampled source reshuffles each round"


def test_the_order_is_a_function_of_the_seed_and_epoch(sources: List[Dataset]) -> None:
    first = epochs(DataLoader(mixture(sources, seed=7), batch_size=BATCH), 3)
    again = epochs(DataLoader(mixture(sources, seed=7), batch_size=BATCH, num_workers=2), 3)
    other = epochs(DataLoader(mixture(sources, seed=8), batch_size=BATCH), 1)
    assert first == again, "the same seed: the same samples in the same order, whatever the workers"
    assert len({tuple(e) for e in first}) == 3, "each epoch reads other permutations"
    assert [t for t, _ in first[0]] == [t for t, _ in first[1]], "the interleaving of sources is the same every epoch"
    assert other[0] != first[0]


def test_over_flight_the_same_samples_in_the_same_order(sidecar: unstall.Sidecar, sources: List[Dataset]) -> None:
    remote = [Dataset(s.name, sidecar=sidecar, transport="flight") for s in sources]
    m = mixture(remote, seed=7)
    assert m.transport == "flight" and m._local is None
    # Workers start from a forkserver once this process used gRPC: the mixture travels pickled.
    assert epochs(DataLoader(m, batch_size=BATCH, num_workers=2), 2) == epochs(
        DataLoader(mixture(sources, seed=7), batch_size=BATCH), 2)


def test_a_mid_epoch_state_resumes_exactly_in_a_new_loader(sources: List[Dataset]) -> None:
    whole = [d for e in epochs(DataLoader(mixture(sources, seed=3), batch_size=BATCH), 2) for d in e]
    loader = DataLoader(mixture(sources, seed=3), batch_size=BATCH, num_workers=2)
    consumed: List[Draw] = []
    it = iter(loader)
    for _ in range(5):  # the workers have prefetched further
        consumed += [(int(t), int(i)) for t, i in next(it).tolist()]
    state = loader.state_dict()
    assert state["dataset"] == loader.dataset.name and state["batches_yielded"] == 5
    assert all(s.name in state["dataset"] for s in sources), "the state names the mixture's sources"
    del it
    resumed = DataLoader(mixture(sources, seed=3), batch_size=BATCH)
    resumed.load_state_dict(state)
    rest = [d for e in epochs(resumed, 2) for d in e]
    assert consumed + rest == whole


class Noise:
    """A random augmentation: the row ``[source tag, row index]`` and a draw from torch's RNG."""

    def __call__(self, row: np.ndarray) -> torch.Tensor:
        return torch.tensor([*row.tolist(), torch.rand(()).item()], dtype=torch.float64)


def test_random_transforms_resume_exactly_seeded_once_per_batch(sidecar: unstall.Sidecar,
                                                                 sources: List[Dataset]) -> None:
    noisy = [Dataset(s.name, sidecar=sidecar, transform=Noise()) for s in sources]
    whole = [b.tolist() for b in DataLoader(mixture(noisy, seed=3), batch_size=BATCH, seed=5)]  # in this process
    loader = DataLoader(mixture(noisy, seed=3), batch_size=BATCH, seed=5, num_workers=2)
    it = iter(loader)
    got = [next(it).tolist() for _ in range(5)]
    state = loader.state_dict()
    del it
    resumed = DataLoader(mixture(noisy, seed=3), batch_size=BATCH, seed=5, num_workers=1)
    resumed.load_state_dict(state)
    assert got + [b.tolist() for b in resumed] == whole, "the same augmentations, whatever the workers"
    draws = [d for batch in whole for *_, d in batch]
    assert len(set(draws)) == len(draws), "a batch's sources draw on from one stream: none restarts it"


def test_a_state_from_another_mixture_is_refused_naming_what_differs(sources: List[Dataset]) -> None:
    state = DataLoader(mixture(sources), batch_size=BATCH).state_dict()
    cases: List[Tuple[Mixture, str]] = [
        (mixture(sources, (2, 1.5, 2)), "source 'mix-c' had weight 0.2222222222222222 there, 0.36363636363636365 here"),
        (mixture(sources[:2], (2, 1.5), samples_per_epoch=len(mixture(sources))),
         "its sources were ['mix-a', 'mix-b', 'mix-c'], this mixture's are ['mix-a', 'mix-b']"),
        (mixture(sources, seed=1), "seed was 0 there, 1 here"),
    ]
    for other, why in cases:
        with pytest.raises(ValueError, match="another mixture") as e:
            DataLoader(other, batch_size=BATCH).load_state_dict(state)
        assert why in str(e.value)
    with pytest.raises(ValueError, match="over dataset 'mix-a', not over a mixture"):
        DataLoader(mixture(sources), batch_size=BATCH).load_state_dict(DataLoader(sources[0]).state_dict())
    with pytest.raises(ValueError, match="this one reads 'mix-a'"):
        DataLoader(sources[0], batch_size=BATCH).load_state_dict(state)


@pytest.mark.parametrize("weight", [0, -1.0, float("nan"), float("inf"), True, "1", None])
def test_a_bad_weight_is_refused_naming_its_entry(sources: List[Dataset], weight: Any) -> None:
    with pytest.raises(ValueError, match=r"Mixture entry 1 \(dataset 'mix-b'\): the weight must be a finite number > 0"):
        Mixture([(sources[0], 1), (sources[1], weight)])


def test_bad_entries_are_refused(sources: List[Dataset]) -> None:
    with pytest.raises(ValueError, match="non-empty list of"):
        Mixture([])
    with pytest.raises(TypeError, match="entry 0 must be a .dataset, weight. pair"):
        Mixture([sources[0]])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="entry 1: the dataset must be an unstall.torch.Dataset, got list"):
        Mixture([(sources[0], 1), ([1, 2], 1)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"entry 0 \(dataset 'mix-a'\): the weight 5e-324 is too small"):
        mixture(sources[:2], (5e-324, 1))
    with pytest.raises(ValueError, match="sum to inf"):
        mixture(sources[:2], (1e308, 1e308))
    with pytest.raises(ValueError, match="samples_per_epoch must be an int >= 1, got 0"):
        mixture(sources, samples_per_epoch=0)
    with pytest.raises(IndexError, match=re.escape(f"position 37 is out of range for mixture {mixture(sources).name}")):
        mixture(sources)[EpochIndex(0, 37)]


def test_each_source_is_fetched_in_the_loaders_session_with_its_plan(sidecar: unstall.Sidecar,
                                                                     sources: List[Dataset]) -> None:
    m = mixture(sources, seed=5)
    loader = DataLoader(m, batch_size=BATCH, num_workers=2, clairvoyant=True)
    drawn = epochs(loader, 2)
    assert drawn == epochs(DataLoader(mixture(sources, seed=5), batch_size=BATCH), 2)
    assert m._local is not None and list(m._local.opened) == [loader.session], "one session for every epoch"
    stats = sidecar.stats()
    counts = Counter(t for t, _ in drawn[0])
    for tag, (name, session) in enumerate(zip(SIZES, m._local.opened[loader.session])):
        st = stats.session(session)
        assert (st.dataset, st.total.samples) == (name, 2 * counts[tag]), f"source {tag}: fetched in its own session"
        assert st.name.endswith(f"DataLoader#{loader._number} source {tag}")
    planned: Dict[str, int] = {name: min(counts[t], n) for t, (name, n) in enumerate(SIZES.items())}
    assert m.plan(range(len(m)), 1, session=loader.session) == sum(planned.values()), "a plan per source, up to its size"


def test_a_loader_that_shuffles_a_mixture_warns_once(sources: List[Dataset]) -> None:
    m = mixture(sources)
    warning = (f"DataLoader shuffles {m!r}: a shuffled order loses the proportions of each batch (the mixture shuffles "
               "each source itself); pass shuffle=False")
    cases = [(True, lambda: DataLoader(m, batch_size=BATCH, shuffle=True)),
             (True, lambda: DataLoader(m, batch_size=BATCH, sampler=DistributedSampler(m, 2, 0))),
             (False, lambda: DataLoader(m, batch_size=BATCH, shuffle=False)),
             (False, lambda: DataLoader(m, batch_size=BATCH, sampler=DistributedSampler(m, 2, 0, shuffle=False)))]
    for shuffled, make in cases:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            epochs(make(), 2)
        mine = [str(w.message) for w in record if issubclass(w.category, UserWarning) and "shuffles" in str(w.message)]
        assert mine == ([warning] if shuffled else []), "once per loader, and only when it shuffles"
