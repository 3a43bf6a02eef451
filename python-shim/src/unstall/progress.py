"""Progress bars (tqdm, optional) for long sidecar work seen from Python: indexing a dataset, warming a
cache, the runs of ``unstall analyze``. Shown on stderr when it is a terminal (``UNSTALL_PROGRESS=1``
forces them, ``0`` hides them); without tqdm installed they are silently absent."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Any, Iterator, Optional

__all__ = ["bar", "while_running", "enabled"]


def enabled() -> bool:
    v = os.environ.get("UNSTALL_PROGRESS")
    if v is not None:
        return v not in ("0", "false", "no", "off")
    return sys.stderr.isatty()


class _NoBar:
    n = 0

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix_str(self, s: str, refresh: bool = True) -> None:
        pass

    def set_description_str(self, s: str, refresh: bool = True) -> None:
        pass

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass


@contextlib.contextmanager
def bar(total: Optional[int] = None, desc: str = "", unit: str = "it", delay: float = 0.0, **kw: Any) -> Iterator[Any]:
    """A tqdm bar on stderr, or an object with the same methods that shows nothing."""
    b: Any = _NoBar()
    if enabled():
        try:
            from tqdm import tqdm

            b = tqdm(total=total, desc=desc, unit=unit, delay=delay, file=sys.stderr, dynamic_ncols=True, **kw)
        except ImportError:
            pass
    try:
        yield b
    finally:
        b.close()


@contextlib.contextmanager
def while_running(desc: str, delay: float = 1.0) -> Iterator[None]:
    """An elapsed-time bar for a blocking call that reports no progress (the sidecar indexing a
    dataset): it appears only if the call takes longer than ``delay`` seconds."""
    if not enabled():
        yield
        return
    stop = threading.Event()

    def tick() -> None:
        with bar(desc=desc, unit="s", delay=delay, bar_format="{desc}: {elapsed}") as b:
            while not stop.wait(0.5):
                b.refresh()

    t = threading.Thread(target=tick, name="unstall-progress", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(timeout=2)
        time.sleep(0)
