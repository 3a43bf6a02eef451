"""The ``collate_fn`` of the tests that look at a DataLoader's batches as the list of (sample, target) pairs it
collected. A module of its own, not in conftest.py (see waits.py); a module-level function, so workers can use it."""

from __future__ import annotations

from typing import Any


def keep(batch: list[Any]) -> list[Any]:
    """The batch as it came: the list of the samples' (sample, target) pairs."""
    return batch
