"""The DataLoader's iterator hooks (``unstall.torch.register_iterator_hook``): order, removal, wrapping,
and who registers them (tracing always, analyze only in a run of ``unstall analyze``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import OrderedDict
from typing import Any, Callable, Iterator, List

import pytest
import torch.utils.data as tud

from unstall import hooks, tracing
from unstall.hooks import IteratorWrapper
from unstall.torch import DataLoader, Dataset, register_iterator_hook
from fake_sidecar import FakeSidecar


def keep(batch):
    return batch


class Tagging(IteratorWrapper):
    """Hands on each batch as ``(tag, batch)`` and records it."""

    def __init__(self, tag: str, inner: Iterator[Any], seen: List[Any]) -> None:
        super().__init__(inner)
        self.tag, self.seen = tag, seen

    def __next__(self) -> Any:
        batch = next(self._inner)
        self.seen.append((self.tag, batch))
        return (self.tag, batch)


def tagging_hook(tag: str, calls: List[Any], seen: List[Any]) -> Callable[..., Iterator[Any]]:
    def hook(loader: DataLoader, make_iterator: Callable[[], Iterator[Any]], epoch: int) -> Iterator[Any]:
        calls.append((tag, epoch, loader))
        return Tagging(tag, make_iterator(), seen)

    return hook


def ids(batch: Any) -> List[int]:
    return [sample[0] for sample, _ in batch]  # the fake's payload is bytes([id]) * (100 + id)


@pytest.fixture
def loader(fake_sidecar: FakeSidecar) -> DataLoader:
    return DataLoader(Dataset("imgs", sidecar=fake_sidecar), batch_size=8, collate_fn=keep)


def test_hooks_compose_in_registration_order_and_see_every_batch(loader: DataLoader) -> None:
    calls: List[Any] = []
    seen: List[Any] = []
    with register_iterator_hook(tagging_hook("a", calls, seen)), register_iterator_hook(tagging_hook("b", calls, seen)):
        it = iter(loader)
        assert len(it) == 7  # len() and attributes pass through every wrapper to torch's iterator
        assert isinstance(it._inner._inner, tracing.ObservedIterator)  # tracing's hook is the innermost
        assert it._dataset_kind is not None
        out = list(it)
        second = [tag_b for tag_b, _ in iter(loader)]
    # The last registered is called first and wraps what the earlier ones made: b(a(tracing(torch))).
    assert [(tag, epoch) for tag, epoch, _ in calls] == [("b", 0), ("a", 0), ("b", 1), ("a", 1)]
    assert all(who is loader for _, _, who in calls)
    assert [t for t, _ in out] == ["b"] * 7 and [t for t, _ in (inner for _, inner in out)] == ["a"] * 7
    assert sorted(i for _, (_, batch) in out for i in ids(batch)) == list(range(50))
    assert [t for t, _ in seen[:14]] == ["a", "b"] * 7  # each batch passes a, then b
    assert second == ["b"] * 7
    assert loader.stats().total.batches == 14  # tracing still saw every batch


def test_removed_hooks_no_longer_run(loader: DataLoader) -> None:
    calls: List[Any] = []
    seen: List[Any] = []
    a = register_iterator_hook(tagging_hook("a", calls, seen))
    b = register_iterator_hook(tagging_hook("b", calls, seen))
    try:
        a.remove()
        a.remove()  # again: no-op
        assert [t for t, _ in iter(loader)] == ["b"] * 7
        b.remove()
        assert all(isinstance(batch, list) for batch in loader)
        assert [tag for tag, _, _ in calls] == ["b"]
    finally:
        a.remove()
        b.remove()


def test_a_hook_may_replace_the_iterator(loader: DataLoader) -> None:
    made: List[int] = []

    def replace(loader: Any, make_iterator: Callable[[], Iterator[Any]], epoch: int) -> Iterator[Any]:
        made.append(epoch)
        return iter(["x", "y"])  # make_iterator never called: nothing observed, no workers

    with register_iterator_hook(replace):
        assert list(loader) == ["x", "y"]
    assert made == [0] and loader.stats().batches == 0


def test_without_hooks_iter_is_torchs_iterator(loader: DataLoader, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hooks, "_iterator_hooks", OrderedDict())
    it = iter(loader)
    assert isinstance(it, tud.dataloader._BaseDataLoaderIter)
    assert sum(len(b) for b in it) == 50


def test_hooks_must_be_callable() -> None:
    with pytest.raises(TypeError, match="callable"):
        register_iterator_hook("observe")  # type: ignore[arg-type]


def test_work_counters_is_a_declared_field(loader: DataLoader) -> None:
    ds = loader.dataset
    assert ds.work_counters is None
    assert sum(len(b) for b in loader) == 50
    assert ds.work_counters is not None and os.path.exists(ds.work_counters)
    assert not [k for k in vars(ds) if k.startswith("_unstall")]
    st = loader.stats()
    assert (st.batches, st.samples_fetched) == (7, 50)


def _registered(env_mode: str) -> List[str]:
    code = ("import sys, unstall.torch, unstall.hooks as h; "
            "print(*[f.__module__ + '.' + f.__name__ for f in h._iterator_hooks.values()]); "
            "import unstall.tracing; print('unstall.analyze.child' in sys.modules)")
    env = dict(os.environ)
    env.pop("UNSTALL_ANALYZE_MODE", None)
    if env_mode:
        env["UNSTALL_ANALYZE_MODE"] = env_mode
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    return out.split()


def test_tracing_registers_always_and_analyze_only_in_an_analysis_run() -> None:
    assert _registered("") == ["unstall.tracing.observe", "False"]
    assert _registered("cold") == ["unstall.tracing.observe", "unstall.analyze.child.iterator_hook", "True"]


def test_tracing_does_not_import_analyze() -> None:
    code = "import sys, unstall.tracing; print(sorted(m for m in sys.modules if m.startswith('unstall.analyze')))"
    env = {**os.environ, "UNSTALL_ANALYZE_MODE": "cold"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
