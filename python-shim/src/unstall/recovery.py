"""Faults: the deadline of every call to the sidecar, and how a client finds the sidecar again.

A call that finds the sidecar dead or unresponsive (its connection ends, or it passes its deadline)
raises ``SidecarUnavailableError`` inside the client; a client made by ``Sidecar`` then asks its
``Rediscovery`` for the sidecar's new endpoint and sends the same request again. Fetches name their
samples by id, so a retried fetch returns the very samples the failed one would have: nothing is lost
or delivered twice.

* In the process that owns the ``Sidecar`` object, finding it again is ``Sidecar.recover``: an embedded
  sidecar is restarted with the same home and options, an attached one reconnected with backoff; the
  datasets this process registered are registered again.
* In any other process (a DataLoader worker), by re-reading the state file until a live sidecar
  answers; the main process's supervisor restarts it, a worker never starts one.

Deadlines, in seconds, from the environment:

=============================  =======  ==============================================================
``UNSTALL_TIMEOUT``            120      each call (a fetch waits up to the sidecar's ``--batch-timeout``,
                                        60 s, for memory under load, so this is longer)
``UNSTALL_INDEX_TIMEOUT``      3600     registering a dataset (it lists and indexes the files)
``UNSTALL_HEALTH_INTERVAL``    2        how often the supervisor checks the sidecar
``UNSTALL_HEALTH_TIMEOUT``     10       a health check's own deadline: a sidecar that does not answer
                                        within it is hung
``UNSTALL_RECOVERY_TIMEOUT``   600      give up restarting/reconnecting after this long, with an error
                                        naming the sidecar's home, address and log
=============================  =======  ==============================================================
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Protocol, TypeVar, Union

from .errors import (
    DatasetNotFoundError,
    PrepGroupNotFoundError,
    SessionNotFoundError,
    SidecarUnavailableError,
)
from .sidecar_state import read_state

__all__ = ["Deadlines", "Endpoint", "Owner", "Probe", "Rediscovery", "Recoverable", "backoff", "call_with_recovery",
           "sleep_until"]

T = TypeVar("T")


def _seconds(var: str, default: float) -> float:
    raw = os.environ.get(var)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{var} must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{var} must be > 0 seconds, got {raw!r}")
    return value


@dataclass(frozen=True)
class Deadlines:
    """How long each kind of call to the sidecar may take (seconds); see the module's table."""

    call: float = 120.0
    index: float = 3600.0
    health_interval: float = 2.0
    health: float = 10.0
    recovery: float = 600.0

    @classmethod
    def from_env(cls) -> Deadlines:
        return cls(
            call=_seconds("UNSTALL_TIMEOUT", cls.call),
            index=_seconds("UNSTALL_INDEX_TIMEOUT", cls.index),
            health_interval=_seconds("UNSTALL_HEALTH_INTERVAL", cls.health_interval),
            health=_seconds("UNSTALL_HEALTH_TIMEOUT", cls.health),
            recovery=_seconds("UNSTALL_RECOVERY_TIMEOUT", cls.recovery),
        )


def backoff(first: float = 0.05, cap: float = 2.0) -> Iterator[float]:
    """Exponential delays: first, 2*first, ... up to cap, forever."""
    delay = first
    while True:
        yield delay
        delay = min(cap, delay * 2)


def sleep_until(deadline: float, delays: Iterator[float]) -> bool:
    """Sleeps the next delay (never past ``deadline``); False when the deadline has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        return False
    time.sleep(min(left, next(delays)))
    return True


@dataclass(frozen=True)
class Endpoint:
    """Where a sidecar serves: its Flight location, local socket (same host), token and pid."""

    flight: str
    local: Optional[str]
    token: str
    pid: Optional[int] = None


class Owner(Protocol):
    """What owns the sidecar in its process (``Sidecar``): it knows the endpoint and recovers it."""

    @property
    def closed(self) -> bool: ...

    def endpoint(self) -> Endpoint: ...

    def recover(self, failed: Optional[Endpoint], deadline: float, cause: BaseException) -> Endpoint: ...


Probe = Callable[[Endpoint, float], bool]
"""``probe(endpoint, timeout)``: True when the sidecar at ``endpoint`` answers within ``timeout`` seconds
(picklable: a module-level function, such as ``unstall.local.answers_hello``)."""


class Rediscovery:
    """How a data-plane client finds the sidecar again after a call failed. Picklable: in a process
    other than the owner's (a DataLoader worker) it re-reads the state file until the sidecar there
    passes ``probe`` (None: a live pid is enough, the call that follows tells the rest)."""

    def __init__(self, state_file: Union[str, Path], home: Union[str, Path], deadlines: Deadlines, *,
                 owner: Optional[Owner] = None, probe: Optional[Probe] = None) -> None:
        self.state_file = str(state_file)
        self.home = str(home)
        self.log_path = str(Path(home) / "sidecar.log")
        self.deadlines = deadlines
        self.probe = probe
        self._owner_pid = os.getpid()
        self._sidecar: Optional[Owner] = owner

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_sidecar": None}

    def _owner(self) -> Optional[Owner]:
        s = self._sidecar
        return s if s is not None and os.getpid() == self._owner_pid and not s.closed else None

    def current(self) -> Optional[Endpoint]:
        """The sidecar's endpoint as this process knows it now (None: none is running)."""
        owner = self._owner()
        if owner is not None:
            return owner.endpoint()
        state = read_state(self.state_file)
        if state is None or not state.alive:
            return None
        try:
            return Endpoint(state.flight, state.local, state.read_token(), state.pid)
        except OSError:
            return None

    def find(self, failed: Endpoint, deadline: float, cause: BaseException) -> Endpoint:
        """The endpoint of a sidecar that answers, once ``failed`` did not: recovered by the owner, or
        waited for in the state file. Raises SidecarUnavailableError at ``deadline``."""
        owner = self._owner()
        if owner is not None:
            return owner.recover(failed, deadline, cause)
        delays = backoff(0.05, 0.5)  # reading the state file is cheap: notice the new sidecar soon
        while True:
            found = self.current()
            if found is not None and (self.probe is None or self.probe(found, self.deadlines.health)):
                return found
            if not sleep_until(deadline, delays):
                raise self.gave_up(failed.flight, cause)

    def gave_up(self, address: str, cause: BaseException) -> SidecarUnavailableError:
        return SidecarUnavailableError(
            f"gave up on the sidecar after {self.deadlines.recovery:.0f}s (UNSTALL_RECOVERY_TIMEOUT): home "
            f"{self.home}, address {address}, log {self.log_path}; last error: {cause}",
            "UNAVAILABLE",
        )


class Recoverable(Protocol):
    """A client that can be moved to the sidecar's new endpoint (``LocalClient``, ``FlightClient``)."""

    rediscovery: Optional[Rediscovery]
    moved_at: Optional[float]  # time.monotonic() of the last move after a fault

    def endpoint(self) -> Endpoint: ...

    def move_to(self, endpoint: Endpoint) -> None: ...


def call_with_recovery(client: Recoverable, attempt: Callable[[], T],
                       reestablish: Optional[Callable[[], None]] = None) -> T:
    """``attempt()``, again after each sidecar fault once ``client.rediscovery`` found the sidecar again
    (the client moved there).

    A restarted sidecar knows a dataset only once its owner registered it again: "unknown dataset"
    within the recovery deadline of the client's last move is waited out too. State of the caller's that
    died with the old sidecar (a prep group: ``PrepGroupNotFoundError``) is made again by ``reestablish``
    after each move, and when the sidecar says it is unknown; without it that error is raised.
    """
    deadline: Optional[float] = None
    delays = backoff()
    while True:
        try:
            return attempt()
        except SidecarUnavailableError as e:
            if client.rediscovery is None:
                raise
            if deadline is None:
                deadline = time.monotonic() + client.rediscovery.deadlines.recovery
            elif not sleep_until(deadline, delays):  # failed again where the sidecar answers: back off, bounded
                raise client.rediscovery.gave_up(client.endpoint().flight, e) from None
            client.move_to(client.rediscovery.find(client.endpoint(), deadline, e))
            client.moved_at = time.monotonic()
            if reestablish is not None:
                reestablish()
        except PrepGroupNotFoundError:
            if reestablish is None or client.rediscovery is None:
                raise
            reestablish()
        except DatasetNotFoundError as e:
            if client.rediscovery is None or client.moved_at is None or isinstance(e, SessionNotFoundError):
                raise
            if not sleep_until(client.moved_at + client.rediscovery.deadlines.recovery, delays):
                raise client.rediscovery.gave_up(client.endpoint().flight, e) from None
