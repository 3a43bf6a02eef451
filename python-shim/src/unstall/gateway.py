"""The sidecar's control plane over Py4J: registration, stats, tokens and the rest of ``Sidecar``'s calls.

``ControlPlane`` holds one gateway per read deadline (py4j's read timeout is per gateway) and turns py4j's
failures into the shim's errors: a network failure is ``SidecarUnavailableError`` (a fault that recovery
handles), a refused token ``AuthenticationError``, a Java exception the error its status names.

Nothing is sent to the sidecar from a garbage collection: py4j frees a Java object when its Python proxy is
collected, from whichever thread the collection runs in (torch's queue feeder thread, say), waiting there for the
answer. The only Java objects the shim gets are the exceptions of failed calls, so the call that failed frees its
exception before it raises. A forked process (a DataLoader worker) never sends on its parent's connections: after
the fork its gateways are dropped unsent, their Java objects left to the parent, and a call there connects anew.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Optional

from py4j.java_gateway import GatewayClient, GatewayParameters, JavaGateway
from py4j.protocol import Py4JAuthenticationError, Py4JError, Py4JJavaError, Py4JNetworkError, is_fatal_error

from ._fork import ResetInChild
from .errors import AuthenticationError, SidecarError, SidecarUnavailableError, from_java_error

__all__ = ["ControlPlane"]


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


def _reset_in_child(plane: ControlPlane) -> None:
    plane._lock = threading.Lock()  # a lock held by another thread at the fork is never released here
    plane._forget_gateways()


_planes: ResetInChild[ControlPlane] = ResetInChild(_reset_in_child)


def _forget_inherited(gateway: JavaGateway) -> None:
    """Makes a gateway inherited through fork inert without sending anything on its connections (the parent's):
    its client counts as disconnected, so the Java objects of the parent's calls are not freed from here, and this
    process's copies of its sockets are closed (no shutdown: that would end the parent's connections too)."""
    client = gateway._gateway_client
    client.is_connected = False
    while client.deque:
        connection = client.deque.pop()
        for end in (getattr(connection, "stream", None), connection.socket):
            try:
                if end is not None:
                    end.close()
            except OSError:
                pass


def _free(err: Py4JJavaError) -> None:
    """Frees the Java exception of a failed call now, in the calling thread (bounded by the gateway's read
    deadline), rather than whenever a garbage collection finds its proxy; a failure to free it is not the call's."""
    java = getattr(err, "java_exception", None)
    if java is not None:
        try:
            java._detach()
        except Exception:
            pass


class ControlPlane:
    """The Py4J connection to one sidecar's control port. ``address`` stays known after ``close()``: a
    call then connects again."""

    def __init__(self) -> None:
        self.address: Optional[tuple[str, int]] = None  # (host, port)
        self._token = ""
        self._gateways: dict[float, JavaGateway] = {}  # one per read deadline
        self._lock = threading.Lock()
        _planes.add(self)

    def describe(self) -> str:
        return f"{self.address[0]}:{self.address[1]}" if self.address is not None else "(no control port)"

    def connect(self, host: str, port: int, token: str, timeout: float) -> None:
        """Connects to ``host:port`` (a first call within ``timeout`` checks that it answers)."""
        self.close()
        self.address = (host, port)
        self._token = token
        self.gateway(timeout)

    def gateway(self, timeout: float) -> JavaGateway:
        """The gateway whose calls wait at most ``timeout`` seconds for an answer. A new one is checked with
        a ``protocolVersion`` call (py4j's eager load would use reflection, which the control plane refuses)."""
        with self._lock:
            gateway = self._gateways.get(timeout)
            if gateway is not None:
                return gateway
            if self.address is None:
                raise SidecarUnavailableError("no control port is known; set UNSTALL_CONTROL_PORT or pass control_port=")
            host, port = self.address
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

    def call(self, method: str, *args: Any, timeout: float) -> Any:
        """One call of ``method``, no retry."""
        try:
            return getattr(self.gateway(timeout).entry_point, method)(*args)
        except Py4JJavaError as e:
            error = from_java_error(e)  # reads the Java stack trace: before the exception is freed
            _free(e)
            raise error from None
        except Py4JNetworkError as e:
            raise SidecarUnavailableError(
                f"lost the sidecar control plane at {self.describe()} ({method}): {_network_cause(e)}"
            ) from None
        except Py4JAuthenticationError as e:
            raise AuthenticationError(
                f"the sidecar control port {self.describe()} rejected the token ({method}): {e}") from None
        except Py4JError as e:
            raise SidecarError(f"{method} failed: {e}") from None

    def _forget_gateways(self) -> None:
        """In a forked child: drops the parent's gateways unsent (``_forget_inherited``); a call connects anew."""
        gateways, self._gateways = list(self._gateways.values()), {}
        for gateway in gateways:
            _forget_inherited(gateway)

    def close(self) -> None:
        with self._lock:
            gateways, self._gateways = list(self._gateways.values()), {}
        for gateway in gateways:
            try:
                gateway.close()  # close(), not shutdown(): never stop a Java side we only attached to
            except Exception:
                pass


def _network_cause(err: BaseException) -> str:
    """A py4j network error with its cause ("Error while receiving: timed out")."""
    cause = getattr(err, "cause", None)
    return f"{err}: {cause}" if cause is not None else str(err)
