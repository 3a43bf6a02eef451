"""Unit tests of the shim: no JVM needed (the Flight side is tests/fake_sidecar.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# Test this checkout's shim even if the venv's editable install points at another clone.
_SRC = str(Path(__file__).resolve().parents[2] / "python-shim" / "src")
sys.path.insert(0, _SRC)
os.environ["PYTHONPATH"] = os.pathsep.join([_SRC, *filter(None, [os.environ.get("PYTHONPATH")])])

from fake_sidecar import FakeSidecar  # noqa: E402

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


@pytest.fixture(scope="session")
def fake_server_port() -> Iterator[int]:
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "fake_sidecar.py")], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError("the fake Flight server did not start")
        yield int(line)
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait(timeout=10)


@pytest.fixture
def fake_sidecar(fake_server_port: int) -> FakeSidecar:
    sidecar = FakeSidecar(fake_server_port)
    sidecar.lie_about_ids(False)
    sidecar.take_tickets()
    return sidecar
