"""A stand-in for the sidecar's local socket (UNSL v1, protocol/README.md), so that LocalClient and the
torch layer's sessions can be tested without a JVM. The real sidecar is tested by tests/python/.

Payloads of even ids live in a ``cache-0`` segment (mapped once per client process), the others are
written to a ``stage-<k>`` file per reply, unlinked when the connection sends its next request, as the
sidecar does. It serves from threads of the test process; forked children connect to it like any
client. ``FakeLocalSidecar`` also duck-types the parts of ``unstall.Sidecar`` that Dataset uses.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import threading
from pathlib import Path
from typing import Any, Optional

from unstall import protocol
from unstall.client import FlightClient
from unstall.local import LocalClient, recv_frame, send_frame

TOKEN = "e" * 64


class FakeLocalSidecar:
    def __init__(self, root: Path, n: int = 40) -> None:
        self.shm = root / "unstall-fake"
        self.shm.mkdir(mode=0o700)
        self.socket_path = str(self.shm / "data.sock")
        self.payloads = [bytes([i % 251]) * (10 + i) for i in range(n)]
        self.info = protocol.DatasetInfo("imgs", "imagefolder", "file:///fake/imgs", n,
                                         sum(map(len, self.payloads)), tuple(f"c{i}" for i in range(4)))
        self.offsets = {}
        with open(self.shm / "cache-0", "wb") as f:
            for i in range(0, n, 2):
                self.offsets[i] = f.tell()
                f.write(self.payloads[i])
        self.lock = threading.Lock()
        self.requests: list[tuple[int, Any]] = []  # (peer pid, LocalRequest)
        self.sessions: dict[int, tuple[str, str, int]] = {}  # id -> (dataset, name, connection)
        self.lie = False
        self.unavailable = False
        self._ids = itertools.count(1)
        self._stages = itertools.count()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.socket_path)
        self._server.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    # -- what Dataset needs from a Sidecar ---------------------------------------------------------
    token = TOKEN
    flight_location = "grpc+tcp://127.0.0.1:1"  # never connected: the tests must not use Flight

    def describe(self, name: str) -> protocol.DatasetInfo:
        if name != self.info.name:
            raise KeyError(name)
        return self.info

    def register_dataset(self, name: str, root: Any, format: str = "imagefolder", options: Any = None) -> Any:
        return self.describe(name)

    def flight_client(self) -> FlightClient:
        return FlightClient(self.flight_location, TOKEN)

    def local_client(self) -> Optional[LocalClient]:
        return LocalClient(self.socket_path, TOKEN)

    def take_requests(self) -> list[tuple[int, Any]]:
        with self.lock:
            out, self.requests = self.requests, []
        return out

    def close(self) -> None:
        self._server.close()

    # -- serving -------------------------------------------------------------------------------
    def _accept(self) -> None:
        for conn_id in itertools.count(1):
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, conn_id), daemon=True).start()

    def _serve(self, conn: socket.socket, conn_id: int) -> None:
        pid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        stage: Optional[Path] = None
        hello = False
        try:
            while True:
                try:
                    body = recv_frame(conn)
                except (EOFError, OSError):
                    return
                if stage is not None:  # the client mapped it before sending this request
                    stage.unlink()
                    stage = None
                req = protocol.decode_local_request(body)
                with self.lock:
                    self.requests.append((pid, req))
                if req.kind == protocol.LOCAL_HELLO:
                    if req.token != TOKEN.encode():
                        send_frame(conn, protocol.encode_local_error(5, "wrong token"))
                        return
                    hello = True
                    reply = protocol.encode_local_ok({"v": 1, "pid": os.getpid(), "shm": str(self.shm)})
                elif not hello:
                    reply = protocol.encode_local_error(1, "HELLO must come first")
                elif self.unavailable:
                    reply = protocol.encode_local_error(6, "the sidecar is shutting down")
                elif req.kind == protocol.LOCAL_OPEN:
                    if req.doc["dataset"] != self.info.name:
                        reply = protocol.encode_local_error(2, f"unknown dataset '{req.doc['dataset']}' (registered: imgs)")
                    else:
                        s = next(self._ids)
                        with self.lock:
                            self.sessions[s] = (req.doc["dataset"], req.doc["name"], conn_id)
                        reply = protocol.encode_local_ok({"v": 1, "session": s, "dataset": req.doc["dataset"]})
                elif req.kind == protocol.LOCAL_CLOSE:
                    with self.lock:
                        self.sessions.pop(req.session, None)
                    reply = protocol.encode_local_ok({"v": 1, "closed": True})
                elif req.session not in self.sessions:
                    reply = protocol.encode_local_error(2, f"unknown session {req.session}")
                elif any(int(i) >= len(self.payloads) for i in req.ids):
                    bad = next(int(i) for i in req.ids if int(i) >= len(self.payloads))
                    reply = protocol.encode_local_error(
                        1, f"sample id {bad} is out of range for dataset 'imgs' of {len(self.payloads)} samples")
                elif req.kind == protocol.LOCAL_PLAN:
                    reply = protocol.encode_local_ok({"v": 1, "planned": len(req.ids)})
                else:
                    reply, stage = self._batch([int(i) for i in req.ids])
                send_frame(conn, reply)
        finally:
            if stage is not None:
                stage.unlink()
            with self.lock:
                for s in [s for s, v in self.sessions.items() if v[2] == conn_id]:
                    del self.sessions[s]
            conn.close()

    def _batch(self, ids: list[int]) -> tuple[bytes, Optional[Path]]:
        offsets, segs, staged = [], [], bytearray()
        for i in ids:
            if i in self.offsets:
                offsets.append(self.offsets[i])
                segs.append(0)
            else:
                offsets.append(len(staged))
                segs.append(1)
                staged += self.payloads[i]
        segments = ["cache-0"]
        stage = None
        if 1 in segs:
            stage = self.shm / f"stage-{next(self._stages)}"
            stage.write_bytes(staged)
            segments.append(stage.name)
        reply_ids = ids[::-1] if self.lie else ids
        body = protocol.encode_local_batch(
            reply_ids, [None if i % 5 == 4 else i % 4 for i in ids], offsets, [len(self.payloads[i]) for i in ids], segs,
            [f"c{i % 4}/{i}.jpg" for i in ids], segments)
        return body, stage
