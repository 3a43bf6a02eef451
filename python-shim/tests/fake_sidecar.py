"""A stand-in for the sidecar's data plane (protocol v1 over pyarrow Flight), so the client and the
torch integration can be tested without a JVM. The real sidecar is tested by tests/python/.

It runs in its own process (``python fake_sidecar.py`` prints its port): a gRPC server inside the test
process would be inherited by forked DataLoader workers, which is not what users have.
``FakeSidecar`` duck-types the parts of ``unstall.Sidecar`` that Dataset uses.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any, Optional

import pyarrow as pa
import pyarrow.flight as fl

from unstall import protocol
from unstall.client import FlightClient

TOKEN = "f" * 64


@dataclass
class FakeDataset:
    name: str
    payloads: list[bytes]
    labels: Optional[list[int]] = None
    classes: Optional[list[str]] = None
    fmt: str = "imagefolder"

    def description(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "v": 1,
            "name": self.name,
            "format": self.fmt,
            "uri": f"file:///fake/{self.name}",
            "num_samples": len(self.payloads),
            "total_bytes": sum(len(p) for p in self.payloads),
        }
        if self.classes is not None:
            d["classes"] = self.classes
        return d


class _Auth(fl.ServerMiddlewareFactory):
    def start_call(self, info: Any, headers: dict[str, list[str]]) -> None:
        values = headers.get("authorization", [])
        if values != [f"Bearer {TOKEN}"]:
            raise fl.FlightUnauthenticatedError("missing or wrong token")
        return None


class FakeServer(fl.FlightServerBase):
    def __init__(self, datasets: list[FakeDataset]) -> None:
        super().__init__("grpc+tcp://127.0.0.1:0", middleware={"auth": _Auth()})
        self.datasets = {d.name: d for d in datasets}
        self.tickets: list[protocol.FetchTicket] = []
        self.lie_about_ids = False
        self.lock = threading.Lock()

    def _dataset(self, name: str) -> FakeDataset:
        if name not in self.datasets:
            raise KeyError(f"unknown dataset '{name}' (registered: {', '.join(sorted(self.datasets))})")
        return self.datasets[name]

    def get_flight_info(self, context: Any, descriptor: fl.FlightDescriptor) -> fl.FlightInfo:
        ds = self._dataset(descriptor.path[0].decode())
        d = ds.description()
        return fl.FlightInfo(
            protocol.BATCH_SCHEMA, descriptor, [], d["num_samples"], d["total_bytes"], app_metadata=json.dumps(d).encode()
        )

    def list_flights(self, context: Any, criteria: bytes) -> Any:
        for name in sorted(self.datasets):
            yield self.get_flight_info(context, fl.FlightDescriptor.for_path(name))

    def do_get(self, context: Any, ticket: fl.Ticket) -> fl.RecordBatchStream:
        try:
            t = protocol.decode_ticket(ticket.ticket)
        except ValueError as e:
            raise pa.ArrowInvalid(str(e)) from None
        ds = self._dataset(t.dataset)
        for i in t.ids:
            if i >= len(ds.payloads):
                raise pa.ArrowInvalid(f"sample id {i} is out of range for dataset '{t.dataset}' of {len(ds.payloads)} samples")
        with self.lock:
            self.tickets.append(t)
        ids = list(t.ids)
        if self.lie_about_ids:
            ids = ids[::-1] if len(ids) > 1 else [ids[0] + 1]
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(ids, pa.int64()),
                pa.array([ds.labels[i] if ds.labels else None for i in t.ids], pa.int64()),
                pa.array([f"k{i}" for i in t.ids], pa.utf8()),
                pa.array([ds.payloads[i] for i in t.ids], pa.binary()),
            ],
            schema=protocol.BATCH_SCHEMA,
        )
        return fl.RecordBatchStream(pa.Table.from_batches([batch]))

    def do_action(self, context: Any, action: fl.Action) -> Any:
        # test hooks: read/clear the tickets seen, make the server answer with wrong ids
        if action.type == "tickets":
            with self.lock:
                doc = [[t.epoch, list(t.ids)] for t in self.tickets]
                self.tickets.clear()
            return [fl.Result(json.dumps(doc).encode())]
        if action.type == "lie":
            self.lie_about_ids = action.body.to_pybytes() == b"1"
            return []
        if action.type != "stats":
            raise NotImplementedError(action.type)
        doc = {"v": 1, "cache": {"policy": "minio", "capacity_bytes": 0, "used_bytes": 0, "entries": 0}, "datasets": {}}
        return [fl.Result(json.dumps(doc).encode())]


def default_datasets() -> list[FakeDataset]:
    payloads = [bytes([i % 251]) * (100 + i) for i in range(50)]
    return [
        FakeDataset("imgs", payloads, labels=[i % 5 for i in range(50)], classes=[f"c{i}" for i in range(5)]),
        FakeDataset("recs", payloads[:20], fmt="tfrecord"),
    ]


class FakeSidecar:
    """What unstall.torch.Dataset needs from a Sidecar, backed by a FakeServer in another process."""

    def __init__(self, port: int) -> None:
        self.flight_location = f"grpc+tcp://127.0.0.1:{port}"
        self.token = TOKEN

    def _action(self, kind: str, body: bytes = b"") -> list[bytes]:
        with self.flight_client() as c:
            return c.do_action(kind, body)

    def take_tickets(self) -> list[tuple[int, tuple[int, ...]]]:
        """The (epoch, ids) of every DoGet since the last call."""
        return [(e, tuple(ids)) for e, ids in json.loads(self._action("tickets")[0])]

    def lie_about_ids(self, lie: bool) -> None:
        self._action("lie", b"1" if lie else b"0")

    def flight_client(self) -> FlightClient:
        return FlightClient(self.flight_location, TOKEN)

    def describe(self, name: str) -> protocol.DatasetInfo:
        with self.flight_client() as c:
            return c.describe(name)

    def register_dataset(self, name: str, root: Any, format: str = "imagefolder", options: Any = None) -> protocol.DatasetInfo:
        return self.describe(name)


if __name__ == "__main__":
    with FakeServer(default_datasets()) as server:
        print(server.port, flush=True)
        import sys

        sys.stdin.read()  # serve until the test process closes our stdin
