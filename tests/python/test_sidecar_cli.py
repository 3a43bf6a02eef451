"""`unstall sidecar start|status|stop`: the per-host sidecar managed from the shell, shared with trainers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

import unstall
from datagen import make_image_folder
from unstall.sidecar import find_java, read_state, stop_sidecar


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "home"
    yield home
    stop_sidecar(home)  # whatever a failed test left running


def cli(home: Path, jar: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, UNSTALL_SIDECAR_JAR=str(jar))
    return subprocess.run([sys.executable, "-m", "unstall", "sidecar", *args, "--home", str(home)], env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_start_status_stop_a_detached_sidecar_that_trainers_share(
        sidecar_jar: Path, home: Path, tmp_path: Path) -> None:
    none = cli(home, sidecar_jar, "status")
    assert none.returncode == 1 and f"none is running for {home}" in none.stderr

    started = cli(home, sidecar_jar, "start", "--port", "0", "--cache-capacity", "32MiB",
                  "--sidecar-arg=--stats-epochs=8")
    assert started.returncode == 0, started.stderr
    state = read_state(home / "sidecar.json")
    assert state is not None and state.alive
    assert f"pid {state.pid} started on " in started.stdout and state.flight in started.stdout
    assert f"token file    {home / 'token'}" in started.stdout
    # Detached: the command has exited, the sidecar runs on in a session of its own with the options given.
    assert os.getsid(state.pid) == state.pid
    cmdline = Path(f"/proc/{state.pid}/cmdline").read_text().split("\0")
    assert cmdline[cmdline.index("--cache-capacity") + 1] == "32MiB" and "--stats-epochs=8" in cmdline

    images = tmp_path / "images"
    make_image_folder(images, ["a", "b"], per_class=3, extras=False)
    with unstall.Sidecar(home=home) as trainer:  # a trainer attaches; closing it leaves the sidecar running
        assert not trainer.started and trainer.pid == state.pid
        trainer.register_dataset("shared", images)
    assert read_state(home / "sidecar.json") == state and state.alive

    status = cli(home, sidecar_jar, "status", "--json")
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert (doc["pid"], doc["flight"], doc["local"], doc["healthy"]) == (state.pid, state.flight, state.local, True)
    assert [(d["name"], d["samples"]) for d in doc["datasets"]] == [("shared", 6)]
    assert Path(doc["java"]) == Path(find_java()).resolve()

    again = cli(home, sidecar_jar, "start", "--port", "0")
    assert again.returncode == 0 and f"pid {state.pid} already running" in again.stdout

    stopped = cli(home, sidecar_jar, "stop")
    assert stopped.returncode == 0 and f"stopped pid {state.pid}" in stopped.stderr
    assert not state.alive and not (home / "sidecar.json").exists()
    assert cli(home, sidecar_jar, "stop").returncode == 1
    assert cli(home, sidecar_jar, "status").returncode == 1


def test_a_start_that_fails_says_why_and_leaves_nothing_running(sidecar_jar: Path, home: Path) -> None:
    failed = cli(home, sidecar_jar, "start", "--port", "0", "--sidecar-arg=--cache-policy=fifo")
    assert failed.returncode == 2
    assert "unstall sidecar start: the sidecar exited with status" in failed.stderr and "cache-policy" in failed.stderr
    assert read_state(home / "sidecar.json") is None
