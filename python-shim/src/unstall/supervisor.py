"""The supervisor thread of a ``Sidecar``: a health check every ``UNSTALL_HEALTH_INTERVAL`` seconds, and
recovery when it fails (``Sidecar.supervise_once``). It never dies of an error: the next check tries again."""

from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

from .errors import SidecarError

__all__ = ["Supervisor"]

log = logging.getLogger("unstall")


class Supervisor:
    """Calls ``check()`` every ``interval`` seconds on a daemon thread until ``stop()`` or until ``check()``
    returns False; ``what`` names the supervised sidecar in debug logs."""

    def __init__(self, check: Callable[[], bool], interval: float, what: str) -> None:
        self._check = check
        self._interval = interval
        self._what = what
        self._stop = threading.Event()
        self.thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="unstall-sidecar-supervisor", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                if not self._check():
                    return
            except SidecarError as e:
                log.debug("unstall: supervision of %s: %s", self._what, e)
            except Exception:
                log.debug("unstall: supervision of %s failed", self._what, exc_info=True)
