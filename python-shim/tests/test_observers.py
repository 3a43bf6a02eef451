"""A DataLoader's observers (``unstall.observers``): held by the loader, composed in its ``__iter__`` in the order
given, the stall observer by default (what ``loader.stats()`` reads), and the analysis of ``unstall analyze``
outermost, only while a session is current (``unstall.analyze.context``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, List

import pytest
import torch.utils.data as tud

from unstall import tracing
from unstall.analyze.child import AnalyzedIterator, Session
from unstall.analyze.context import analysis
from unstall.observers import IteratorWrapper
from unstall.state import CountingIterator
from unstall.torch import DataLoader, Dataset, StallObserver
from fake_sidecar import FakeSidecar
from shim_batches import keep


class Tagging(IteratorWrapper):
    """Hands on each batch as ``(tag, batch)`` and records it."""

    def __init__(self, tag: str, inner: Iterator[Any], seen: List[Any]) -> None:
        super().__init__(inner)
        self.tag, self.seen = tag, seen

    def __next__(self) -> Any:
        batch = next(self._inner)
        self.seen.append((self.tag, batch))
        return (self.tag, batch)


class TaggingObserver:
    def __init__(self, tag: str, calls: List[Any], seen: List[Any]) -> None:
        self.tag, self.calls, self.seen = tag, calls, seen

    def iterate(self, loader: DataLoader, make_iterator: Callable[[], Iterator[Any]], epoch: int) -> Iterator[Any]:
        self.calls.append((self.tag, epoch, loader))
        return Tagging(self.tag, make_iterator(), self.seen)


def ids(batch: Any) -> List[int]:
    return [sample[0] for sample, _ in batch]  # the fake's payload is bytes([id]) * (100 + id)


@pytest.fixture
def dataset(fake_sidecar: FakeSidecar) -> Dataset:
    return Dataset("imgs", sidecar=fake_sidecar)


@pytest.fixture
def loader(dataset: Dataset) -> DataLoader:
    return DataLoader(dataset, batch_size=8, collate_fn=keep)


def test_the_default_is_one_stall_observer_around_torchs_iterator(loader: DataLoader) -> None:
    (stall,) = loader.observers
    assert isinstance(stall, StallObserver) and loader.stall_observer is stall and stall.loader is loader
    it = iter(loader)
    assert isinstance(it, tracing.ObservedIterator) and isinstance(it._inner, CountingIterator)
    assert isinstance(it._inner._inner, tud.dataloader._BaseDataLoaderIter)
    assert sum(len(b) for b in it) == 50
    assert loader.stats().batches == 7  # the stall observer measured the epoch


def test_observers_compose_in_the_order_given_and_see_every_batch(dataset: Dataset) -> None:
    calls: List[Any] = []
    seen: List[Any] = []
    loader = DataLoader(dataset, batch_size=8, collate_fn=keep, observers=[
        StallObserver(), TaggingObserver("a", calls, seen), TaggingObserver("b", calls, seen)])
    it = iter(loader)
    assert len(it) == 7  # len() and attributes pass through every wrapper to torch's iterator
    assert isinstance(it._inner._inner, tracing.ObservedIterator)  # the first observer is the innermost
    assert it._dataset_kind is not None
    out = list(it)
    second = [tag_b for tag_b, _ in iter(loader)]
    # The last given is called first and wraps what the earlier ones made: b(a(stall(torch))).
    assert [(tag, epoch) for tag, epoch, _ in calls] == [("b", 0), ("a", 0), ("b", 1), ("a", 1)]
    assert all(who is loader for _, _, who in calls)
    assert [t for t, _ in out] == ["b"] * 7 and [t for t, _ in (inner for _, inner in out)] == ["a"] * 7
    assert sorted(i for _, (_, batch) in out for i in ids(batch)) == list(range(50))
    assert [t for t, _ in seen[:14]] == ["a", "b"] * 7  # each batch passes a, then b
    assert second == ["b"] * 7
    assert loader.stats().total.batches == 14  # the stall observer still saw every batch


def test_each_loader_has_its_own_observers(dataset: Dataset) -> None:
    calls: List[Any] = []
    tagged = DataLoader(dataset, batch_size=8, collate_fn=keep,
                        observers=[StallObserver(), TaggingObserver("a", calls, [])])
    plain = DataLoader(dataset, batch_size=8, collate_fn=keep)
    assert all(isinstance(batch, list) for batch in plain)  # the other loader's observer is not this one's
    assert [t for t, _ in tagged] == ["a"] * 7
    assert [who for _, _, who in calls] == [tagged]
    assert (plain.stats().total.batches, tagged.stats().total.batches) == (7, 7)


def test_an_observer_may_replace_the_iterator(dataset: Dataset) -> None:
    made: List[int] = []

    class Replacing:
        def iterate(self, loader: Any, make_iterator: Callable[[], Iterator[Any]], epoch: int) -> Iterator[Any]:
            made.append(epoch)
            return iter(["x", "y"])  # make_iterator never called: nothing observed, no workers

    stall = StallObserver()
    loader = DataLoader(dataset, batch_size=8, collate_fn=keep, observers=[stall, Replacing()])
    assert list(loader) == ["x", "y"]
    assert made == [0] and loader.stats().batches == 0 and stall.counters is None


def test_without_observers_iter_is_torchs_iterator_and_stats_says_why_there_are_none(dataset: Dataset) -> None:
    loader = DataLoader(dataset, batch_size=8, collate_fn=keep, observers=())
    it = iter(loader)
    # only the count that marks the epoch's end for state_dict wraps it
    assert isinstance(it, CountingIterator) and isinstance(it._inner, tud.dataloader._BaseDataLoaderIter)
    assert sum(len(b) for b in it) == 50
    assert dataset.work_counters is None  # nothing counts
    with pytest.raises(ValueError, match="DataLoader over 'imgs' has no StallObserver"):
        loader.stats()


def test_observers_need_an_iterate_method(dataset: Dataset) -> None:
    with pytest.raises(TypeError, match="str has none"):
        DataLoader(dataset, observers=["observe"])  # type: ignore[list-item]


def test_a_stall_observer_observes_one_loader(dataset: Dataset) -> None:
    stall = StallObserver()
    first = DataLoader(dataset, observers=[stall])
    with pytest.raises(ValueError, match="give each loader its own"):
        DataLoader(dataset, observers=[stall])
    assert stall.loader is first


def test_work_counters_is_a_declared_field(loader: DataLoader) -> None:
    ds = loader.dataset
    assert ds.work_counters is None
    assert sum(len(b) for b in loader) == 50
    stall = loader.stall_observer
    assert stall is not None and stall.counters is not None  # the observer owns the table; the Dataset its path
    assert ds.work_counters == stall.counters.path and os.path.exists(ds.work_counters)
    assert not [k for k in vars(ds) if k.startswith("_unstall")]
    st = loader.stats()
    assert (st.batches, st.samples_fetched) == (7, 50)


def test_the_analysis_observes_only_inside_its_context(loader: DataLoader, tmp_path: Path) -> None:
    report = tmp_path / "run.json"
    with analysis(Session("real", steps=2, warmup=1, report=report, warm=False)) as session:
        it = iter(loader)
        assert isinstance(it, AnalyzedIterator) and isinstance(it._inner, tracing.ObservedIterator)  # outermost
        analysed = list(it)
    # 1 warm-up + 2 timed steps: the batch that ends the window is never handed out
    assert len(analysed) == 2
    assert isinstance(iter(loader), tracing.ObservedIterator)
    assert sum(len(b) for b in loader) == 50  # a whole epoch again, unanalysed
    session.write()
    (section,) = json.loads(report.read_text())["sections"]
    assert (section["status"], section["kind"], section["dataset"]["name"]) == ("ok", "torch.DataLoader", "imgs")
    assert len(section["wait_ns"]) == 2 and section["work"]["fetch_samples"] > 0


def test_an_analysed_loader_without_a_stall_observer_says_why(dataset: Dataset, tmp_path: Path) -> None:
    loader = DataLoader(dataset, batch_size=8, collate_fn=keep, observers=())
    report = tmp_path / "run.json"
    with analysis(Session("real", steps=2, warmup=1, report=report, warm=False)) as session:
        assert sum(len(b) for b in loader) == 50  # it runs unchanged
    session.write()
    (section,) = json.loads(report.read_text())["sections"]
    assert section["status"] == "error" and "has no StallObserver" in section["error"]


def _current(env_mode: str, tmp_path: Path) -> List[str]:
    code = ("import sys, unstall.torch; from unstall.analyze import context; "
            "before = 'unstall.analyze.child' in sys.modules; s = context.current(); "
            "print(before, getattr(s, 'mode', None), 'unstall.analyze.child' in sys.modules)")
    env = dict(os.environ)
    env.pop("UNSTALL_ANALYZE_MODE", None)
    if env_mode:
        env.update(UNSTALL_ANALYZE_MODE=env_mode, UNSTALL_ANALYZE_REPORT=str(tmp_path / "run.json"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    return out.split()


def test_importing_registers_nothing_and_the_analysis_is_the_environments_when_asked(tmp_path: Path) -> None:
    assert _current("", tmp_path) == ["False", "None", "False"]
    assert _current("cold", tmp_path) == ["False", "cold", "True"]


def test_tracing_does_not_import_analyze() -> None:
    code = "import sys, unstall.tracing; print(sorted(m for m in sys.modules if m.startswith('unstall.analyze')))"
    env = {**os.environ, "UNSTALL_ANALYZE_MODE": "cold"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_tf_watch_lasts_as_long_as_the_analysis_and_leaves_other_datasets_alone(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")
    import unstall.tf

    original = tf.data.Dataset.__iter__
    plain = tf.data.Dataset.range(3).map(lambda x: x * 2)
    with pytest.raises(ValueError, match="_MapDataset is not a dataset returned by unstall.tf.dataset"):
        unstall.tf.membership(plain)
    with analysis(Session("real", steps=2, warmup=1, report=tmp_path / "run.json", warm=False)) as session:
        session.watch_tf(unstall.tf._analysed_source)
        assert tf.data.Dataset.__iter__ is not original
        assert [int(x) for x in plain] == [0, 2, 4]  # built on no unstall dataset: iterated as before
    assert tf.data.Dataset.__iter__ is original
    assert not session.sections
