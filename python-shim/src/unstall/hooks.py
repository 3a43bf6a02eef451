"""Iterator hooks: what ``unstall.torch.DataLoader.__iter__`` runs to build each epoch's iterator.

Modelled on torch's hook registration (``Module.register_forward_hook`` returns a ``RemovableHandle``).
A hook is called as ``hook(loader, make_iterator, epoch)`` and returns the iterator the loop gets:
usually a wrapper around ``make_iterator()``, which builds the iterator of the hooks registered before
it (and, at the bottom, torch's own). Hooks therefore compose in registration order: the first one
registered wraps torch's iterator, each later one wraps what the earlier ones return, so the last one
registered is the first that the loop's ``next()`` reaches. A hook decides when (and whether) to call
``make_iterator``: before it, nothing has started (no worker processes, no epoch bookkeeping).

The shim registers two: ``unstall.tracing`` (always, when it is imported: ``loader.stats()``, stall
spans, the epoch line) and, only in a process that ``unstall analyze`` runs, ``unstall.analyze.child``
(drives the analysed loader's iterator), in that order.

This module imports nothing heavy (no torch), so that ``tracing`` and ``analyze.child`` can register
without importing ``unstall.torch``.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from functools import partial
from typing import Any, Callable, Dict, Iterator

__all__ = ["IteratorHook", "IteratorWrapper", "RemovableHandle", "register_iterator_hook", "run_iterator_hooks"]

# The loader is an ``unstall.torch.DataLoader``, typed Any: this module sits below the integrations.
IteratorHook = Callable[[Any, Callable[[], Iterator[Any]], int], Iterator[Any]]
"""``hook(loader, make_iterator, epoch) -> iterator``: ``epoch`` is the epoch this iteration carries."""

_iterator_hooks: "OrderedDict[int, IteratorHook]" = OrderedDict()  # registration order
_ids = itertools.count()
_lock = threading.Lock()


class RemovableHandle:
    """Returned by :func:`register_iterator_hook`; ``remove()`` unregisters the hook (again: no-op).
    Also a context manager that removes the hook on exit, like torch's ``RemovableHandle``."""

    def __init__(self, hooks: Dict[int, Any], hook_id: int) -> None:
        self._hooks = hooks
        self.id = hook_id

    def remove(self) -> None:
        with _lock:
            self._hooks.pop(self.id, None)

    def __enter__(self) -> "RemovableHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def register_iterator_hook(hook: IteratorHook) -> RemovableHandle:
    """Registers ``hook`` for every ``unstall.torch.DataLoader`` of this process, after (so around) the
    hooks already registered; the handle's ``remove()`` unregisters it. It applies from the next
    ``iter(loader)`` on; an iterator already made keeps its wrappers."""
    if not callable(hook):
        raise TypeError(f"an iterator hook must be callable, got {type(hook).__name__}")
    with _lock:
        hook_id = next(_ids)
        _iterator_hooks[hook_id] = hook
    return RemovableHandle(_iterator_hooks, hook_id)


def run_iterator_hooks(loader: Any, make_iterator: Callable[[], Iterator[Any]], epoch: int) -> Iterator[Any]:
    """The epoch's iterator: ``make_iterator()`` (torch's) wrapped by every registered hook, in order;
    ``make_iterator()`` itself when none is registered."""
    with _lock:
        hooks = list(_iterator_hooks.values())
    make = make_iterator
    for hook in hooks:
        make = partial(hook, loader, make, epoch)
    return make()


class IteratorWrapper:
    """A base for what a hook returns: iterates ``inner`` and otherwise behaves like it (``len()`` and
    attributes pass through, so the loop still sees torch's iterator, however many hooks wrap it)."""

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

