"""Integration tests: a real sidecar jar process, real pyarrow Flight, real torch DataLoaders.

Skipped (not failed) when the sidecar jar has not been built: `mvn -q -pl sidecar -am package`.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest

# TensorFlow and triton (which torchvision's ops import through torch._dynamo) each bundle LLVM; loading
# triton after TensorFlow aborts the process ("Option ... registered more than once"). Test modules import
# TensorFlow at collection, so torchvision goes first, here.
try:
    import torchvision.ops  # noqa: F401
except ImportError:
    pass

sys.path.insert(0, str(Path(__file__).parent))
# Test this checkout's shim even if the venv's editable install points at another clone.
_SRC = str(Path(__file__).resolve().parents[2] / "python-shim" / "src")
sys.path.insert(0, _SRC)
os.environ["PYTHONPATH"] = os.pathsep.join([_SRC, *filter(None, [os.environ.get("PYTHONPATH")])])

import unstall  # noqa: E402
from unstall.sidecar import find_jar  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def pytest_configure(config: pytest.Config) -> None:
    for line in ("sidecar: needs the sidecar jar and a JVM", "slow: takes more than a few seconds"):
        config.addinivalue_line("markers", line)
    config.option.strict_markers = True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.sidecar)


@pytest.fixture(scope="session")
def sidecar_jar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built jar, copied so that a concurrent rebuild cannot pull it from under the tests."""
    try:
        jar = find_jar()
    except unstall.SidecarStartError as e:
        missing(f"sidecar jar not built: {e}")
    if shutil.which("java") is None and not os.environ.get("UNSTALL_JAVA") and not os.environ.get("JAVA_HOME"):
        missing("no java")
    copy = tmp_path_factory.mktemp("jar") / jar.name
    shutil.copy2(jar, copy)
    return copy


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's headless ``chromium`` (``scripts/install-chromium.sh``, run by ``scripts/setup.sh``)."""
    path = shutil.which("chromium")
    if path is None:
        missing("chromium is not installed (scripts/install-chromium.sh installs it, as root with apt-get)")
    return str(path)


@pytest.fixture(scope="session")
def agent_jar() -> Path:
    """The shaded Java agent that ``mvn package`` builds."""
    jar = REPO / "agent" / "target" / "unstall-agent.jar"
    if not jar.is_file():
        missing(f"agent jar not built: {jar} (mvn -pl agent -am package -DskipTests)")
    return jar


def missing(why: str) -> None:
    """Skips a test whose prerequisite is not built, except in CI, where that is a failure."""
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI builds everything before pytest, so this is a bug)")
    pytest.skip(why)


SidecarFactory = Callable[..., unstall.Sidecar]


@pytest.fixture(scope="session")
def start_sidecar(sidecar_jar: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarFactory]:
    """Starts sidecars, each with its own UNSTALL_HOME; all are stopped at the end of the session."""
    started: list[unstall.Sidecar] = []

    def start(cache_capacity: int | str = "64MiB", **kwargs: object) -> unstall.Sidecar:
        home = tmp_path_factory.mktemp("home")
        s = unstall.Sidecar(home=home, cache_capacity=cache_capacity, jar=sidecar_jar, start=True, **kwargs)
        assert s.started
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


@pytest.fixture(scope="session")
def sidecar(start_sidecar: SidecarFactory) -> unstall.Sidecar:
    """A shared sidecar with a cache larger than every dataset the tests register."""
    return start_sidecar("64MiB")


@pytest.fixture(autouse=True)
def _no_ambient_sidecar(monkeypatch: pytest.MonkeyPatch) -> None:
    # Never attach to a developer's own sidecar by accident.
    for var in ("UNSTALL_SIDECAR", "UNSTALL_TOKEN", "UNSTALL_CONTROL_PORT"):
        monkeypatch.delenv(var, raising=False)


