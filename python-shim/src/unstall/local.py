"""The same-host data plane: a client of the sidecar's local socket (``UNSL``, protocol/README.md).

Requests and replies are small frames over a Unix domain socket; the payloads stay where the sidecar
put them, in files of its shared-memory directory, which this process maps read-only and hands out as
``memoryview`` slices: no gRPC, no copy through the socket.

* ``cache-<k>`` segments (the never-evict cache's arena) are mapped once per process and kept;
* a ``stage-<k>`` segment holds one reply's other rows: it is mapped before the next request goes out
  (the sidecar unlinks it then) and unmapped once the last view of it is dropped.

The connection is opened lazily and per process, like ``unstall.client.FlightClient``'s: a forked
DataLoader worker opens its own and never sends on the parent's; pickling drops it. Sessions (one
job's view of a dataset: its prefetch plan and counters) belong to the connection that opened them;
other processes use them by id.

Every exchange has a deadline (``timeout``, default ``$UNSTALL_TIMEOUT``). A client made by
``Sidecar.local_client()`` survives the sidecar's faults (``unstall.recovery``): when the socket ends
or a reply is late, it finds the sidecar again and sends the same request; a session the sidecar no
longer knows (it restarted) is replaced by this process's own session of the dataset.
"""

from __future__ import annotations

import mmap
import os
import socket
import threading
from typing import Any, Callable, Optional, Sequence, TypeVar, Union

import numpy as np

from . import protocol
from ._fork import ResetInChild
from .client import check_ids
from .errors import ProtocolMismatchError, SessionNotFoundError, SidecarError, SidecarUnavailableError, from_status
from .recovery import Deadlines, Endpoint, Rediscovery, call_with_recovery

T = TypeVar("T")

__all__ = ["LocalClient", "answers_hello", "recv_frame", "send_frame"]


def _reset_in_child(client: LocalClient) -> None:
    # The parent's connection is not ours: close this process's copy of its descriptor (the parent's
    # stays open, nothing is sent) so that the next call here opens a connection of its own.
    client._lock = threading.RLock()  # a lock held by another thread at the fork is never released here
    client._forget_connection()


_clients: ResetInChild[LocalClient] = ResetInChild(_reset_in_child)


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError(f"the sidecar closed the connection ({got} of {n} bytes received)")
        got += k
    return buf


def recv_frame(sock: socket.socket) -> bytearray:
    """One frame's body (``u32 length``, then the body)."""
    (n,) = protocol.LOCAL_FRAME.unpack(_recv_exact(sock, protocol.LOCAL_FRAME.size))
    if n > protocol.LOCAL_MAX_FRAME:
        raise ProtocolMismatchError(f"a frame of {n} bytes exceeds the protocol's {protocol.LOCAL_MAX_FRAME}")
    return _recv_exact(sock, n)


def send_frame(sock: socket.socket, body: bytes) -> None:
    sock.sendall(protocol.encode_frame(body))


def _map_readonly(path: str) -> Union[mmap.mmap, bytes]:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        size = os.fstat(fd).st_size
        return mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else b""
    finally:
        os.close(fd)


class LocalClient:
    """Fetches batches over the sidecar's local socket, reading payloads in place.

    >>> client = LocalClient("/dev/shm/unstall-1234/data.sock", token)
    >>> s = client.open_session("imgs", "pid 12 DataLoader#1")
    >>> batch = client.fetch(s, [0, 7, 41], epoch=0)   # a SampleBatch; payloads are memoryviews
    """

    transport = "shm"

    def __init__(self, socket_path: Union[str, "os.PathLike[str]"], token: Union[str, bytes, None], *,
                 timeout: Optional[float] = None, rediscovery: Optional[Rediscovery] = None) -> None:
        if not socket_path:
            raise ValueError("a local socket path is required, e.g. /dev/shm/unstall-1234/data.sock")
        self.socket_path = os.fspath(socket_path)
        self._token = token.encode() if isinstance(token, str) else token
        self.timeout = timeout if timeout is not None else Deadlines.from_env().call  # each exchange's deadline
        self.rediscovery = rediscovery  # finds the sidecar again after a fault; None: a fault is raised
        self.moved_at: Optional[float] = None  # when a fault last moved this client (time.monotonic())
        self._init_process_state()
        self._cache_maps: dict[str, Union[mmap.mmap, bytes]] = {}  # path -> mapping (valid across fork)

    def _init_process_state(self) -> None:
        self._sock: Optional[socket.socket] = None
        self._pid: Optional[int] = None
        self._lock = threading.RLock()
        self._default_sessions: dict[str, int] = {}  # dataset -> session on this process's connection
        self._stale_sessions: set[int] = set()  # sessions of a sidecar that has since restarted
        self._exchanging = False  # a frame is out and its answer not read yet (by the thread holding the lock)
        self._closes_later: list[int] = []  # CLOSEs asked for during an exchange, sent before the next request
        self.shm_dir: Optional[str] = None
        self.sidecar_pid: Optional[int] = None
        self.generation = 0  # this process's connections so far: sessions of an older one are gone
        _clients.add(self)

    def __repr__(self) -> str:  # never show the token
        return f"LocalClient({self.socket_path!r})"

    # -- connection, per process -------------------------------------------------------------
    def connect(self) -> LocalClient:
        """Connects now (HELLO) if this process has no connection yet; raises SidecarUnavailableError
        when nothing answers on the socket, AuthenticationError for a wrong token."""
        with self._lock:
            self._conn()
        return self

    @property
    def connection_id(self) -> Optional[tuple[int, int]]:
        """(pid, generation) of this process's open connection, or None: sessions live as long as it."""
        return (self._pid, self.generation) if self._sock is not None and self._pid == os.getpid() else None

    def _conn(self) -> socket.socket:
        pid = os.getpid()
        if self._sock is not None and self._pid == pid:
            return self._sock
        if self._pid != pid:
            self._forget_connection()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError as e:
            sock.close()
            raise SidecarUnavailableError(
                f"cannot connect to the sidecar's local socket {self.socket_path}: {e.strerror or e}", "UNAVAILABLE"
            ) from None
        try:
            reply = self._exchange(sock, protocol.encode_local_hello(self._token), "HELLO")
        except BaseException:
            sock.close()
            raise
        doc = self._ok(reply, "HELLO")
        if doc.get("v") != protocol.LOCAL_VERSION or not doc.get("shm"):
            sock.close()
            raise ProtocolMismatchError(
                f"the sidecar's local socket answered HELLO with {doc!r}; this client speaks version "
                f"{protocol.LOCAL_VERSION} and needs the shared-memory directory"
            )
        self._sock, self._pid = sock, pid
        if self.shm_dir != str(doc["shm"]):  # another sidecar: the old one's segments are not its
            self._cache_maps.clear()
        self.shm_dir = str(doc["shm"])
        self.sidecar_pid = int(doc.get("pid", 0)) or None
        self.generation += 1
        self._default_sessions.clear()
        return sock

    def _forget_connection(self) -> None:
        """Drops this process's handle on a connection without sending anything on it."""
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()  # only this process's descriptor; a parent's connection stays open
            except OSError:
                pass
        self._pid = None
        self._default_sessions.clear()
        self._closes_later.clear()  # its sessions ended with it

    def close(self) -> None:
        """Closes this process's connection (its sessions end with it). Views already handed out stay valid."""
        with self._lock:
            if self._pid == os.getpid():
                self._forget_connection()

    def __enter__(self) -> LocalClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"socket_path": self.socket_path, "_token": self._token, "timeout": self.timeout,
                "rediscovery": self.rediscovery}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_process_state()
        self._cache_maps = {}

    # -- frames --------------------------------------------------------------------------------
    def _exchange(self, sock: socket.socket, body: bytes, what: str, dataset: Optional[str] = None) -> Any:
        if self._closes_later and sock is self._sock:
            self._close_deferred()
        self._exchanging = True
        try:
            return self._exchange_once(sock, body, what, dataset)
        finally:
            self._exchanging = False

    def _close_deferred(self) -> None:
        """The CLOSEs a garbage collection asked for in the middle of an exchange (a loader's finalizer), sent
        before the connection's next request: not earlier, since the answer's staged payloads stay valid until
        then."""
        sessions, self._closes_later = self._closes_later, []
        for session in sessions:
            try:
                self.close_session(session)
            except SidecarError:
                pass  # as the finalizer does: the session ends with the connection anyway

    def _exchange_once(self, sock: socket.socket, body: bytes, what: str, dataset: Optional[str] = None) -> Any:
        try:
            try:
                send_frame(sock, body)
            except OSError as unsent:
                if isinstance(unsent, socket.timeout):
                    raise
                # The sidecar may have answered and closed before reading the request (a refused
                # connection, a request over a bound): its answer is still in this socket to read.
                try:
                    raw = recv_frame(sock)
                except (OSError, EOFError):
                    raise unsent from None
            else:
                raw = recv_frame(sock)
        except (OSError, EOFError) as e:
            if sock is self._sock:
                self._forget_connection()
            raise SidecarUnavailableError(
                f"lost the sidecar's local socket {self.socket_path} during {what}: {e}", "UNAVAILABLE"
            ) from None
        try:
            reply = protocol.decode_local_reply(raw)
        except ValueError as e:
            raise ProtocolMismatchError(f"{what}: {e}") from None
        if isinstance(reply, protocol.LocalError):
            if reply.status == "UNAUTHENTICATED" and sock is self._sock:
                self._forget_connection()  # the sidecar closes it
            raise from_status(reply.status, reply.message, dataset=dataset)
        return reply

    def _request(self, body: bytes, what: str, dataset: Optional[str] = None) -> Any:
        """One exchange on this process's connection, sent again after a sidecar fault."""
        return self._recovering(lambda: self._exchange(self._conn(), body, what, dataset))

    def _recovering(self, attempt: Callable[[], T]) -> T:
        return call_with_recovery(self, attempt)

    # -- faults --------------------------------------------------------------------------------
    def endpoint(self) -> Endpoint:
        """The sidecar this client talks to (its pid once connected)."""
        return Endpoint("", self.socket_path, (self._token or b"").decode(), self.sidecar_pid)

    def move_to(self, endpoint: Endpoint) -> None:
        """Talks to ``endpoint`` from the next request on; this process's connection (and so its
        sessions) is dropped if it was to another socket."""
        if endpoint.local is None:
            raise SidecarUnavailableError(
                f"the sidecar that replaced the one at {self.socket_path} has no local socket; use Flight "
                "(transport='flight')", "UNAVAILABLE")
        with self._lock:
            if self._sock is not None and endpoint.local == self.socket_path and endpoint.pid == self.sidecar_pid:
                return
            self._forget_connection()
            self.socket_path = endpoint.local
            self._token = endpoint.token.encode()

    def follow(self) -> bool:
        """Moves to the sidecar that replaced this client's (its rediscovery knows); True if it moved."""
        found = self.rediscovery.current() if self.rediscovery is not None else None
        if found is None or found.local is None or found.local == self.socket_path:
            return False
        self.move_to(found)
        return True

    def _live(self, session: int, dataset: Optional[str]) -> int:
        """``session``, or this process's own session of ``dataset`` once the sidecar forgot it."""
        if session in self._stale_sessions and dataset is not None:
            return self.default_session(dataset)
        return session

    def _on_session(self, session: int, dataset: Optional[str], call: Callable[[int], T]) -> T:
        """``call(session)``; a session the sidecar does not know (it restarted: prefetch plans are lost,
        ids are not) is replaced by this process's default session of ``dataset``."""
        while True:
            live = self._live(session, dataset)
            try:
                return call(live)
            except SessionNotFoundError:
                if dataset is None or live in self._stale_sessions:
                    raise
                self._stale_sessions.add(live)

    @staticmethod
    def _ok(reply: Any, what: str) -> dict[str, Any]:
        if not isinstance(reply, protocol.LocalOk):
            raise ProtocolMismatchError(f"{what}: expected an OK reply, got {type(reply).__name__}")
        return reply.doc

    # -- calls ---------------------------------------------------------------------------------
    def open_session(self, dataset: str, name: str) -> int:
        """OPEN: a session on ``dataset`` owned by this process's connection; returns its id."""
        with self._lock:
            doc = self._ok(self._request(protocol.encode_local_open(dataset, name), "OPEN", dataset), "OPEN")
        try:
            return int(doc["session"])
        except (KeyError, TypeError, ValueError):
            raise ProtocolMismatchError(f"OPEN answered {doc!r}, without a session id") from None

    def default_session(self, dataset: str) -> int:
        """This process's own session on ``dataset`` (opened on first use, on this connection)."""
        with self._lock:
            self._recovering(self._conn)
            session = self._default_sessions.get(dataset)
            if session is None:
                session = self._default_sessions[dataset] = self.open_session(dataset, f"pid {os.getpid()} default")
            return session

    def close_session(self, session: int) -> None:
        """CLOSE; a no-op when this process has no connection (its sessions ended with it). Asked for while this
        thread is in the middle of an exchange (a garbage collection there ran a loader's finalizer, which the
        re-entrant lock lets in), it is sent before the connection's next request, never between an exchange's
        frames."""
        with self._lock:
            if self.connection_id is None:
                return
            if session in self._stale_sessions:
                return
            if self._exchanging:  # sent before the next request (_close_deferred)
                self._closes_later.append(session)
                return
            self._ok(self._exchange(self._conn(), protocol.encode_local_close(session), "CLOSE"), "CLOSE")
            for k in [k for k, v in self._default_sessions.items() if v == session]:
                del self._default_sessions[k]

    def prep_action(self, action: str, body: bytes) -> dict[str, Any]:
        """PREP: a ``prep.*`` action (``prep.next``) run as a Flight DoAction would run it for the owner; its JSON
        result. Not sent again after a sidecar fault: a prep member recovers by joining the restarted sidecar's
        group (``Membership``)."""
        with self._lock:
            return self._ok(self._exchange(self._conn(), protocol.encode_local_prep(action, body), action), action)

    def plan(self, session: int, ids: Union[Sequence[int], np.ndarray], epoch: int,
             dataset: Optional[str] = None) -> int:
        """PLAN: the epoch's whole order for clairvoyant prefetch; returns how many samples were planned.
        ``dataset`` names the dataset whose default session replaces a forgotten ``session``."""
        with self._lock:
            doc = self._ok(self._on_session(session, dataset, lambda s: self._request(
                protocol.encode_local_plan(s, ids, epoch), "PLAN", dataset)), "PLAN")
        return int(doc.get("planned", 0))

    def cached(self, session: int, dataset: Optional[str] = None) -> dict[str, Any]:
        """CACHED: the ``cached`` document of the session's dataset (which samples the sidecar holds now).
        ``dataset`` names the dataset whose default session replaces a forgotten ``session``."""
        with self._lock:
            return self._ok(self._on_session(session, dataset, lambda s: self._request(
                protocol.encode_local_cached(s), "CACHED", dataset)), "CACHED")

    def fetch(self, session: int, ids: Union[Sequence[int], np.ndarray], epoch: int = 0,
              dataset: Optional[str] = None) -> protocol.SampleBatch:
        """FETCH: the samples ``ids`` in request order, payloads as read-only views of shared memory.

        Raises ProtocolMismatchError when the reply's ids are not exactly ``ids``. ``dataset`` names the
        dataset in errors, and its default session replaces ``session`` once the sidecar forgot it.
        After a sidecar fault the same ids are asked again: the batch is the same.
        """
        wanted = np.asarray(ids, dtype=np.int64) if not isinstance(ids, np.ndarray) else ids.astype(np.int64)
        with self._lock:
            reply = self._on_session(session, dataset, lambda s: self._request(
                protocol.encode_local_fetch(s, wanted, epoch), "FETCH", dataset))
            if not isinstance(reply, protocol.LocalBatch):
                raise ProtocolMismatchError(f"FETCH: expected a BATCH reply, got {type(reply).__name__}")
            payloads = self._views(reply)  # before the next request: the sidecar unlinks stage-* then
        check_ids(f"dataset {dataset!r}" if dataset else f"session {session}", reply.ids, wanted)
        return protocol.SampleBatch(
            ids=reply.ids,
            labels=reply.labels,
            label_valid=reply.label_valid,
            keys=reply.keys,
            payloads=payloads,
            transport=self.transport,
            nbytes=int(reply.lengths.sum(dtype=np.uint64)),
        )

    # -- shared memory -------------------------------------------------------------------------
    def _views(self, reply: protocol.LocalBatch) -> list[memoryview]:
        nseg = len(reply.segments)
        needed = np.zeros(nseg, dtype=np.uint64)
        if len(reply.segs):
            np.maximum.at(needed, reply.segs, reply.offsets + reply.lengths.astype(np.uint64))
        segments = [memoryview(self._segment(name, int(end))) for name, end in zip(reply.segments, needed.tolist())]
        return [
            segments[s][o : o + n]
            for s, o, n in zip(reply.segs.tolist(), reply.offsets.tolist(), reply.lengths.tolist())
        ]

    def _segment(self, name: str, needed: int) -> Union[mmap.mmap, bytes]:
        if "/" in name or name in ("", ".", ".."):
            raise ProtocolMismatchError(f"the sidecar named segment {name!r}, which is not a file name")
        path = os.path.join(self.shm_dir or "", name)
        if name.startswith("cache-"):
            m = self._cache_maps.get(path)
            if m is None or len(m) < needed:  # an arena file that grew since it was mapped: map it again
                m = self._cache_maps[path] = self._map(path)
        elif name.startswith("stage-"):
            m = self._map(path)
        else:
            raise ProtocolMismatchError(f"the sidecar named segment {name!r}; expected cache-<k> or stage-<k>")
        if len(m) < needed:
            raise ProtocolMismatchError(f"segment {path} has {len(m)} bytes, the batch reads up to byte {needed}")
        return m

    def _map(self, path: str) -> Union[mmap.mmap, bytes]:
        try:
            return _map_readonly(path)
        except (OSError, ValueError) as e:
            raise SidecarError(f"cannot map the sidecar's shared-memory segment {path}: {e}") from None


def answers_hello(endpoint: Endpoint, timeout: float) -> bool:
    """The rediscovery probe (``unstall.recovery.Probe``): True when the sidecar's local socket answers
    HELLO within ``timeout`` (no local socket: its pid is alive, the Flight call that follows tells the
    rest)."""
    if endpoint.local is None:
        return True
    probe = LocalClient(endpoint.local, endpoint.token, timeout=timeout)
    try:
        probe.connect()
        return True
    except SidecarError:
        return False
    finally:
        probe.close()
