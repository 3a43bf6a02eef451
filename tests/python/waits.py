"""The bounded wait of the cross-process tests (never a bare sleep loop). A module of its own, not in
conftest.py: pytest collects python-shim/tests and tests/python in one run, and `from conftest import ...`
would find the other folder's conftest."""

from __future__ import annotations

import time
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
