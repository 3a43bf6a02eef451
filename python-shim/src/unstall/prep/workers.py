"""DataLoader-style worker processes for :class:`unstall.prep.SharedTransformLoader` (``num_workers > 0``).

Each worker process of a member claims the group's next free batch as that member (``prep.claim`` with
``"next": true``, which leaves the member's read position alone), fetches its samples, runs the user's
transforms and uploads the batch (DoPut) itself; the member's main process only reads the group's batches. So k
members with w workers each are k*w processes sharing the group's batches, each batch made once.

A worker whose transform raises gives its claim back (``prep.release``) and reports the error, which the main
process re-raises as torch's DataLoader does ("Caught ValueError in DataLoader worker process 1 ..."), naming
the batch and the sample. A worker that dies: the main process gives its claim back and another worker or member
makes the batch; when all of a member's workers are dead, its main process raises.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import queue
import threading
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, cast

import numpy as np
import pyarrow.compute as pc

from ..client import grpc_used_in_this_process
from ..errors import PrepGroupNotFoundError
from ..protocol import tensor_batch
from .membership import Membership

__all__ = ["WorkerSpec", "WorkerPool", "WorkerError"]

log = logging.getLogger("unstall")


@dataclass
class WorkerSpec:
    """What a worker process needs (pickled to it): the member's client (its connection is opened in the worker),
    the group and member, and the user's callables."""

    client: Any
    dataset: str
    info: dict[str, Any]
    transform: Callable[[Any], Any]
    loader: Callable[[bytes], Any]
    worker_init_fn: Optional[Callable[[int], None]]


@dataclass
class WorkerError:
    """A worker's exception, pickled as text (the exception itself may not pickle), re-raised in the main process."""

    exc_type: bytes  # the pickled exception class, or b"" when it does not pickle
    type_name: str
    message: str

    def reraise(self) -> None:
        try:
            cls = pickle.loads(self.exc_type) if self.exc_type else RuntimeError
            err = cls(self.message)
        except Exception:
            err = RuntimeError(self.message)
        raise err


def _error(e: BaseException, where: str) -> WorkerError:
    try:
        cls = pickle.dumps(type(e))
    except Exception:
        cls = b""
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return WorkerError(cls, type(e).__name__, f"Caught {type(e).__name__} in {where}.\nOriginal {text}")


def _make(m: Any, spec: WorkerSpec, epoch: int, index: int, ids: Sequence[int], where: str) -> None:
    import torch

    raw = m.client.fetch(spec.dataset, list(ids), epoch)
    payloads = raw.column("payload").to_pylist()
    keys = raw.column("key").to_pylist() if "key" in raw.schema.names else [None] * len(payloads)
    labels = pc.fill_null(raw.column("label"), -1).to_numpy(zero_copy_only=False)
    samples = []
    for sid, key, data in zip(ids, keys, payloads):
        try:
            samples.append(torch.as_tensor(spec.transform(spec.loader(data))))
        except Exception as e:
            e.add_note(f"{where}, making epoch {epoch} batch {index}: sample id {sid} (key {key!r}) of dataset "
                       f"{spec.dataset!r}")
            raise
    images = torch.stack(samples).numpy()
    m.upload(epoch, index, tensor_batch(images, labels, np.asarray(ids)))


def _worker_loop(spec: WorkerSpec, index: int, slot: Any, conn: multiprocessing.connection.Connection) -> None:
    import torch

    torch.set_num_threads(1)  # as torch's DataLoader workers: w processes, not w x cores threads
    where = f"DataLoader worker process {index} (pid {os.getpid()})"
    if spec.worker_init_fn is not None:
        spec.worker_init_fn(index)
    m = Membership(client=spec.client, dataset=spec.dataset, info=spec.info)  # no heartbeat: the main process's
    while True:
        epoch = conn.recv()
        if epoch is None:
            return
        while True:
            try:
                r = m.claim_next(epoch)
            except PrepGroupNotFoundError:
                # the member read its last batch (and left) while this worker waited for a claim to come back, or
                # it was dropped: the main process's reader gets the batches it still needs, or this same error
                conn.send(("done", epoch))
                break
            except Exception as e:
                conn.send(("error", _error(e, where)))
                break
            if r["state"] == "done":
                conn.send(("done", epoch))
                break
            if r["state"] != "produce":
                continue  # "wait": nothing free yet (a claim may still come back)
            b = int(r["batch"])
            slot[0], slot[1] = epoch, b
            try:
                _make(m, spec, epoch, b, r["ids"], where)
            except Exception as e:
                try:
                    m.release(epoch, b, f"{where}: {type(e).__name__}: {e}")
                except Exception:
                    pass  # the claim expires (--prep-claim-timeout)
                conn.send(("error", _error(e, where)))
                break
            finally:
                slot[0], slot[1] = -1, -1


def default_context() -> Any:
    """torch's: fork, but a forkserver once this process has used gRPC (a forked child could hang)."""
    if grpc_used_in_this_process() and multiprocessing.get_start_method(allow_none=False) == "fork":
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["__main__", "torch", "unstall.prep"])
        return ctx
    return multiprocessing.get_context()


class WorkerPool:
    """A member's worker processes. ``errors``: where worker errors and deaths go (the epoch's queue)."""

    def __init__(self, membership: Any, spec: WorkerSpec, num_workers: int, context: Any) -> None:
        self.membership = membership
        self.spec = spec
        # multiprocessing's context types carry no Process attribute for the type checker
        self.ctx = cast(Any, multiprocessing.get_context(context) if isinstance(context, str) else context)
        self.procs: list[Any] = []
        self.conns: list[multiprocessing.connection.Connection] = []
        self.slots: list[Any] = []
        self.dead: set[int] = set()
        self.errors: Optional[queue.Queue[Any]] = None
        self._stop = threading.Event()
        for i in range(num_workers):
            here, there = self.ctx.Pipe()
            slot = self.ctx.Array("q", [-1, -1], lock=False)
            p = self.ctx.Process(target=_worker_loop, args=(spec, i, slot, there), daemon=True,
                                 name=f"unstall-prep-worker-{i}")
            p.start()
            there.close()
            self.procs.append(p)
            self.conns.append(here)
            self.slots.append(slot)
        self._watch = threading.Thread(target=self._watcher, name="unstall-prep-workers-watch", daemon=True)
        self._watch.start()

    def start_epoch(self, epoch: int, errors: queue.Queue[Any]) -> None:
        self.errors = errors
        for i, c in enumerate(self.conns):
            if i not in self.dead:
                c.send(epoch)

    def _report(self, item: Any) -> None:
        if self.errors is not None:
            self.errors.put(item)

    def _watcher(self) -> None:
        while not self._stop.is_set():
            live = [i for i in range(len(self.procs)) if i not in self.dead]
            if not live:
                return
            waitables: list[Any] = [self.conns[i] for i in live] + [self.procs[i].sentinel for i in live]
            for ready in multiprocessing.connection.wait(waitables, timeout=1.0):
                for i in live:
                    if ready is self.conns[i]:
                        try:
                            kind, payload = self.conns[i].recv()
                        except (EOFError, OSError):
                            continue  # it died: its sentinel says so
                        if kind == "error":
                            self._report(("error", payload))
                    elif ready == self.procs[i].sentinel and i not in self.dead:
                        self._died(i)

    def _died(self, i: int) -> None:
        p = self.procs[i]
        p.join(timeout=5)
        self.dead.add(i)
        if self._stop.is_set():
            return
        epoch, b = int(self.slots[i][0]), int(self.slots[i][1])
        why = f"DataLoader worker process {i} (pid {p.pid}) exited unexpectedly with exit code {p.exitcode}"
        if b >= 0:
            try:
                self.membership.release(epoch, b, why)
            except Exception as e:
                log.warning("unstall: %s; its claim on epoch %d batch %d could not be given back (%s): it expires "
                            "after --prep-claim-timeout", why, epoch, b, e)
        log.warning("unstall: %s%s; the other workers of the group go on", why,
                    f" while making epoch {epoch} batch {b}" if b >= 0 else "")
        if len(self.dead) == len(self.procs):
            self._report(("error", WorkerError(b"", "RuntimeError", f"all {len(self.procs)} DataLoader worker "
                                               f"processes of this member exited unexpectedly (last: {why})")))

    def close(self) -> None:
        self._stop.set()
        for i, c in enumerate(self.conns):
            if i not in self.dead:
                try:
                    c.send(None)
                except OSError:
                    pass
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        for c in self.conns:
            c.close()
