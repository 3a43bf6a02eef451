"""What observes a loader's epochs: the :class:`Observer` protocol, :func:`observed` that composes observers, and
:class:`IteratorWrapper`, the base of what they return.

A loader holds its observers (``unstall.torch.DataLoader(observers=...)``; by default ``unstall.tracing``'s
stall observer, which ``loader.stats()`` reads) and composes them in its ``__iter__``; under ``unstall analyze``
the analysis (``unstall.analyze.context``) is the last one. Nothing registers itself by being imported.

An observer is called as ``observer.iterate(loader, make_iterator, epoch)`` and returns the iterator the loop
gets: usually a wrapper around ``make_iterator()``, which builds the iterator of the observers before it (and,
at the bottom, the loader's own). The first observer wraps the loader's iterator, each later one wraps what the
earlier ones return, so the last is the first that the loop's ``next()`` reaches. An observer decides when (and
whether) to call ``make_iterator``: before it, nothing has started (no worker processes, no epoch bookkeeping).

This module imports nothing heavy (no torch): ``tracing`` and ``analyze`` implement observers below the
integrations.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Iterable, Iterator, Protocol, Tuple

__all__ = ["Observer", "IteratorWrapper", "held", "observed"]


class Observer(Protocol):
    """Watches (or drives) a loader's epochs."""

    def iterate(self, loader: Any, make_iterator: Callable[[], Iterator[Any]], epoch: int) -> Iterator[Any]:
        """The iterator of ``loader``'s epoch ``epoch``, usually a wrapper around ``make_iterator()``."""
        ...


def held(loader: Any, observers: Iterable[Any]) -> Tuple[Observer, ...]:
    """The observers ``loader`` takes, checked; each that keeps state of one loader (a ``bind(loader)`` method,
    as ``unstall.tracing.StallObserver``) is bound to it."""
    out = tuple(observers)
    for observer in out:
        if not callable(getattr(observer, "iterate", None)):
            raise TypeError(f"an observer needs an iterate(loader, make_iterator, epoch) method; "
                            f"{type(observer).__name__} has none")
        bind = getattr(observer, "bind", None)
        if callable(bind):
            bind(loader)
    return out


def observed(loader: Any, make_iterator: Callable[[], Iterator[Any]], epoch: int,
             observers: Iterable[Observer]) -> Iterator[Any]:
    """The epoch's iterator: ``make_iterator()`` wrapped by each observer in turn (the first innermost);
    ``make_iterator()`` itself without observers."""
    make = make_iterator
    for observer in observers:
        make = partial(observer.iterate, loader, make, epoch)
    return make()


class IteratorWrapper:
    """A base for what an observer returns: iterates ``inner`` and otherwise behaves like it (``len()`` and
    attributes pass through, so the loop still sees the loader's iterator, however many observers wrap it)."""

    def __init__(self, inner: Iterator[Any]) -> None:
        self._inner = inner

    def __iter__(self) -> "IteratorWrapper":
        return self

    def __next__(self) -> Any:
        return next(self._inner)

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "_inner":  # not set yet: never recurse
            raise AttributeError(name)
        return getattr(self._inner, name)
