"""The bounded wait of the cross-process tests (never a bare sleep loop). A module of its own, not in
conftest.py: pytest collects python-shim/tests and tests/python in one run, and `from conftest import ...`
would find the other folder's conftest."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Callable, TypeVar

import pytest

T = TypeVar("T")


def wait_until(probe: Callable[[], T], what: str, timeout: float = 60.0, interval: float = 0.05) -> T:
    """Polls ``probe`` until it returns something truthy (returned), failing after ``timeout`` seconds
    with ``what`` in the message: a bound on a hang, not a timing assertion."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def send_signal(pid: int, sig: signal.Signals) -> None:
    """Sends ``sig`` and returns once it took effect on every thread: a thread that was running when the signal
    was sent can still answer a request already in flight (measured under load: a SIGSTOPped sidecar answered the
    next prep.next 3 ms after os.kill), so a test that counts outages per signal waits for the stop or the death."""
    os.kill(pid, sig)

    def took_effect() -> bool:
        try:
            tasks = Path(f"/proc/{pid}/task").iterdir()
            states = [(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks]
        except (FileNotFoundError, ProcessLookupError):  # the process, or one of its threads, is ending: read again
            return not Path(f"/proc/{pid}").exists()
        done = {"T", "t"} if sig == signal.SIGSTOP else {"Z", "X"}
        return all(st in done for st in states)

    wait_until(took_effect, f"signal {sig.name} to take effect on pid {pid}")
