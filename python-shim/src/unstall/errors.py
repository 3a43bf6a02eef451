"""Exceptions raised by the shim. Each carries the sidecar's own message, which names the dataset,
sample, file or option at fault.

The constructors take the message as their only positional argument so that torch's DataLoader can
re-raise them in the main process ("Caught DatasetNotFoundError in DataLoader worker process 1").
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

__all__ = [
    "SidecarError",
    "SidecarStartError",
    "SidecarUnavailableError",
    "AuthenticationError",
    "PermissionDeniedError",
    "InvalidRequestError",
    "DatasetNotFoundError",
    "SessionNotFoundError",
    "PrepGroupNotFoundError",
    "DataFileNotFoundError",
    "DataError",
    "SidecarInternalError",
    "ResourceExhaustedError",
    "ProtocolMismatchError",
    "from_status",
    "from_flight_error",
    "from_java_error",
]


class SidecarError(Exception):
    """Base class: the sidecar refused or failed a request. ``code`` is the Flight status or Java class."""

    def __init__(self, msg: str = "", code: Optional[str] = None) -> None:
        super().__init__(msg)
        self.code = code

    def __str__(self) -> str:  # KeyError subclasses would otherwise print repr(msg)
        return str(self.args[0]) if self.args else ""


class SidecarStartError(SidecarError):
    """The embedded sidecar could not be started (no java, no jar, it died or did not come up)."""


class SidecarUnavailableError(SidecarError, ConnectionError):
    """No sidecar answers at the resolved address."""


class AuthenticationError(SidecarError, PermissionError):
    """The token is missing or wrong (Flight UNAUTHENTICATED / Py4J bad auth token)."""


class PermissionDeniedError(SidecarError, PermissionError):
    """PERMISSION_DENIED: a valid token that may not do this, e.g. a tenant token asking for a dataset the
    owner did not grant it (the message names that dataset and the token's id, never the token)."""


class InvalidRequestError(SidecarError, ValueError):
    """INVALID_ARGUMENT: a malformed ticket, an id out of range, a bad option."""


class DatasetNotFoundError(SidecarError, KeyError):
    """The dataset is not registered with the sidecar."""


class SessionNotFoundError(DatasetNotFoundError):
    """The session id is unknown to the sidecar: closed, or opened on a sidecar that has since restarted
    (NOT_FOUND, like an unknown dataset)."""


class PrepGroupNotFoundError(DatasetNotFoundError):
    """The prep group is unknown to the sidecar: closed, or it died with a sidecar that has since restarted
    (NOT_FOUND, like an unknown dataset)."""


class DataFileNotFoundError(SidecarError, FileNotFoundError):
    """A sample's file disappeared from storage after registration."""


# The line a data error's message starts with: this marker, then the fields as a JSON object.
_DATA_ERROR_MARKER = "unstall.data-error: "
_DATA_ERROR_LINE = re.compile(r"^" + re.escape(_DATA_ERROR_MARKER) + r"(?=\{)", re.M)


def _data_error_fields(text: str) -> Optional[tuple[str, dict[str, Any]]]:
    """``text`` without its data-error marker line, and the line's fields; None when ``text`` has no such line."""
    found = list(_DATA_ERROR_LINE.finditer(text))
    if not found:
        return None
    m = found[-1]  # in a traceback re-raised by torch (the line is a note there), the last is the exception's own
    try:
        fields, end = json.JSONDecoder().raw_decode(text, m.end())
    except ValueError:  # not JSON: still bad data, its fields unknown
        line_end = text.find("\n", m.end())
        fields, end = {}, len(text) if line_end < 0 else line_end
    rest = (text[:m.start()] + text[end:].removeprefix("\n")).strip("\n")
    return rest, fields if isinstance(fields, dict) else {}


class DataError(SidecarError, ValueError):
    """Bad data, not a bug: a sample or a stored file that fails its format's or the decoder's checks (a corrupt
    or truncated record or file, a decompression bomb, an image the decoder refuses). The sidecar says so with
    a marker line (protocol/README.md, "Errors") that carries ``dataset``, ``sample`` (the id), ``key``,
    ``file``, ``offset`` (bytes into ``file``) and ``reason``; each is None where unknown.

    Built from a message alone (torch's DataLoader re-raising it in the main process), it reads the fields from
    that marker line, which it keeps as a note so that tracebacks, and torch's re-raise, carry it along."""

    def __init__(self, msg: str = "", code: Optional[str] = None) -> None:
        parsed = _data_error_fields(msg)
        fields: dict[str, Any] = {}
        if parsed is not None:
            msg, fields = parsed
        super().__init__(msg, code)
        self.dataset: Optional[str] = _field(fields, "dataset", str)
        self.sample: Optional[int] = _field(fields, "sample", int)
        self.key: Optional[str] = _field(fields, "key", str)
        self.file: Optional[str] = _field(fields, "file", str)
        self.offset: Optional[int] = _field(fields, "offset", int)
        self.reason: Optional[str] = _field(fields, "reason", str)
        if fields:
            self.add_note(_DATA_ERROR_MARKER + json.dumps(fields, ensure_ascii=False))


def _field(fields: dict[str, Any], name: str, kind: type) -> Any:
    value = fields.get(name)
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


class SidecarInternalError(SidecarError):
    """INTERNAL: a fault of the sidecar itself, a bug (bad data is a :class:`DataError`)."""


class ResourceExhaustedError(SidecarError):
    """RESOURCE_EXHAUSTED: a bound of the sidecar was reached (its stream budget, its Flight calls or local
    connections, the ids of a plan, its prep groups); the message names the option that sets it."""


class ProtocolMismatchError(SidecarError):
    """The sidecar answered something this client does not accept (wrong ids, version, schema)."""


# pyarrow renders a Flight error as "Flight returned <kind> error, with message: <msg>. gRPC client
# debug context: ..." (or "... Detail: ..."); keep only the server's message.
_FLIGHT_MESSAGE = re.compile(r"with message: (.*?)(?:\. gRPC client debug context:.*|\. Detail: .*)?$", re.S)


def _server_message(err: BaseException) -> str:
    text = str(err)
    m = _FLIGHT_MESSAGE.search(text)
    return m.group(1).strip() if m else text.strip()


def _is_file_not_found(msg: str) -> bool:
    low = msg.lower()
    return "file" in low or "sample" in low or "/" in msg


_BY_STATUS: dict[str, type[SidecarError]] = {
    "UNAUTHENTICATED": AuthenticationError,
    "PERMISSION_DENIED": PermissionDeniedError,
    "UNAVAILABLE": SidecarUnavailableError,
    "INTERNAL": SidecarInternalError,
    "INVALID_ARGUMENT": InvalidRequestError,
    "RESOURCE_EXHAUSTED": ResourceExhaustedError,
}


def from_status(status: str, msg: str, *, dataset: Optional[str] = None) -> SidecarError:
    """The exception for a status name (``NOT_FOUND``, ``INTERNAL``, ...) and the sidecar's message.
    ``INVALID_ARGUMENT`` with the data-error marker line is bad data. ``NOT_FOUND`` for a request about
    ``dataset`` that names a file or sample is a missing data file."""
    if status == "INVALID_ARGUMENT" and _DATA_ERROR_LINE.search(msg):
        return DataError(msg, status)
    if status == "NOT_FOUND":
        if msg.startswith("unknown session"):
            return SessionNotFoundError(msg, status)
        if msg.startswith("prep group"):
            return PrepGroupNotFoundError(msg, status)
        if dataset is not None and "registered" not in msg.lower() and _is_file_not_found(msg):
            return DataFileNotFoundError(msg, status)
        return DatasetNotFoundError(msg, status)
    return _BY_STATUS.get(status, SidecarError)(msg, status)


def from_flight_error(err: BaseException, *, dataset: Optional[str] = None) -> SidecarError:
    """Maps a pyarrow Flight/Arrow exception to the shim's hierarchy, keeping the server's message."""
    import pyarrow as pa
    import pyarrow.flight as fl

    msg = _server_message(err)
    if isinstance(err, fl.FlightUnauthorizedError):
        return from_status("PERMISSION_DENIED", msg)
    if isinstance(err, fl.FlightUnauthenticatedError):
        return from_status("UNAUTHENTICATED", msg)
    if isinstance(err, (fl.FlightUnavailableError, fl.FlightTimedOutError)):
        return from_status("UNAVAILABLE", msg)
    if isinstance(err, fl.FlightInternalError):
        return from_status("INTERNAL", msg)
    if isinstance(err, pa.ArrowKeyError):
        return from_status("NOT_FOUND", msg, dataset=dataset)
    # pyarrow raises RESOURCE_EXHAUSTED as ArrowInvalid ("... returned resource exhausted error ...")
    if "resource exhausted" in str(err).lower() or "RESOURCE_EXHAUSTED" in str(err):
        return from_status("RESOURCE_EXHAUSTED", msg)
    if isinstance(err, pa.ArrowInvalid):
        return from_status("INVALID_ARGUMENT", msg)
    if isinstance(err, fl.FlightServerError):
        return SidecarError(msg, "UNKNOWN")
    return SidecarError(msg, type(err).__name__)


# The Java stack trace py4j hands back for a Py4JJavaError: "<class>: <message>" up to the first frame.
_JAVA_TRACE = re.compile(r"(?:^|\n): ([A-Za-z_$][\w.$]*)(?:: (.*?))?\r?\n\s+at ", re.S)


def from_java_error(err: BaseException) -> SidecarError:
    """Maps a ``py4j.protocol.Py4JJavaError`` to the shim's hierarchy, keeping the Java message. The class and
    message are read from the stack trace text py4j fetches: the control plane allows no calls on the
    exception object itself (``getClass``/``getMessage``)."""
    cls = ""
    msg = ""
    try:
        text = str(err)
    except Exception:  # the gateway may be gone already
        text = ""
    m = _JAVA_TRACE.search(text)
    if m:
        cls, msg = m.group(1), (m.group(2) or "").strip() or m.group(1)
    if not msg:
        msg = getattr(err, "errmsg", None) or text or type(err).__name__
    if _DATA_ERROR_LINE.search(msg):
        return DataError(msg, cls or None)
    simple = cls.rsplit(".", 1)[-1]
    if "PermissionDenied" in simple:
        return PermissionDeniedError(msg, cls)
    if "NoSuchFile" in simple or "FileNotFound" in simple:
        return DataFileNotFoundError(msg, cls)
    if "NotFound" in simple or "NoSuchElement" in simple or "Unknown" in simple:
        return DatasetNotFoundError(msg, cls)
    if "IllegalArgument" in simple or "Invalid" in simple or "IllegalState" in simple:
        return InvalidRequestError(msg, cls)
    return SidecarError(msg, cls or None)
