"""The last hop: host batches to the device, prefetched on a side stream, converted there.

``DevicePrefetcher`` wraps an iterator of host batches (any nesting of tuples, lists and dicts of tensors, as
torch's ``pin_memory`` handles) and keeps ``depth`` batches in flight on the device, like torchdata.nodes'
``PinMemory`` + ``Prefetcher`` and NVIDIA's example data prefetcher. A thread of its own reads the host batches
and issues their copies, as torch's pin-memory thread does, so the training thread's ``next()`` neither waits
for the source's round trips nor spends its time there. On CUDA each batch is copied on a side
stream (``non_blocking=True``) and converted there (``ImageConversion``: uint8 to float, normalize, memory
format, in one pass); an event marks the batch ready. Handing it out makes the training stream wait on that event
only, and ``record_stream`` tells the caching allocator the training stream uses the memory. The host batch (a
shared-memory slot view: dropping it releases the slot, ``unstall.shm_slots``) is kept until its copy completed,
then dropped, in order. A large tensor that is not pinned is copied through a pinned staging buffer (on the
prefetcher's thread, so the training thread never does a pageable copy).

``PinnedSlots`` registers shared-memory slot mappings as page-locked memory (``cudaHostRegister``), as the
``on_map``/``on_unmap`` hooks of ``SlotMaps``, so slot copies are DMA.

With ``device="cpu"`` the same code runs without streams and events (CI): each tensor is copied, so a handed-out
batch owns its memory and the host batch is released at once.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import mmap
import queue
import threading
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Callable, Deque, Iterator, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from .observers import IteratorWrapper

__all__ = ["DeviceStats", "ImageConversion", "DevicePrefetcher", "PinnedSlots", "clear_cuda_error", "map_tensors",
           "tensors_of"]

DeviceLike = Union[str, torch.device]

# Smaller tensors that are not pinned (labels, ids) are copied directly: the driver stages a few KB cheaply.
_STAGE_MIN_BYTES = 1 << 20
_HOST_REGISTER_PORTABLE = 0x01  # pinned for every CUDA context
_HOST_REGISTER_READ_ONLY = 0x08  # the slot mappings are PROT_READ


@dataclass
class DeviceStats:
    """What the last hop did, over a loader's life: ``batches`` and ``bytes`` (host bytes) copied to the device,
    ``handout_cpu_s`` and ``handout_wall_s`` (the training thread's CPU and wall time inside the prefetcher's
    ``next()``: the wall time is the stall the loop sees, waiting for a batch the prefetcher's thread has not
    issued yet), ``staged_batches`` (copied through a pinned staging buffer), and the shared-memory slots
    registered as pinned memory, unregistered, and refused by the driver."""

    batches: int = 0
    bytes: int = 0
    handout_cpu_s: float = 0.0
    handout_wall_s: float = 0.0
    staged_batches: int = 0
    slots_registered: int = 0
    slots_unregistered: int = 0
    slots_refused: int = 0

    @property
    def cpu_ms_per_batch(self) -> float:
        """The training thread's CPU milliseconds per batch handed out."""
        return 1000.0 * self.handout_cpu_s / self.batches if self.batches else 0.0

    @property
    def wall_ms_per_batch(self) -> float:
        """The training thread's wall milliseconds in ``next()`` per batch handed out."""
        return 1000.0 * self.handout_wall_s / self.batches if self.batches else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cpu_ms_per_batch": self.cpu_ms_per_batch, "wall_ms_per_batch": self.wall_ms_per_batch}


def map_tensors(fn: Callable[[torch.Tensor], Any], data: Any) -> Any:
    """``data`` with ``fn`` applied to each tensor, in the structures torch's ``pin_memory`` walks (mappings,
    namedtuples, tuples, lists and other sequences, their types kept where they can be rebuilt); other leaves
    (strings, bytes, numbers, markers) unchanged."""
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, (str, bytes, bytearray, memoryview)):
        return data
    if isinstance(data, Mapping):
        items = {k: map_tensors(fn, v) for k, v in data.items()}
        try:
            return type(data)(items)  # type: ignore[call-arg]
        except TypeError:
            return items
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(map_tensors(fn, v) for v in data))
    if isinstance(data, tuple):
        return tuple(map_tensors(fn, v) for v in data)
    if isinstance(data, list):
        return [map_tensors(fn, v) for v in data]
    if isinstance(data, Sequence):
        seq = [map_tensors(fn, v) for v in data]
        try:
            return type(data)(seq)  # type: ignore[call-arg]
        except TypeError:
            return seq
    return data


def tensors_of(data: Any) -> Iterator[torch.Tensor]:
    """The tensors in ``data`` (the structures :func:`map_tensors` walks)."""
    if isinstance(data, torch.Tensor):
        yield data
    elif isinstance(data, (str, bytes, bytearray, memoryview)):
        return
    elif isinstance(data, Mapping):
        for v in data.values():
            yield from tensors_of(v)
    elif isinstance(data, Sequence):
        for v in data:
            yield from tensors_of(v)


class ImageConversion:
    """A uint8 image batch (``[n, c, h, w]`` for ``layout="NCHW"``, ``[n, h, w, c]`` for ``"NHWC"``) to
    ``dtype``, normalized ``(x / 255 - mean) / std`` per channel, in ``memory_format``, on the batch's device.

    The normalize is folded into one scale ``1 / (255 std)`` and one shift ``-mean / std`` per channel, and the
    dtype cast, normalize and layout change are one ``addcmul`` into an output of the asked format (math in
    float32, rounded once to ``dtype``). With ``memory_format`` set the result is an NCHW tensor in that format:
    an NHWC batch is read through ``permute(0, 3, 1, 2)``, already channels_last-strided, so channels_last costs
    no transpose. Without, the batch keeps its layout. ``dtype=None`` keeps the batch's dtype (only the layout changes);
    ``mean``/``std`` None: a cast only."""

    def __init__(self, layout: str = "NCHW", dtype: Optional[torch.dtype] = None,
                 mean: Optional[Sequence[float]] = None, std: Optional[Sequence[float]] = None,
                 memory_format: Optional[torch.memory_format] = None) -> None:
        if layout not in ("NCHW", "NHWC"):
            raise ValueError(f"layout must be 'NCHW' or 'NHWC', got {layout!r}")
        if (mean is None) != (std is None):
            raise ValueError("normalize needs both mean and std")
        if mean is not None and dtype is None:
            raise ValueError("normalize needs a float dtype")
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"dtype must be a float dtype or None (uint8 kept), got {dtype}")
        if memory_format not in (None, torch.contiguous_format, torch.channels_last):
            raise ValueError(f"memory_format must be torch.contiguous_format or torch.channels_last, "
                             f"got {memory_format}")
        self.layout = layout
        self.dtype = dtype
        self.memory_format = memory_format
        if mean is not None and std is not None:
            m = np.asarray(mean, dtype=np.float64)
            s = np.asarray(std, dtype=np.float64)
            if m.shape != s.shape or m.ndim != 1 or not np.all(s > 0):
                raise ValueError(f"mean and std must be per-channel lists of equal length, std > 0; got {mean}, {std}")
            self.scale: Optional[torch.Tensor] = torch.from_numpy((1.0 / (255.0 * s)).astype(np.float32))
            self.shift: Optional[torch.Tensor] = torch.from_numpy((-m / s).astype(np.float32))
        else:
            self.scale = self.shift = None
        self._coefficients: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def nchw(self) -> bool:
        """Whether the result is NCHW (the channels in dim 1), else NHWC (channels last)."""
        return self.layout == "NCHW" or self.memory_format is not None

    def _coefficients_on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        c = self._coefficients.get(device)
        if c is None:
            assert self.scale is not None and self.shift is not None
            shape = (1, -1, 1, 1) if self.nchw() else (-1,)
            c = self._coefficients[device] = (self.scale.view(shape).to(device), self.shift.view(shape).to(device))
        return c

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale is not None and x.dtype != torch.uint8:
            raise ValueError(f"ImageConversion normalizes uint8 batches, got {x.dtype}")
        if x.dim() != 4:
            raise ValueError(f"ImageConversion takes a 4-d {self.layout} batch, got shape {tuple(x.shape)}")
        if self.layout == "NHWC" and self.memory_format is not None:
            x = x.permute(0, 3, 1, 2)  # NCHW view, channels_last strides
        fmt = self.memory_format if self.memory_format is not None else torch.preserve_format
        if self.dtype is None:
            return x.contiguous(memory_format=torch.contiguous_format if self.memory_format is None
                                else self.memory_format)
        if self.scale is None:
            return x.to(self.dtype, memory_format=fmt)
        scale, shift = self._coefficients_on(x.device)
        out = torch.empty_like(x, dtype=self.dtype, memory_format=fmt)
        return torch.addcmul(shift, x, scale, out=out)


class _InFlight:
    """A batch on its way: the host batch (kept until the copy completed), the device batch, its event."""

    __slots__ = ("host", "out", "event", "nbytes", "staged", "tensors")

    def __init__(self, host: Any, out: Any, event: Any, nbytes: int, staged: bool, tensors: bool) -> None:
        self.host, self.out, self.event, self.nbytes, self.staged = host, out, event, nbytes, staged
        self.tensors = tensors  # a batch, not a marker the source passes through (an epoch's end)

    def copied(self) -> bool:
        return self.event is None or bool(self.event.query())


class _Failed:
    """What the source (or a copy) raised, handed out in its place."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()  # the source is exhausted


class _Producer:
    """The prefetcher's thread: pulls host batches from the source, issues their copies and conversion on the side
    stream and queues them, at most ``depth`` pulled and not handed out (``room``). It holds no reference to the
    prefetcher, so an abandoned prefetcher is collected (and closes) while this thread waits."""

    def __init__(self, source: Iterator[Any], device: torch.device, stream: Any,
                 convert: Optional[Callable[[Any], Any]], depth: int) -> None:
        self.source = source
        self.device = device
        self.stream = stream
        self.convert = convert
        self.ready: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.room = threading.Semaphore(depth)
        self.stop = threading.Event()
        self.pulled = 0
        self.thread = threading.Thread(target=self.run, name="unstall-device-prefetch", daemon=True)

    def run(self) -> None:
        try:
            if self.stream is not None:
                torch.cuda.set_device(self.device)
            while True:
                self.room.acquire()
                if self.stop.is_set():
                    return
                try:
                    host = next(self.source)
                except StopIteration:
                    self.ready.put(_END)
                    return
                self.pulled += 1
                self.ready.put(self.launch(host))
                del host
        except BaseException as e:  # raised in the loop once the batches pulled before it were handed out
            self.ready.put(_Failed(e))
        finally:
            close = getattr(self.source, "close", None)
            if callable(close):
                close()

    def launch(self, host: Any) -> _InFlight:
        cuda = self.stream is not None
        staged = cuda and any(not t.is_pinned() and t.nbytes >= _STAGE_MIN_BYTES for t in tensors_of(host))
        sizes = [t.nbytes for t in tensors_of(host)]
        with torch.cuda.stream(self.stream) if cuda else contextlib.nullcontext():
            out = map_tensors(self.copy, host)
            if self.convert is not None:
                out = self.convert(out)
            event = None
            if cuda:
                event = torch.cuda.Event()
                event.record(self.stream)
        return _InFlight(host, out, event, sum(sizes), staged, bool(sizes))

    def copy(self, t: torch.Tensor) -> torch.Tensor:
        if self.stream is None:
            return t.to(self.device, copy=True)  # owns its memory: the host batch is let go at once
        if t.device.type == "cpu" and not t.is_pinned() and t.nbytes >= _STAGE_MIN_BYTES:
            pinned = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)  # torch's caching host allocator
            pinned.copy_(t)
            t = pinned
        return t.to(self.device, non_blocking=True)


class DevicePrefetcher(IteratorWrapper):
    """The host batches of ``source`` on ``device``, ``depth`` of them in flight while the loop runs a step.

    A thread of its own (started by the first ``next()``) pulls the host batches from ``source`` and issues each
    one's copy (and ``convert``, a function of the device batch), so the training thread's ``next()`` only takes
    the oldest batch in flight: it waits only when the source is behind. ``source`` is never more than ``depth``
    batches ahead of what was handed out (``pulled - handed <= depth``) and is read by that thread only. An error
    ``source`` raises is raised after the batches pulled before it were handed out. ``close()`` stops the thread
    (after the pull in progress), waits for the copies in flight, drops the host batches and closes ``source``
    (a generator); a prefetcher that is garbage-collected closes itself. ``stats``: a ``DeviceStats`` to add to
    (a loader's, over its epochs). ``on_step``: called on the training thread with the seconds the loop spent
    outside ``next()`` between two batches (its step; not across a marker the source passes through)."""

    def __init__(self, source: Iterator[Any], device: DeviceLike, depth: int = 2,
                 convert: Optional[Callable[[Any], Any]] = None, stats: Optional[DeviceStats] = None,
                 on_step: Optional[Callable[[float], None]] = None) -> None:
        super().__init__(source)
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"device_prefetch (batches in flight) must be an int >= 1, got {depth!r}")
        self.device = torch.device(device)
        self.depth = depth
        self.stats = stats if stats is not None else DeviceStats()
        self._cuda = self.device.type == "cuda"
        if self._cuda and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._stream = torch.cuda.Stream(self.device) if self._cuda else None
        self._producer = _Producer(source, self.device, self._stream, convert, depth)
        self._held: Deque[_InFlight] = collections.deque()  # handed out, host batch kept until copied
        self._started = False
        self._done = False
        self._closed = False
        self.handed = 0
        self._on_step = on_step
        self._handed_at: Optional[float] = None  # when the last batch was handed out (on_step)

    @property
    def pulled(self) -> int:
        """Host batches read from the source so far."""
        return self._producer.pulled

    def __next__(self) -> Any:
        t0, w0 = time.thread_time(), time.perf_counter()
        if self._handed_at is not None and self._on_step is not None:
            self._on_step(w0 - self._handed_at)
        self._handed_at = None
        try:
            if self._closed or self._done:
                raise StopIteration
            if not self._started:
                self._started = True
                self._producer.thread.start()
            item = self._producer.ready.get()
            if item is _END:
                self._done = True
                raise StopIteration
            if isinstance(item, _Failed):
                self._done = True
                raise item.error
            entry: _InFlight = item
            out, entry.out = entry.out, None
            if self._cuda:
                current = torch.cuda.current_stream(self.device)
                current.wait_event(entry.event)  # the training stream waits for this batch only
                for t in tensors_of(out):
                    t.record_stream(current)  # allocated on the side stream, used on the training stream
            self._held.append(entry)
            self._retire()
            self.handed += 1
            self.stats.batches += entry.tensors
            self.stats.bytes += entry.nbytes
            self.stats.staged_batches += entry.staged
            self._producer.room.release()  # the next batch is pulled and copied while the loop's step runs
            if entry.tensors:
                self._handed_at = time.perf_counter()
            return out
        finally:
            self.stats.handout_cpu_s += time.thread_time() - t0
            self.stats.handout_wall_s += time.perf_counter() - w0

    def _retire(self) -> None:
        """Drops the host batches whose copies completed, oldest first; never holds more than ``depth``."""
        while self._held and self._held[0].copied():
            self._held.popleft()
        while len(self._held) > self.depth:
            self._held[0].event.synchronize()
            self._held.popleft()

    def close(self) -> None:
        """Stops the thread, waits for the copies in flight, drops every host batch (releasing their slots) and
        closes the source."""
        if self._closed:
            return
        self._closed = True
        p = self._producer
        p.stop.set()
        if self._started:
            p.room.release()  # a thread waiting for room sees the stop
            if p.thread is not threading.current_thread():  # a collection on that thread: it ends by itself
                p.thread.join()  # after the pull in progress; it closes the source
        else:
            close = getattr(p.source, "close", None)
            if callable(close):
                close()
        if self._stream is not None:
            self._stream.synchronize()
        while not p.ready.empty():
            p.ready.get()
        self._held.clear()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def clear_cuda_error() -> None:
    """Resets the CUDA runtime's last error of this thread after a call that failed and was handled (a refused
    ``cudaHostRegister``, a CUDA IPC handle that did not map), so that torch's next kernel launch check does not
    report it: through the libcudart this process loaded."""
    with contextlib.suppress(OSError):
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart.so" in line}
        for path in sorted(paths):
            with contextlib.suppress(OSError, AttributeError):
                ctypes.CDLL(path).cudaGetLastError()
                return


class PinnedSlots:
    """``SlotMaps`` hooks that register each shared-memory slot mapping as page-locked (pinned) memory once, so
    copies from it are DMA, and unregister it before the mapping goes away. The mappings are read-only:
    ``cudaHostRegisterReadOnly``. A driver that refuses is named once in a warning (the slot and the CUDA
    error); then no more slots are registered and batches go through a pinned staging buffer instead
    (``DevicePrefetcher``)."""

    def __init__(self, stats: Optional[DeviceStats] = None) -> None:
        self.stats = stats if stats is not None else DeviceStats()
        self.refused: Optional[str] = None  # the CUDA error of the first refusal

    def on_map(self, path: str, mm: mmap.mmap) -> Optional[int]:
        if self.refused is not None or len(mm) == 0:
            return None
        ptr = int(np.frombuffer(mm, dtype=np.uint8).ctypes.data)
        flags = _HOST_REGISTER_PORTABLE | _HOST_REGISTER_READ_ONLY
        err = int(torch.cuda.cudart().cudaHostRegister(ptr, len(mm), flags))
        if err != 0:
            clear_cuda_error()
            self.refused = f"{torch.cuda.CudaError(err)} (cudaError {err})"
            self.stats.slots_refused += 1
            warnings.warn(f"unstall: cudaHostRegister refused shared-memory slot {path} ({len(mm)} bytes, read-only): "
                          f"{self.refused}; batches are copied to the device through a pinned staging buffer instead",
                          RuntimeWarning, stacklevel=2)
            return None
        self.stats.slots_registered += 1
        return ptr

    def on_unmap(self, path: str, ptr: Optional[int]) -> None:
        if ptr is None:
            return
        err = int(torch.cuda.cudart().cudaHostUnregister(ptr))
        if err != 0:
            clear_cuda_error()
            warnings.warn(f"unstall: cudaHostUnregister of shared-memory slot {path} failed: "
                          f"{torch.cuda.CudaError(err)} (cudaError {err})", RuntimeWarning, stacklevel=2)
            return
        self.stats.slots_unregistered += 1
