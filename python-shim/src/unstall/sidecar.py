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
import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from . import protocol
from .client import FlightClient
from .errors import (
    SidecarUnavailableError,
)
from .attach import Attachment
from .formats import FORMATS
from .gateway import ControlPlane
from .launch import (
    BUNDLED_JAVA,
    JAR_NAME,
    MIN_JAVA,
    START_LOCK_NAME,
    StartOptions,
    find_jar,
    find_java,
    java_flags,
    java_major,
    start_lock,
    stop_sidecar,
    terminate,
)
from .local import LocalClient, answers_hello
from .recovery import Deadlines, Rediscovery, call_with_recovery
from .sidecar_state import STATE_FILE_NAME, SidecarState, pid_alive, read_state, unstall_home
from .supervisor import Supervisor

# The discovery and launch helpers are importable from here too (re-exported from sidecar_state and launch).
__all__ = ["Sidecar", "SidecarState", "default_sidecar", "unstall_home", "find_jar", "find_java", "java_major",
           "java_flags", "read_state", "stop_sidecar", "BUNDLED_JAVA", "JAR_NAME", "MIN_JAVA", "STATE_FILE_NAME",
           "START_LOCK_NAME"]

_pid_alive = pid_alive  # the fault tests check pids through it


class Sidecar(Attachment):
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
        self._cp = ControlPlane()
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
        self._start_options: Optional[StartOptions] = None  # set when this object started the sidecar
        self._atexit_registered = False
        self._registered: dict[str, tuple[str, str, str]] = {}  # name -> (format, uri, options): registered again
        self._recover_lock = threading.RLock()
        self._in_outage = False  # warned once for the current outage
        self.restarts = 0  # outages recovered from
        self.rediscovery: Optional[Rediscovery] = None  # set once attached: calls recover from then on
        self.moved_at: Optional[float] = None  # when a call last recovered from a fault (time.monotonic())
        self._supervisor = Supervisor(self.supervise_once, self.deadlines.health_interval, str(self.home))

        address = address or os.environ.get("UNSTALL_SIDECAR") or None
        if address:
            self._address = address
            self._attach_address(address, token, control_port)
        else:
            lock = start_lock(self.home, 2 * startup_timeout) if start else contextlib.nullcontext()
            with lock:
                state = read_state(self.state_file)
                if not (state is not None and state.alive and self._try_attach_state(state, token)):
                    if not start:
                        raise SidecarUnavailableError(
                            f"no sidecar is running (state file {self.state_file} is absent or stale) and start=False"
                        )
                    options = StartOptions(cache_capacity, memory_budget, jar, java, tuple(java_options),
                                            tuple(extra_args), startup_timeout, port, detach)
                    self._start(options)
                    self.detached = detach
                    self._start_options = None if detach else options
        self._check_version()
        self._resolve_local_endpoint()
        self.rediscovery = Rediscovery(self.state_file, self.home, self.deadlines, owner=self, probe=answers_hello)
        self._supervisor.start()

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
        return self._cp.address is not None

    @property
    def closed(self) -> bool:
        return self._closed

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
    def _call(self, method: str, *args: Any, timeout: Optional[float] = None) -> Any:
        """A control-plane call; after a sidecar fault, once it is recovered, the same call again."""
        if self._cp.address is None:  # not a fault: nothing to wait for
            raise self._no_control_port()
        return call_with_recovery(self, lambda: self._call_once(method, *args, timeout=timeout))

    def _no_control_port(self) -> SidecarUnavailableError:
        return SidecarUnavailableError(
            f"no control port is known for the sidecar at {self.flight_location}; "
            "set UNSTALL_CONTROL_PORT or pass control_port="
        )

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
        if self._cp.address is None:
            return self._data_plane().describe(name)
        return protocol.parse_description(self._call("describeDataset", name))

    def list_datasets(self) -> list[protocol.DatasetInfo]:
        if self._cp.address is None:
            return self._data_plane().list_datasets()
        return protocol.parse_descriptions(self._call("listDatasets"))

    def stats(self) -> protocol.Stats:
        if self._cp.address is None:
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

    # -- lifetime ------------------------------------------------------------------------------
    def close(self) -> None:
        """Disconnects; stops the sidecar process if this object started it."""
        if self._closed:
            return
        self._supervisor.stop()
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

    def _stop_process(self) -> None:
        proc, self.process = self.process, None
        if proc is not None:
            terminate(proc)

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
