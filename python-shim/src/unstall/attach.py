"""How a ``Sidecar`` reaches the sidecar and keeps reaching it: attaching by address or through the state
file, starting the embedded one, checking the version and the local endpoint (resolution), and the health
check and recovery that restart or reattach it after a fault (supervision). ``unstall.sidecar`` composes this
with the control calls and the handle's lifetime."""

from __future__ import annotations

import atexit
import logging
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlparse

from . import protocol
from .client import FlightClient
from .errors import (
    AuthenticationError,
    ProtocolMismatchError,
    SidecarError,
    SidecarStartError,
    SidecarUnavailableError,
)
from .gateway import ControlPlane
from .launch import (
    StartOptions,
    launch,
    start_lock,
)
from .recovery import Deadlines, Endpoint, Rediscovery, backoff, sleep_until
from .sidecar_state import SidecarState, pid_alive, read_state
from .supervisor import Supervisor


__all__ = ["Attachment"]

log = logging.getLogger("unstall")


class Attachment:
    """The resolution and supervision half of ``Sidecar``; its state is set by ``Sidecar.__init__``."""

    home: Path
    state_file: Path
    deadlines: Deadlines
    process: Optional[subprocess.Popen[bytes]]
    _detached_process: Optional[subprocess.Popen[bytes]]
    log_path: Optional[Path]
    _cp: ControlPlane
    _closed: bool
    pid: Optional[int]
    java: Optional[str]
    flight_location: str
    control_port: Optional[int]
    _token: str
    _token_arg: Optional[str]
    local_endpoint: Optional[str]
    _address: Optional[str]
    _start_options: Optional[StartOptions]
    _atexit_registered: bool
    _registered: dict[str, tuple[str, str, str]]
    _recover_lock: threading.RLock
    _in_outage: bool
    restarts: int
    rediscovery: Optional[Rediscovery]
    _supervisor: Supervisor

    def _atexit(self) -> None:
        raise NotImplementedError

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

    def _start(self, options: StartOptions) -> None:
        # PR_SET_PDEATHSIG fires when the forking *thread* ends: only from threads that live as long as we do.
        tied = threading.current_thread() in (threading.main_thread(), self._supervisor.thread)
        if not self._atexit_registered and not options.detach:
            atexit.register(self._atexit)
            self._atexit_registered = True
        self.log_path = self.home / "sidecar.log"
        process, state, self.java = launch(self.home, options, tied=tied, secret=self._token)
        if options.detach:
            self._detached_process = process  # not ours to stop; kept: no reaping warning
        else:
            self.process = process
        self.pid = state.pid
        self.flight_location = state.flight
        self.control_port = state.control_port
        self.local_endpoint = state.local
        self._token = self._read_token(state)
        self._connect_gateway("127.0.0.1", state.control_port)

    def _connect_gateway(self, host: str, port: int) -> None:
        """Connects to the control plane (a first call within the health deadline checks it answers)."""
        self._cp.connect(host, port, self._token, self.deadlines.health)

    def _close_gateway(self) -> None:
        self._cp.close()

    def _check_version(self) -> None:
        if self._cp.address is None:
            return
        version = int(self._call_once("protocolVersion"))
        if version != protocol.PROTOCOL_VERSION:
            raise ProtocolMismatchError(
                f"the sidecar speaks protocol version {version}, this client speaks version {protocol.PROTOCOL_VERSION}"
            )

    def _resolve_local_endpoint(self) -> None:
        """Attached through the state file (or started): the control plane says where the local socket is
        (``localEndpoint()``, "" without one; a sidecar older than it keeps the state file's answer)."""
        if self._cp.address is None or self.pid is None:
            return
        try:
            self.local_endpoint = str(self._call_once("localEndpoint") or "") or None
        except SidecarUnavailableError:
            raise
        except SidecarError:
            pass

    def endpoint(self) -> Endpoint:
        """Where the sidecar serves now (it changes when it is restarted)."""
        return Endpoint(self.flight_location, self.local_endpoint, self._token, self.pid)

    def move_to(self, endpoint: Endpoint) -> None:
        """Nothing to do: ``recover`` (which found ``endpoint``) reconnected this object already."""

    def _call_once(self, method: str, *args: Any, timeout: Optional[float] = None) -> Any:
        return self._cp.call(method, *args, timeout=timeout or self.deadlines.call)

    # -- supervision ---------------------------------------------------------------------------
    def problem(self) -> Optional[str]:
        """The health check (cheap): None when the sidecar is alive and its control plane answers within
        ``UNSTALL_HEALTH_TIMEOUT``, else what is wrong."""
        exited = self._exit(0.0)
        if exited is not None:
            return exited
        try:
            if self._cp.address is not None:
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
        elif self.pid is not None and not pid_alive(self.pid):
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
                    if self._supervisor.stopped or not sleep_until(deadline, delays):
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

    def _restart(self, options: StartOptions) -> None:
        """Replaces the embedded sidecar: the old process is killed (it may be hung: SIGKILL ends a stopped
        one too) and reaped before the new one starts, so two never serve one home."""
        old = self.process
        if old is not None:
            if old.poll() is None:
                old.kill()
            old.wait()
        self.process = None
        self._close_gateway()
        with start_lock(self.home, 2 * options.timeout):
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

    def supervise_once(self) -> bool:
        """The supervisor's check: recovers the sidecar when it is dead or hangs; False once closed."""
        with self._recover_lock:
            if self._closed:
                return False
            problem = self.problem()
            if problem is not None:
                self.recover(None, time.monotonic() + self.deadlines.recovery,
                             SidecarUnavailableError(f"the sidecar {problem}"))
        return True
