"""Whether this process's loaders are analysed: the analysis a loader asks for each time it is iterated.

``unstall analyze`` runs the training command with ``UNSTALL_ANALYZE_*`` in its environment (``runner``): there
the analysis is the session those variables describe (``child.session()``, made when the first loader asks).
Code may also enter a session itself, for the extent of a ``with analysis(session):`` block. Loaders consult
:func:`observers` (``unstall.torch.DataLoader``) or :func:`current` (``unstall.tf``); nothing is registered by
importing a module, and this one imports ``child`` only when an analysis is asked for.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Iterator, Optional, Tuple

from . import ENV_MODE

if TYPE_CHECKING:
    from .child import Session

__all__ = ["analysis", "current", "observers"]

_entered: "ContextVar[Optional[Session]]" = ContextVar("unstall_analysis", default=None)


@contextmanager
def analysis(session: "Session") -> Iterator["Session"]:
    """Analyses the loaders iterated inside the block with ``session``; on leaving, the session stops
    intercepting tf.data iteration (``Session.close``) and the loaders run unanalysed again."""
    token = _entered.set(session)
    try:
        yield session
    finally:
        _entered.reset(token)
        session.close()


def current() -> Optional["Session"]:
    """The session entered here, else, in a process that ``unstall analyze`` runs, the one its environment
    describes; None otherwise."""
    entered = _entered.get()
    if entered is not None or not os.environ.get(ENV_MODE):
        return entered
    from .child import session

    return session()


def observers() -> Tuple["Session", ...]:
    """The analysis as a loader's outermost observer: ``(session,)`` or ``()``."""
    s = current()
    return () if s is None else (s,)
