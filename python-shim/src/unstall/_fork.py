"""Objects that hold something of their process's own (a connection, a lock) and are made the child's own right
after a fork, before anything in the child can use them: a forked DataLoader worker never sends on, or waits for,
what its parent holds."""

from __future__ import annotations

import os
import weakref
from typing import Callable, Generic, TypeVar

__all__ = ["ResetInChild"]

T = TypeVar("T")


class ResetInChild(Generic[T]):
    """A weak registry: in a forked child, ``reset(obj)`` runs for each object added, right after the fork."""

    def __init__(self, reset: Callable[[T], None]) -> None:
        self._objects: "weakref.WeakSet[T]" = weakref.WeakSet()  # type: ignore[type-var]
        self._reset = reset
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork_in_child)

    def add(self, obj: T) -> None:
        self._objects.add(obj)

    def _after_fork_in_child(self) -> None:
        for obj in list(self._objects):
            self._reset(obj)
