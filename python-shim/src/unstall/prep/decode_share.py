"""One decode for the members of a prep group on one device: a batch that ``decode(device="mixed")`` decoded is
handed to the group's other members on the same host and device (the jobs of a hyper-parameter search), so k jobs
still cost one decode of each batch.

The first member to reach batch ``(epoch, index)`` claims it by binding an abstract Unix socket named for the
group, the device and the batch (a name no other user can guess: it is a digest over the sidecar's token); it
decodes the batch, keeps a private copy on offer (the ring of its last ``ring`` batches) and hands the others, on
request, a handle to that copy: a CUDA IPC handle with torch's cross-process reference count (what
``torch.multiprocessing`` sends) on a GPU, the shared-memory file descriptor on the CPU. A member that finds the
name bound connects, checks the claimant runs as its own user, receives the handle, copies the batch into its own
memory and lets the handle go. It uses the batch only when the claimant's sample ids are its own; else, or when the
claimant failed, left or dropped the batch from its ring, it decodes the batch itself (a claimant that is gone
frees the name, so the next member claims the batch again): a job is never fed another job's samples, and never
waits on a member that left. Sockets are local to the host (and its network namespace): members on other hosts,
or on another device, decode their own batches, and so does a member on a GPU whose claimant is its own process
(another loader or thread of it: CUDA does not import a process's own memory through an IPC handle; on the CPU the
shared-memory fd maps in the same process too)."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import logging
import os
import selectors
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Callable, Deque, List, Optional, Sequence

from ..errors import ProtocolMismatchError
from ..protocol import HANDOVER_VERSION, CudaHandle, Handover, encode_handover, parse_handover
log = logging.getLogger("unstall")

__all__ = ["DecodeShare", "ShareStats", "share_scope"]

_MAX_MESSAGE = 1 << 20
_ATTEMPTS = 20  # bind-or-connect rounds for one batch (a claimant between bind and listen refuses a connection)
_CRED = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid


@dataclass
class ShareStats:
    """A member's part in the group's decodes on its device: ``decoded`` (batches it decoded and offered),
    ``served`` (handles it handed to other members), ``received`` (batches it took from another member's decode),
    ``fallbacks`` (batches it decoded itself because the member that claimed them failed, left, dropped them or
    held other samples) and, of those, ``mismatches`` (the claimant's samples were not this member's)."""

    decoded: int = 0
    served: int = 0
    received: int = 0
    fallbacks: int = 0
    mismatches: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def share_scope(*parts: Any) -> bytes:
    """The digest that names a group's decoded batches on one device: every part that must match for two members
    to hand each other a batch (the user, the sidecar and its token, the group, its seed, the device-side pipeline,
    the device's UUID)."""
    h = hashlib.sha256()
    for p in (os.getuid(), *parts):
        h.update(repr(p).encode())
        h.update(b"\0")
    return h.digest()


def device_uuid(device: Any) -> str:
    """A device's identity across processes (CUDA_VISIBLE_DEVICES may number it differently in each): its UUID."""
    if device.type != "cuda":
        return device.type
    import torch

    props = torch.cuda.get_device_properties(device.index if device.index is not None else torch.cuda.current_device())
    return str(getattr(props, "uuid", props.name))


class _Offer:
    """A batch this member decoded, on offer on its socket until the ring drops it."""

    __slots__ = ("sock", "ids", "ready", "tensor", "event", "lock")

    def __init__(self, sock: socket.socket, ids: List[int]) -> None:
        self.sock, self.ids = sock, ids
        self.ready = threading.Event()
        self.tensor: Any = None  # None once ready: the decode failed
        self.event: Any = None
        self.lock = threading.Lock()  # torch's _share_cuda_ rewraps the storage: one handle at a time


class DecodeShare:
    """Claims, offers and receives one loader's decoded batches (see the module). ``device``: the loader's
    ``torch.device``; ``ring``: batches kept on offer after their decode (device memory: ``ring`` batches);
    ``timeout``: seconds a member waits for a claimant's handle before it decodes the batch itself; ``peers``: other
    members are expected (the group was started for several, ``group_size``), so decoded batches are offered from
    the first. Otherwise a member keeps no copy (no device memory, no copy per batch) until another member asked it
    for a batch or it asked another: that batch is decoded twice, the later ones once."""

    def __init__(self, device: Any, ring: int = 4, timeout: float = 60.0, peers: bool = False) -> None:
        if ring < 1:
            raise ValueError(f"a decode share's ring must hold at least 1 batch, got {ring}")
        self.cuda = device.type == "cuda"
        if self.cuda and device.index is None:  # the server thread sets it: torch needs an index for that
            import torch

            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.ring = ring
        self.timeout = timeout
        self.stats = ShareStats()
        self._offers: Deque[_Offer] = deque()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)  # a wake-up already pending is enough: never blocks (close() included)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._server: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._closed = False
        self.peers = peers  # another member was seen (or is expected): decoded batches are kept on offer
        self.broken: Optional[str] = None  # why a handed batch could not be mapped here: then no sharing at all

    # -- a member's batch ---------------------------------------------------------------------------------------

    def batch(self, scope: bytes, epoch: int, index: int, ids: Sequence[int], decode: Callable[[], Any]) -> Any:
        """Batch ``index`` of ``epoch`` (whose samples are ``ids``): another member's decode when one claimed it,
        else ``decode()``, offered to the others."""
        if self.broken:
            return decode()
        at = f"/v{HANDOVER_VERSION}/{epoch}/{index}".encode()  # members speaking another version never meet
        name = b"\0unstall/decoded/" + hashlib.sha256(scope + at).hexdigest()[:40].encode()
        want = [int(i) for i in ids]
        for attempt in range(_ATTEMPTS):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
            try:
                sock.bind(name)
            except OSError as e:
                sock.close()
                if e.errno != errno.EADDRINUSE:
                    raise
                try:
                    got = self._receive(name, want)
                except Exception as e:  # noqa: BLE001  (mapping the handle failed: this job decodes its own)
                    if self.cuda:  # the failed import's error, not the next kernel launch's
                        from ..device import clear_cuda_error

                        clear_cuda_error()
                    self.broken = f"{type(e).__name__}: {e}"
                    log.warning("unstall: could not map another member's decoded batch (%s); this job decodes its "
                                "own batches from now on (device_share=False silences this)", self.broken)
                    self.stats.fallbacks += 1
                    return decode()
                if got is _GONE:
                    time.sleep(0.001 * attempt)  # the claimant left, or is between bind and listen: claim again
                    continue
                if got is not None:
                    self.stats.received += 1
                    return got
                self.stats.fallbacks += 1
                return decode()
            return self._offer(sock, want, decode)
        self.stats.fallbacks += 1
        return decode()

    def _offer(self, sock: socket.socket, ids: List[int], decode: Callable[[], Any]) -> Any:
        import torch

        sock.listen(64)
        offer = _Offer(sock, ids)
        self._register(offer)
        try:
            out = decode()
            if not self.peers:
                pass  # nobody to offer it to yet: no copy (an asker is told, and decodes it)
            elif self.cuda:
                offer.tensor = out.clone()  # the job may write into its batch; the others read this copy
                offer.event = torch.cuda.Event()
                offer.event.record()
            else:
                offer.tensor = _shared_cpu_copy(out)
        except BaseException:
            self._drop(offer)
            raise
        finally:
            offer.ready.set()
        self.stats.decoded += 1
        with self._lock:
            self._offers.append(offer)
            old = [self._offers.popleft() for _ in range(max(0, len(self._offers) - self.ring))]
        for o in old:
            self._drop(o)
        return out

    def _receive(self, name: bytes, ids: List[int]) -> Any:
        """The claimant's batch as this member's own tensor; ``_GONE`` when the claimant is gone (or not listening
        yet); None when it cannot hand the batch over (failed, dropped it, other samples, another user)."""
        c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        c.settimeout(self.timeout)
        try:
            try:
                c.connect(name)
            except (ConnectionRefusedError, FileNotFoundError):
                return _GONE
            pid, uid = _peer(c)
            if uid != os.getuid():
                log.warning("unstall: the socket of a decoded batch is held by another user; decoding it here")
                return None
            if pid == os.getpid() and self.cuda:  # another loader or thread of this process: CUDA does not import
                log.debug("unstall: batch %s is claimed by this process; decoding it here", name[-8:])  # its own memory
                return None
            self.peers = True  # from now on this member's decodes are offered too
            c.sendall(b"?")
            try:
                data, fds, _, _ = socket.recv_fds(c, _MAX_MESSAGE, 1)
            except TimeoutError:
                log.warning("unstall: waited %.0f s for another member's decoded batch; decoding it here", self.timeout)
                return None
            except OSError:  # reset: the claimant left while this member waited
                return _GONE
            if not data:
                _close_all(fds)
                return _GONE  # the claimant left while this member waited
            try:
                h = parse_handover(data)
            except ProtocolMismatchError as e:
                _close_all(fds)
                log.warning("unstall: %s; decoding the batch here", e)
                return None
            if not h.ok:
                _close_all(fds)
                return None
            if h.ids != ids:
                _close_all(fds)
                self.stats.mismatches += 1
                log.warning("unstall: a decoded batch on offer holds samples %s..., this member's are %s...; "
                            "decoding it here", h.ids[:4], ids[:4])
                return None
            return self._rebuild(h, fds)
        finally:
            c.close()

    def _rebuild(self, h: Handover, fds: List[int]) -> Any:
        import torch

        dtype = getattr(torch, h.dtype.rsplit(".", 1)[-1])
        if h.cuda is not None:
            from torch.multiprocessing.reductions import rebuild_cuda_tensor

            _close_all(fds)
            c = h.cuda
            shared = rebuild_cuda_tensor(
                torch.Tensor, torch.Size(h.size), h.stride, h.offset, torch.storage.TypedStorage, dtype,
                self.device.index, c.handle, c.storage_bytes, c.storage_offset_bytes, False, c.ref_counter,
                c.ref_counter_offset, c.event, c.event_sync)
            own = shared.clone()  # on this thread's stream, after the claimant's event
            del shared  # torch's release: syncs this stream (the copy done), then returns the claimant's count
            return own
        if len(fds) != 1 or h.storage_bytes is None:
            _close_all(fds)
            raise ProtocolMismatchError("decoded-batch hand-over: a CPU batch comes with one file descriptor")
        try:
            storage = torch.UntypedStorage._new_shared_fd_cpu(fds[0], h.storage_bytes)  # type: ignore[attr-defined]
        finally:
            _close_all(fds)
        view = torch.empty(0, dtype=dtype).set_(storage, h.offset, h.size, h.stride)
        return view.clone()

    # -- the claimant's side ------------------------------------------------------------------------------------

    def _register(self, offer: _Offer) -> None:
        with self._lock:
            self._selector.register(offer.sock, selectors.EVENT_READ, offer)
            if self._server is None:
                self._server = threading.Thread(target=self._serve, name="unstall-decode-share", daemon=True)
                self._server.start()
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"w")
        except (BlockingIOError, OSError):
            pass  # the server has wake-ups to read, or is closed

    def _drop(self, offer: _Offer) -> None:
        with self._lock:
            try:
                self._selector.unregister(offer.sock)
            except (KeyError, ValueError):
                pass
        offer.sock.close()
        offer.tensor = None
        self._wake()

    def _serve(self) -> None:
        while not self._closed:
            for key, _ in self._selector.select(timeout=1.0):
                if key.data is None:
                    self._wake_r.recv(4096)
                    continue
                offer: _Offer = key.data
                try:
                    conn, _ = offer.sock.accept()
                except OSError:
                    continue  # dropped meanwhile
                threading.Thread(target=self._hand, args=(offer, conn), name="unstall-decode-share-hand",
                                 daemon=True).start()

    def _hand(self, offer: _Offer, conn: socket.socket) -> None:
        try:
            conn.settimeout(self.timeout)
            if _peer(conn)[1] != os.getuid() or conn.recv(16) != b"?":
                return
            self.peers = True  # another member asked: the next decodes are offered
            ok = offer.ready.wait(self.timeout)
            tensor = offer.tensor
            if not ok or tensor is None:
                conn.sendall(encode_handover(Handover(False)))
                return
            with offer.lock:
                h, fds = self._describe(offer, tensor)
            socket.send_fds(conn, [encode_handover(h)], fds)
            with self._lock:
                self.stats.served += 1
        except OSError:
            pass  # the member left: it decodes the batch itself
        except Exception as e:  # noqa: BLE001  (this member keeps decoding; the other falls back)
            log.warning("unstall: could not hand a decoded batch to another member: %s", e)
        finally:
            conn.close()

    def _describe(self, offer: _Offer, t: Any) -> tuple[Handover, List[int]]:
        base = Handover(True, offer.ids, str(t.dtype), tuple(t.size()), tuple(t.stride()), t.storage_offset())
        if self.cuda:
            import torch
            from torch.multiprocessing.reductions import reduce_tensor

            torch.cuda.set_device(self.device)
            offer.event.synchronize()  # the decode done before any handle to it is out
            _, a = reduce_tensor(t)  # a new reference count per handle, as torch.multiprocessing sends
            return dataclasses.replace(base, size=tuple(a[1]), stride=tuple(a[2]), offset=int(a[3]), cuda=CudaHandle(
                a[7], int(a[8]), int(a[9]), a[11], int(a[12]), a[13], bool(a[14]))), []
        fd, nbytes = t.untyped_storage()._share_fd_cpu_()
        return dataclasses.replace(base, storage_bytes=int(nbytes)), [fd]

    def close(self) -> None:
        """Drops every batch on offer (members still asking decode theirs) and stops the server."""
        self._closed = True
        with self._lock:
            offers, self._offers = list(self._offers), deque()
        for o in offers:
            self._drop(o)
        server, self._server = self._server, None
        if server is not None:
            server.join(timeout=5)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()


_GONE = object()


def _shared_cpu_copy(t: Any) -> Any:
    """``t`` copied into a new shared-memory storage with its strides (what another process maps by its fd)."""
    import torch

    span = 1 + sum((n - 1) * s for n, s in zip(t.size(), t.stride()) if n > 0) if t.numel() else 0
    storage = torch.UntypedStorage._new_shared(max(1, span) * t.element_size())
    shared = torch.empty(0, dtype=t.dtype).set_(storage, 0, t.size(), t.stride())
    shared.copy_(t)
    return shared


def _peer(sock: socket.socket) -> tuple[int, int]:
    """The other end's (pid, uid), from the kernel (SO_PEERCRED)."""
    pid, uid, _ = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return int(pid), int(uid)


def _close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        os.close(fd)
