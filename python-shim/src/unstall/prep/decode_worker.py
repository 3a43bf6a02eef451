"""``PrepLoader(..., decode_workers=1)``: a loader's ``decode(device="mixed")`` in a process of its own.

On the prefetcher's thread the decode shares the trainer's interpreter lock: each of its Python steps between the
decoder's calls waits for the training thread to let go of the lock, and holds the training thread while it runs.
With a worker the prefetcher's thread only copies a raw batch's payload bytes into shared memory, sends the batch's
particulars down a pipe and copies the images it gets back into this process's memory; the checks, the draws, the
decode, the crops and the normalization run in the worker, on the same device. The images come back through
``torch.multiprocessing``'s sharing (CUDA IPC on a GPU, with its event; shared memory on the CPU), and the copy
frees the worker's buffer for its next batch.

Loaded only by a ``PrepLoader`` with ``decode_workers=1``: ``import unstall`` imports neither it nor torch."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import warnings
from contextlib import nullcontext
from multiprocessing.connection import Connection
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

__all__ = ["DecodeWorker", "DecodeWorkerGone", "LoaderWorker"]

_MEMORY_FORMATS = ("channels_last", "contiguous_format")


class DecodeWorkerGone(RuntimeError):
    """The worker process ended (killed, out of memory): the loader decodes in its own process from then on."""


class DecodeWorker:
    """One process that runs ``MixedDecode(ops, dtype, layout, device, memory_format)`` for one loader, a batch at a
    time (calls are serialized). A batch's refusal (a sample that does not decode) comes back as the ValueError the
    decode raised, in its words."""

    def __init__(self, ops: Sequence[Mapping[str, Any]], dtype: str, layout: str, device: Any,
                 memory_format: Any = None) -> None:
        import multiprocessing

        import torch

        fmt = next((name for name in _MEMORY_FORMATS if memory_format is not None
                    and memory_format == getattr(torch, name)), None)
        if memory_format is not None and fmt is None:
            raise ValueError(f"decode_workers: memory_format must be one of torch.{', torch.'.join(_MEMORY_FORMATS)}"
                             f", got {memory_format!r}")
        # A new interpreter (a CUDA context does not survive a fork), started as `python -m` over an inherited
        # socket: multiprocessing's spawn would run the trainer's script again in it, which a script without an
        # `if __name__ == "__main__":` guard does not survive. The same import path as this process.
        ours, theirs = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), UNSTALL_DECODE_FD=str(theirs.fileno()))
        self._proc = subprocess.Popen([sys.executable, "-m", "unstall.prep.decode_worker"], env=env,
                                      pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        theirs.close()
        self._conn = Connection(ours.detach())
        # the pipe's first message: this process's key, which the worker's shared tensors are fetched with (on the
        # CPU their file descriptors come through its resource sharer), and what to run
        self._conn.send_bytes(bytes(multiprocessing.current_process().authkey))
        self._conn.send(([dict(o) for o in ops], dtype, layout, str(device), fmt))
        self._lock = threading.Lock()
        self._shm: Any = None
        self.pid = self._proc.pid
        self.batches = 0  # decoded there and copied back

    def __call__(self, data: np.ndarray, offsets: np.ndarray, ids: Sequence[int], epoch: int, seed: int,
                 keys: Sequence[str], prepared: Optional[Sequence[bool]], headers: Optional[np.ndarray],
                 limits: Optional[Mapping[str, Any]]) -> Tuple[Any, Optional[float]]:
        """The batch's images (this process's own copy, on the loader's device and the current stream) and the
        worker's decode seconds per encoded sample (None when it decoded none)."""
        start, end = int(offsets[0]), int(offsets[-1])
        with self._lock:
            shm = self._buffer(end - start)
            np.ndarray((end - start,), np.uint8, shm.buf)[:] = data[start:end]
            try:
                self._conn.send((shm.name, end - start, np.asarray(offsets, dtype=np.int64) - start, list(ids),
                                 epoch, seed, list(keys), None if prepared is None else list(prepared),
                                 None if headers is None else np.asarray(headers, dtype=np.int64),
                                 None if limits is None else dict(limits)))
                reply = self._conn.recv()
            except (EOFError, OSError) as e:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=5)
                raise DecodeWorkerGone(f"the decode worker (pid {self.pid}) ended, exit code "
                                       f"{self._proc.returncode}: {type(e).__name__}") from e
        if reply[0] == "error":
            _, kind, message = reply
            raise (ValueError if kind == "ValueError" else RuntimeError)(message)
        _, images, per_sample = reply
        self.batches += 1
        return images.clone(), per_sample  # the worker's block goes back to it as the received tensor is dropped

    def _buffer(self, size: int) -> Any:
        """The shared memory the payloads go through, grown (a new segment) when a batch needs more."""
        from multiprocessing import shared_memory

        if self._shm is None or self._shm.size < size:
            old = self._shm
            self._shm = shared_memory.SharedMemory(create=True, size=max(size, 1 << 20) * 5 // 4)
            if old is not None:
                _drop(old)
        return self._shm

    def close(self) -> None:
        """Stops the worker (it finishes the batch in hand) and frees the shared memory."""
        with self._lock:
            try:
                self._conn.send(None)
            except (OSError, ValueError):
                pass
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)
            self._conn.close()
            if self._shm is not None:
                _drop(self._shm)
                self._shm = None


class LoaderWorker:
    """A ``PrepLoader``'s decode worker: started at its first batch; once it ended (warned of once), none, and the
    loader decodes in its own process from that batch on."""

    def __init__(self) -> None:
        self.process: Optional[DecodeWorker] = None
        self.ended = False

    def __call__(self, mixed: Any, payloads: Any, ids: Sequence[int], epoch: int, seed: int,
                 prepared: Optional[Sequence[bool]], limits: Optional[Mapping[str, Any]], rates: Any) -> Any:
        """The batch's images decoded by the worker (``payloads``: a ``PayloadBatch``; ``rates``: the hybrid's
        ``MemberRates``, given the worker's decode seconds per sample), or None when the loader is to decode it."""
        if self.ended:
            return None
        if self.process is None:
            self.process = DecodeWorker(mixed.ops, mixed.dtype, mixed.layout, mixed.device, mixed.memory_format)
        try:
            images, per_sample = self.process(payloads.data, payloads.offsets, ids, epoch, seed, payloads.keys,
                                              prepared, payloads.headers, limits)
        except DecodeWorkerGone as e:  # this batch and the next are decoded in the loader: nothing lost
            warnings.warn(f"unstall: {e}; decoding in this process from now on", RuntimeWarning, stacklevel=2)
            self.close()
            self.ended = True
            return None
        if rates is not None and per_sample is not None:
            rates.decoded(per_sample)
        return images

    def close(self) -> None:
        if self.process is not None:
            self.process.close()
            self.process = None


def _drop(shm: Any) -> None:
    try:
        shm.close()
    finally:
        try:
            shm.unlink()
        except FileNotFoundError:
            pass


def _attach(shared_memory: Any, name: str) -> Any:
    """The loader's segment, which the loader unlinks: not this process's to clean up at its exit."""
    try:
        return shared_memory.SharedMemory(name=name, track=False)  # Python 3.13+
    except TypeError:
        from multiprocessing import resource_tracker

        shm = shared_memory.SharedMemory(name=name)
        resource_tracker.unregister(shm._name, "shared_memory")  # noqa: SLF001  (3.12 and before register it)
        return shm


def _serve(conn: Any, ops: Sequence[Mapping[str, Any]], dtype: str, layout: str, device: str,
           memory_format: Optional[str]) -> None:
    """The worker: decodes the batches the pipe brings until it brings None or closes."""
    import time
    from multiprocessing import shared_memory

    import torch
    import torch.multiprocessing  # noqa: F401  (the pipe's pickler shares tensors from here on)

    from .mixed import MixedDecode, payload_tensors

    dev = torch.device(device)
    mixed = MixedDecode(ops, dtype, layout, dev, getattr(torch, memory_format) if memory_format else None)
    stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None
    segments: Dict[str, Any] = {}
    spent: Dict[str, float] = {}  # the batch's decode seconds per encoded sample

    def timing(n: int, work: Any) -> Any:
        t0 = time.perf_counter()
        out = work()
        if stream is not None:
            stream.synchronize()
        spent["per_sample"] = (time.perf_counter() - t0) / n
        return out

    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            break
        if request is None:
            break
        name, size, offsets, ids, epoch, seed, keys, prepared, headers, limits = request
        try:
            if name not in segments:
                segments.clear()  # a grown segment replaces the old one (the loader unlinked it)
                segments[name] = _attach(shared_memory, name)
            data = np.ndarray((size,), np.uint8, segments[name].buf)
            mixed.set_limits(limits)
            spent.clear()
            with torch.cuda.stream(stream) if stream is not None else nullcontext():
                images = mixed(payload_tensors(data, offsets), ids, epoch, seed, keys, prepared, timing, headers)
            if stream is not None:
                stream.synchronize()  # all of it done (the sidecar's rows copied in too) before the loader reads it
            del data
            conn.send(("ok", images, spent.get("per_sample")))
            del images
            if stream is not None:
                torch.cuda.ipc_collect()  # the blocks the loader copied out of and let go of: back to the allocator
        except Exception as e:  # the batch's refusal, in the decode's words; the worker goes on
            conn.send(("error", type(e).__name__, str(e)))


def _main() -> None:
    """``python -m unstall.prep.decode_worker``, as ``DecodeWorker`` starts it: the socket it inherited, the
    loader's key, then what to run."""
    import multiprocessing

    conn = Connection(int(os.environ["UNSTALL_DECODE_FD"]))
    multiprocessing.current_process().authkey = conn.recv_bytes()
    ops, dtype, layout, device, memory_format = conn.recv()
    _serve(conn, ops, dtype, layout, device, memory_format)


if __name__ == "__main__":
    _main()
