"""Unit tests of the shim: no JVM needed (the Flight side is tests/fake_sidecar.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fake_sidecar import FakeDataset, FakeServer, FakeSidecar  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "protocol" / "fixtures"


def pytest_configure(config: pytest.Config) -> None:
    # Also registered here so that `pytest python-shim/tests tests/python` from the repo root
    # (where python-shim/pyproject.toml is not the ini file) runs with --strict-markers.
    for line in ("sidecar: needs the sidecar jar and a JVM", "slow: takes more than a few seconds"):
        config.addinivalue_line("markers", line)
    config.option.strict_markers = True


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="module")
def fake_server() -> Iterator[FakeServer]:
    payloads = [bytes([i % 251]) * (100 + i) for i in range(50)]
    datasets = [
        FakeDataset("imgs", payloads, labels=[i % 5 for i in range(50)], classes=[f"c{i}" for i in range(5)]),
        FakeDataset("recs", payloads[:20], fmt="tfrecord"),
    ]
    with FakeServer(datasets) as server:
        yield server


@pytest.fixture
def fake_sidecar(fake_server: FakeServer) -> FakeSidecar:
    fake_server.lie_about_ids = False
    fake_server.tickets.clear()
    return FakeSidecar(fake_server)
