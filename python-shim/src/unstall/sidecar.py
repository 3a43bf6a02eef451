"""The control plane: find, attach to, or start the sidecar, and talk to it over Py4J.

Resolution order (first that applies wins):

1. an explicit ``address`` argument, else ``$UNSTALL_SIDECAR`` (e.g. ``grpc+tcp://127.0.0.1:8815``);
   the token comes from ``token=``, ``$UNSTALL_TOKEN`` or the token file, the control port from
   ``control_port=``, ``$UNSTALL_CONTROL_PORT`` or the state file;
2. the state file ``$UNSTALL_HOME/sidecar.json`` (default ``~/.unstall``) if its pid is alive and the
   sidecar answers;
3. otherwise start the embedded sidecar jar and own its lifetime: it is stopped when this object is
   closed, leaves a ``with`` block, or the interpreter exits.

The same-host data plane (``local_client()``: the local socket and shared memory) is used when the
sidecar is known to run here: started by this object or attached through the state file (its ``local``
field; the control plane's ``localEndpoint()`` confirms it), or attached by address when this host's
state file names that very address.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union
from urllib.parse import urlparse

from . import protocol
from .client import FlightClient
from .local import LocalClient
from .errors import (
    AuthenticationError,
    ProtocolMismatchError,
    SidecarError,
    SidecarStartError,
    SidecarUnavailableError,
    from_java_error,
)

__all__ = ["Sidecar", "SidecarState", "default_sidecar", "unstall_home", "find_jar", "find_java", "read_state"]

JAR_NAME = "unstall-sidecar.jar"
STATE_FILE_NAME = "sidecar.json"


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
        "cannot find the sidecar jar; set UNSTALL_SIDECAR_JAR or build it (mvn -pl sidecar -am package). "
        "Looked at: " + ", ".join(looked[:6]) + (", ..." if len(looked) > 6 else "")
    )


def find_java(explicit: Union[str, Path, None] = None) -> str:
    """java from ``java=``, ``$UNSTALL_JAVA``, ``$JAVA_HOME/bin/java`` or PATH."""
    for candidate in (explicit, os.environ.get("UNSTALL_JAVA")):
        if candidate:
            return str(candidate)
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise SidecarStartError("cannot find java (17+); set UNSTALL_JAVA or JAVA_HOME, or put java on PATH")
    return found


def _set_pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class Sidecar:
    """A handle on the sidecar: attach to a running one or start the embedded one.

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
    ) -> None:
        self.home = Path(home).expanduser() if home is not None else unstall_home()
        self.state_file = self.home / STATE_FILE_NAME
        self.process: Optional[subprocess.Popen[bytes]] = None
        self.log_path: Optional[Path] = None
        self._owner_pid = os.getpid()
        self._gateway: Any = None
        self._entry: Any = None
        self._flight: Optional[FlightClient] = None
        self._closed = False
        self.pid: Optional[int] = None
        self.flight_location = ""
        self.control_port: Optional[int] = None
        self._token = ""
        self.local_endpoint: Optional[str] = None  # the local socket's path, when this host can use it

        address = address or os.environ.get("UNSTALL_SIDECAR") or None
        if address:
            self._attach_address(address, token, control_port)
        else:
            state = read_state(self.state_file)
            if not (state is not None and state.alive and self._try_attach_state(state, token)):
                if not start:
                    raise SidecarUnavailableError(
                        f"no sidecar is running (state file {self.state_file} is absent or stale) and start=False"
                    )
                self._start(cache_capacity, memory_budget, jar, java, java_options, extra_args, startup_timeout)
        self._check_version()
        self._resolve_local_endpoint()

    # -- resolution ----------------------------------------------------------------------------
    def _attach_address(self, address: str, token: Optional[str], control_port: Optional[int]) -> None:
        parsed = urlparse(address)
        if not parsed.scheme or not parsed.hostname or not parsed.port:
            raise ValueError(f"sidecar address {address!r} is not like grpc+tcp://127.0.0.1:8815")
        self.flight_location = address
        state = read_state(self.state_file)
        if control_port is None and os.environ.get("UNSTALL_CONTROL_PORT"):
            control_port = int(os.environ["UNSTALL_CONTROL_PORT"])
        if control_port is None and state is not None:
            control_port = state.control_port
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

    def _start(
        self,
        cache_capacity: Union[int, str, None],
        memory_budget: Union[int, str, None],
        jar: Union[str, Path, None],
        java: Optional[str],
        java_options: Sequence[str],
        extra_args: Sequence[str],
        timeout: float,
    ) -> None:
        jar_path = find_jar(jar)
        java_bin = find_java(java)
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        stale = read_state(self.state_file)
        if stale is not None and not stale.alive:
            self.state_file.unlink(missing_ok=True)
        cmd = [java_bin, *java_options, "-jar", str(jar_path), "serve", "--port", "0", "--home", str(self.home)]
        if cache_capacity is not None:
            cmd += ["--cache-capacity", str(cache_capacity)]
        if memory_budget is not None:
            cmd += ["--memory-budget", str(memory_budget)]
        cmd += list(extra_args)
        self.log_path = self.home / "sidecar.log"
        log = open(self.log_path, "ab")
        log_offset = log.tell()
        env = dict(os.environ, UNSTALL_HOME=str(self.home))
        in_main_thread = threading.current_thread() is threading.main_thread()
        try:
            self.process = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                close_fds=True,
                preexec_fn=_set_pdeathsig if in_main_thread and sys.platform.startswith("linux") else None,
            )
        except OSError as e:
            log.close()
            raise SidecarStartError(f"cannot run {java_bin}: {e}") from None
        log.close()
        atexit.register(self._atexit)
        deadline = time.monotonic() + timeout
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
                    f"the sidecar did not write {self.state_file} within {timeout:.0f}s; log {self.log_path}:\n{tail}"
                )
            time.sleep(0.05)
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
        from py4j.java_gateway import GatewayParameters, JavaGateway
        from py4j.protocol import Py4JAuthenticationError, Py4JError

        try:
            self._gateway = JavaGateway(
                gateway_parameters=GatewayParameters(
                    address=host, port=port, auth_token=self._token, auto_convert=True, eager_load=True
                )
            )
            self._entry = self._gateway.entry_point
        except Py4JAuthenticationError as e:
            raise AuthenticationError(f"the sidecar control port {host}:{port} rejected the token: {e}") from None
        except Py4JError as e:
            raise SidecarUnavailableError(f"no sidecar control plane answers at {host}:{port}: {e}") from None

    def _check_version(self) -> None:
        if self._entry is None:
            return
        version = int(self._call("protocolVersion"))
        if version != protocol.PROTOCOL_VERSION:
            raise ProtocolMismatchError(
                f"the sidecar speaks protocol version {version}, this client speaks version {protocol.PROTOCOL_VERSION}"
            )

    def _resolve_local_endpoint(self) -> None:
        """Attached through the state file (or started): the control plane says where the local socket is
        (``localEndpoint()``, "" without one; a sidecar older than it keeps the state file's answer)."""
        if self._entry is None or self.pid is None:
            return
        from py4j.protocol import Py4JError

        try:
            self.local_endpoint = str(self._entry.localEndpoint() or "") or None
        except Py4JError:
            pass

    # -- properties ----------------------------------------------------------------------------
    @property
    def token(self) -> str:
        return self._token

    @property
    def started(self) -> bool:
        """True when this object started the sidecar process (and will stop it)."""
        return self.process is not None

    def __repr__(self) -> str:
        how = "started" if self.started else "attached"
        return f"Sidecar({self.flight_location!r}, control_port={self.control_port}, pid={self.pid}, {how})"

    def flight_client(self) -> FlightClient:
        """A new data-plane client (connects lazily, per process, safe to hand to DataLoader workers)."""
        return FlightClient(self.flight_location, self._token)

    def local_client(self) -> Optional[LocalClient]:
        """A new client of the sidecar's local socket (same host: shared memory, no gRPC; connects lazily,
        per process), or None when this sidecar has none that this host can use."""
        return LocalClient(self.local_endpoint, self._token) if self.local_endpoint else None

    def _data_plane(self) -> FlightClient:
        if self._flight is None:
            self._flight = self.flight_client()
        return self._flight

    # -- control plane -------------------------------------------------------------------------
    def _call(self, method: str, *args: Any) -> Any:
        from py4j.protocol import Py4JError, Py4JJavaError, Py4JNetworkError

        if self._entry is None:
            raise SidecarUnavailableError(
                f"no control port is known for the sidecar at {self.flight_location}; "
                "set UNSTALL_CONTROL_PORT or pass control_port="
            )
        try:
            return getattr(self._entry, method)(*args)
        except Py4JJavaError as e:
            raise from_java_error(e) from None
        except Py4JNetworkError as e:
            raise SidecarUnavailableError(f"lost the sidecar control plane ({method}): {e}") from None
        except Py4JError as e:
            raise SidecarError(f"{method} failed: {e}") from None

    def register_dataset(
        self,
        name: str,
        root: Union[str, Path],
        format: str = "imagefolder",
        options: Optional[Mapping[str, Any]] = None,
    ) -> protocol.DatasetInfo:
        """Registers ``root`` (a directory, file, or URI) under ``name``; a no-op if already registered alike."""
        if not name:
            raise ValueError("a dataset name is required")
        if format not in ("imagefolder", "tfrecord"):
            raise ValueError(f"unknown format {format!r}; expected 'imagefolder' or 'tfrecord'")
        root_s = str(root)
        uri = root_s if "://" in root_s else os.path.abspath(os.path.expanduser(root_s))
        doc = self._call("registerDataset", name, format, uri, json.dumps(dict(options or {})))
        return protocol.parse_description(doc)

    def describe(self, name: str) -> protocol.DatasetInfo:
        if self._entry is None:
            return self._data_plane().describe(name)
        return protocol.parse_description(self._call("describeDataset", name))

    def list_datasets(self) -> list[protocol.DatasetInfo]:
        if self._entry is None:
            return self._data_plane().list_datasets()
        return protocol.parse_descriptions(self._call("listDatasets"))

    def stats(self) -> protocol.Stats:
        if self._entry is None:
            return self._data_plane().stats()
        return protocol.parse_stats(self._call("stats"))

    def protocol_version(self) -> int:
        return int(self._call("protocolVersion"))

    # -- lifetime ------------------------------------------------------------------------------
    def close(self) -> None:
        """Disconnects; stops the sidecar process if this object started it."""
        if self._closed:
            return
        self._closed = True
        if self._flight is not None:
            self._flight.close()
            self._flight = None
        self._close_gateway()
        if self.process is not None:
            self._stop_process()
            atexit.unregister(self._atexit)

    def _close_gateway(self) -> None:
        gateway, self._gateway, self._entry = self._gateway, None, None
        if gateway is not None:
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


_default: Optional[Sidecar] = None
_default_lock = threading.Lock()


def default_sidecar() -> Sidecar:
    """The process-wide sidecar used when none is given: attached or started on first use."""
    global _default
    with _default_lock:
        if _default is None or _default._closed:
            _default = Sidecar()
        return _default
