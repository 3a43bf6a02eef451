"""Attach or start: the resolution order of unstall.Sidecar, and owning the embedded sidecar's life."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import unstall
from unstall.sidecar import read_state
from waits import wait_until

SCRIPT = """
import json, os, unstall
s = unstall.Sidecar()  # nothing running: starts the embedded sidecar
print(json.dumps({"started": s.started, "pid": s.pid, "flight": s.flight_location,
                  "state": os.path.exists(s.state_file), "v": s.protocol_version()}), flush=True)
# no close(): interpreter exit must stop it
"""


def _wait_gone(pid: int, what: str, timeout: float = 20.0) -> None:
    """Waits until no process ``pid`` exists; a timeout fails naming ``what``."""

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(gone, what, timeout=timeout, interval=0.1)


def test_no_sidecar_running_starts_the_embedded_one_and_stops_it_at_exit(sidecar_jar: Path, tmp_path: Path) -> None:
    env = dict(os.environ, UNSTALL_HOME=str(tmp_path / "home"), UNSTALL_SIDECAR_JAR=str(sidecar_jar))
    for var in ("UNSTALL_SIDECAR", "UNSTALL_TOKEN", "UNSTALL_CONTROL_PORT"):
        env.pop(var, None)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info["started"] and info["state"] and info["v"] == 1 and info["flight"].startswith("grpc+tcp://127.0.0.1:")
    _wait_gone(info["pid"], "the embedded sidecar to exit with the interpreter that started it")
    assert not (tmp_path / "home" / "sidecar.json").exists()
    token = (tmp_path / "home" / "token").read_text().strip()
    assert len(token) == 64 and token not in out.stdout + out.stderr
    assert oct((tmp_path / "home" / "token").stat().st_mode & 0o777) == "0o600"


def test_attaches_through_the_state_file_and_the_address(start_sidecar, tmp_path: Path, monkeypatch) -> None:
    owner = start_sidecar("1MiB")
    state = read_state(owner.state_file)
    assert state is not None and state.pid == owner.pid and state.flight == owner.flight_location
    with unstall.Sidecar(home=owner.home, start=False) as attached:
        assert not attached.started and attached.pid == owner.pid
        assert attached.flight_location == owner.flight_location
        assert attached.stats().cache.capacity_bytes == 1 << 20
    # leaving the block disconnected only: the owner's sidecar still answers
    assert owner.protocol_version() == 1
    with monkeypatch.context() as m:
        m.setenv("UNSTALL_SIDECAR", owner.flight_location)
        m.setenv("UNSTALL_TOKEN", owner.token)
        m.setenv("UNSTALL_CONTROL_PORT", str(owner.control_port))
        with unstall.Sidecar(home=tmp_path / "elsewhere") as by_env:
            assert not by_env.started and by_env.control_port == owner.control_port
            assert by_env.protocol_version() == 1 and by_env.list_datasets() == owner.list_datasets()
    # an address with no control port falls back to the data plane for read-only calls
    with unstall.Sidecar(owner.flight_location, token=owner.token, home=tmp_path / "nohome") as data_only:
        assert data_only.stats().cache.capacity_bytes == 1 << 20
        with pytest.raises(unstall.SidecarUnavailableError, match="control port"):
            data_only.register_dataset("x", tmp_path)


def test_stale_state_file_is_replaced(sidecar_jar: Path, tmp_path: Path) -> None:
    home = tmp_path / "stale"
    home.mkdir()
    (home / "sidecar.json").write_text(json.dumps(
        {"v": 1, "pid": 2**22 + 12345, "flight": "grpc+tcp://127.0.0.1:1", "control_port": 1, "token_file": "/nope"}))
    with pytest.raises(unstall.SidecarUnavailableError, match="start=False"):
        unstall.Sidecar(home=home, start=False)
    with unstall.Sidecar(home=home, jar=sidecar_jar, cache_capacity="1MiB") as s:
        assert s.started and s.pid != 2**22 + 12345
        pid = s.pid
    _wait_gone(pid, f"the started sidecar (pid {pid}) to exit at close")
    assert not (home / "sidecar.json").exists()


def test_a_sidecar_that_cannot_start_reports_its_log(tmp_path: Path) -> None:
    bogus = tmp_path / "unstall-sidecar.jar"
    bogus.write_text("not a jar")
    with pytest.raises(unstall.SidecarStartError, match="(?s)exited with status .*corrupt jarfile"):
        unstall.Sidecar(home=tmp_path / "h", jar=bogus, startup_timeout=30)
    with pytest.raises(unstall.SidecarStartError, match="(?s)exited with status .*cache"):
        unstall.Sidecar(home=tmp_path / "h2", jar=os.environ.get("UNSTALL_SIDECAR_JAR") or unstall.sidecar.find_jar(),
                        cache_capacity="lots", startup_timeout=30)


def test_a_shared_memory_cache_needs_no_direct_memory(sidecar_jar: Path, tmp_path: Path) -> None:
    # The MinIO cache in /dev/shm is mapped files: only the rest of the budget must fit -XX:MaxDirectMemorySize.
    opts = dict(cache_capacity="1GiB", memory_budget="1200MiB", jar=sidecar_jar, startup_timeout=60,
                java_options=["-XX:MaxDirectMemorySize=256m"])
    with unstall.Sidecar(home=tmp_path / "shm", **opts) as s:
        assert s.local_endpoint, "the shared-memory plane is on"
    with pytest.raises(unstall.SidecarStartError, match="(?s)--memory-budget, 1.2 GiB, exceeds the JVM's direct-memory"):
        unstall.Sidecar(home=tmp_path / "heap", extra_args=["--no-shm"], **opts)
