"""The sidecar's state file (``$UNSTALL_HOME/sidecar.json``): what a running sidecar writes once it
listens (its pid, Flight location, control port, token file and local socket), read by every process
that looks for it. A leaf: it imports only the protocol's version."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from .protocol import PROTOCOL_VERSION

__all__ = ["STATE_FILE_NAME", "SidecarState", "pid_alive", "read_state", "unstall_home"]

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
        return pid_alive(self.pid)

    def read_token(self) -> str:
        return Path(self.token_file).read_text().strip()


def read_state(path: Union[str, Path]) -> Optional[SidecarState]:
    """The state file's content, or None when it is absent or unreadable (a sidecar still writing it)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("v") != PROTOCOL_VERSION:
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


def pid_alive(pid: int) -> bool:
    """True when process ``pid`` exists and is not a zombie."""
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
