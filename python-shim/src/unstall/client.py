"""The data plane: an Arrow Flight client for the sidecar.

The connection is opened lazily and per process: a DataLoader worker forked from a process that
already had one opens its own (gRPC channels do not survive fork), and pickling drops it.

Every call has a deadline (``timeout``, default ``$UNSTALL_TIMEOUT``). A client made by
``Sidecar.flight_client()`` survives the sidecar's faults (``unstall.recovery``): a call that finds it
unavailable or late is sent again once the sidecar is found again.
"""

from __future__ import annotations

import json

import os
import threading
import weakref
from typing import Any, Callable, Optional, Sequence, TypeVar, Union

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl

from . import protocol
from .errors import ProtocolMismatchError, SidecarError, from_flight_error
from .recovery import Deadlines, Endpoint, Rediscovery, call_with_recovery

T = TypeVar("T")

__all__ = ["FlightClient", "grpc_used_in_this_process", "check_ids"]

# gRPC does not survive fork: a child forked from a process that has used gRPC may hang on its first
# call (reliably while a channel is open, at random once closed: gRPC's own threads may hold locks at
# the fork). So every open connection is closed just before this process forks, and the DataLoader
# starts its workers with "forkserver" instead of "fork" once this process has used Flight.
_open_clients: "weakref.WeakSet[FlightClient]" = weakref.WeakSet()
_grpc_pid: Optional[int] = None


def grpc_used_in_this_process() -> bool:
    """True once this process has opened a Flight connection (forking it is then unsafe)."""
    return _grpc_pid == os.getpid()


def _close_all_before_fork() -> None:
    for client in list(_open_clients):
        try:
            client.close()
        except Exception:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_close_all_before_fork)


class FlightClient:
    """Fetches batches of samples from the sidecar over Flight.

    >>> with FlightClient("grpc+tcp://127.0.0.1:8815", token) as client:
    ...     batch = client.fetch("imgs", [0, 7, 41], epoch=0)
    """

    transport = "flight"

    def __init__(self, location: str, token: Union[str, bytes, None], *, timeout: Optional[float] = None,
                 rediscovery: Optional[Rediscovery] = None) -> None:
        if not location:
            raise ValueError("a Flight location is required, e.g. grpc+tcp://127.0.0.1:8815")
        self.location = location
        self._token = token.encode() if isinstance(token, str) else token
        self.timeout = timeout if timeout is not None else Deadlines.from_env().call  # each call's deadline
        self.rediscovery = rediscovery  # finds the sidecar again after a fault; None: a fault is raised
        self.moved_at: Optional[float] = None  # when a fault last moved this client (time.monotonic())
        self._conn: Optional[fl.FlightClient] = None
        self._pid: Optional[int] = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never show the token
        return f"FlightClient({self.location!r})"

    # -- connection, per process -------------------------------------------------------------
    def _options(self) -> fl.FlightCallOptions:
        headers = [(b"authorization", b"Bearer " + self._token)] if self._token else []
        return fl.FlightCallOptions(headers=headers, timeout=self.timeout)

    def _client(self) -> fl.FlightClient:
        global _grpc_pid
        pid = os.getpid()
        if self._conn is None or self._pid != pid:
            with self._lock:
                if self._conn is None or self._pid != pid:
                    # A connection inherited through fork belongs to the parent: drop it unclosed.
                    self._conn = fl.connect(self.location)
                    self._pid = pid
                    _grpc_pid = pid
                    _open_clients.add(self)
        return self._conn

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and self._pid == os.getpid():
            conn.close()
        self._pid = None
        _open_clients.discard(self)

    def __enter__(self) -> FlightClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_conn"] = None
        state["_pid"] = None
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- faults --------------------------------------------------------------------------------
    def endpoint(self) -> Endpoint:
        return Endpoint(self.location, None, (self._token or b"").decode())

    def move_to(self, endpoint: Endpoint) -> None:
        """Talks to ``endpoint`` from the next call on (a new connection)."""
        self.close()
        self.location = endpoint.flight
        self._token = endpoint.token.encode()

    def _recovering(self, attempt: Callable[[], T]) -> T:
        return call_with_recovery(self, attempt)

    def _rpc(self, call: Callable[[fl.FlightClient, fl.FlightCallOptions], T], dataset: Optional[str] = None,
             recover: bool = True) -> T:
        """``call(connection, options)`` with this client's deadline and token; Flight errors mapped;
        sent again after a sidecar fault unless ``recover`` is False (the caller recovers itself)."""
        def attempt() -> T:
            try:
                return call(self._client(), self._options())
            except (fl.FlightError, pa.ArrowException) as e:
                raise from_flight_error(e, dataset=dataset) from None

        return self._recovering(attempt) if recover else attempt()

    # -- calls ---------------------------------------------------------------------------------
    def fetch(self, dataset: str, ids: Union[Sequence[int], np.ndarray], epoch: int = 0) -> pa.RecordBatch:
        """One DoGet: the samples ``ids`` of ``dataset`` in ticket order, counted under ``epoch``.

        Raises ProtocolMismatchError when the ``id`` column is not exactly ``ids``: a training job
        must never be fed other samples than it asked for.
        """
        wanted = np.asarray(ids, dtype=np.int64) if not isinstance(ids, np.ndarray) else ids.astype(np.int64)
        ticket = fl.Ticket(protocol.encode_fetch_ticket(dataset, wanted, epoch))
        table = self._rpc(lambda conn, options: conn.do_get(ticket, options).read_all(), dataset)
        batch = _single_batch(table)
        try:
            protocol.check_batch(batch)
        except ValueError as e:
            raise ProtocolMismatchError(f"dataset {dataset!r}: {e}") from None
        check_ids(f"dataset {dataset!r}", batch.column("id").to_numpy(zero_copy_only=False), wanted)
        return batch

    def fetch_samples(self, dataset: str, ids: Union[Sequence[int], np.ndarray], epoch: int = 0) -> protocol.SampleBatch:
        """``fetch`` as a ``SampleBatch``: payloads are views of the Arrow batch's data buffer (no copy)."""
        return protocol.SampleBatch.from_arrow(self.fetch(dataset, ids, epoch), transport=self.transport)

    def describe(self, dataset: str) -> protocol.DatasetInfo:
        """GetFlightInfo: the dataset's description (from app_metadata)."""
        descriptor = fl.FlightDescriptor.for_path(dataset)
        info = self._rpc(lambda conn, options: conn.get_flight_info(descriptor, options))
        return protocol.parse_description(info.app_metadata)

    def list_datasets(self) -> list[protocol.DatasetInfo]:
        infos = self._rpc(lambda conn, options: list(conn.list_flights(b"", options)))
        return [protocol.parse_description(i.app_metadata) for i in infos]

    def do_action(self, action: str, body: bytes = b"", *, recover: bool = True) -> list[bytes]:
        """A DoAction call; the result bodies. ``recover=False``: a sidecar fault is raised, not recovered."""
        return self._rpc(
            lambda conn, options: [r.body.to_pybytes() for r in conn.do_action(fl.Action(action, body), options)],
            recover=recover)

    def prefetch(self, dataset: str, ids: Union[Sequence[int], np.ndarray], epoch: int) -> int:
        """Sends the epoch's order (a PLAN message); returns how many samples the sidecar planned."""
        results = self.do_action("prefetch", protocol.encode_plan(dataset, ids, epoch))
        return int(json.loads(results[0])["planned"])

    def cached(self, dataset: str) -> bytes:
        """The ``cached`` action: which samples of ``dataset`` the sidecar holds now (its JSON document)."""
        results = self.do_action("cached", json.dumps({"dataset": dataset}).encode())
        if len(results) != 1:
            raise ProtocolMismatchError(f"the cached action returned {len(results)} results, expected 1")
        return results[0]

    def stats(self) -> protocol.Stats:
        """The ``stats`` action."""
        results = self.do_action("stats")
        if len(results) != 1:
            raise ProtocolMismatchError(f"the stats action returned {len(results)} results, expected 1")
        return protocol.parse_stats(results[0])


def _single_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.combine_chunks().to_batches()
    if len(batches) == 1:
        return batches[0]
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    raise SidecarError(f"expected one record batch, got {len(batches)}")  # pragma: no cover


def check_ids(what: str, got: np.ndarray, wanted: np.ndarray) -> None:
    """Raises ProtocolMismatchError unless the sidecar returned exactly the ids asked for, in order."""
    if got.shape != wanted.shape or not np.array_equal(got, wanted):
        raise ProtocolMismatchError(
            f"{what}: the sidecar returned ids {_preview(got)} for the requested ids "
            f"{_preview(wanted)}; refusing to feed other samples than asked for"
        )


def _preview(a: np.ndarray, n: int = 8) -> str:
    items = ", ".join(str(int(x)) for x in a[:n])
    return f"[{items}{', ...' if a.size > n else ''}] ({a.size} ids)"
