"""Page-cache tools for benchmarks: evict files, count their resident bytes, and memory cgroups that bound
the page cache a group of processes can use (Linux).

* ``evict(paths)``: ``posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`` on each file. Drops its clean pages from
  the page cache whoever cached them (no root needed), so the next read goes to storage.
* ``resident_bytes(paths)``: bytes of the files in the page cache now (``mmap`` + ``mincore``, as
  util-linux ``fincore`` does). None where the kernel will not say.
* ``MemCgroup.create(name)``: a child memory cgroup of the cgroup this process is in (so every limit
  above still applies), cgroup v1 (``memory.limit_in_bytes``) or v2 (``memory.max``). Processes moved into it
  (``add``) and their children are charged for the anonymous memory they allocate and for the page-cache
  pages they read in. Once the group reaches its limit, the kernel reclaims the group's own page cache
  (there is no swap to push anonymous memory to), so the page cache it can use is the limit minus the
  group's other memory. Pages already cached and charged to another cgroup stay charged there: evict the
  files first. ``probe()`` tells whether that works here, and why not.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import signal
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple, Union

__all__ = ["evict", "resident_bytes", "MemCgroup", "probe"]

PathLike = Union[str, "os.PathLike[str]"]


# -- eviction and residency ------------------------------------------------------------------------

def evict(paths: Iterable[PathLike]) -> int:
    """Drops the files' clean pages from the page cache; returns how many files were advised."""
    n = 0
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += 1
        finally:
            os.close(fd)
    return n


_libc = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
        _libc = lib
    return _libc


def _resident_one(path: PathLike) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        lib = _lib()
        addr = lib.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            raise OSError(ctypes.get_errno(), f"mmap {path}")
        try:
            page = mmap.PAGESIZE
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            if lib.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
            resident = sum(1 for v in bytes(vec) if v & 1)
        finally:
            lib.munmap(addr, size)
        return min(size, resident * page)
    finally:
        os.close(fd)


def resident_bytes(paths: Iterable[PathLike]) -> Optional[int]:
    """Bytes of ``paths`` in the page cache now, or None if mincore is not available."""
    total = 0
    try:
        for p in paths:
            total += _resident_one(p)
    except (OSError, AttributeError):
        return None
    return total


# -- memory cgroups --------------------------------------------------------------------------------

def _mounts() -> List[Tuple[str, str, str, str]]:
    """(root, mount point, fs type, super options) of the cgroup mounts, from /proc/self/mountinfo."""
    out = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            left, right = line.rstrip("\n").split(" - ", 1)
            lf, rf = left.split(), right.split()
            if rf[0] in ("cgroup", "cgroup2"):
                out.append((lf[3], lf[4], rf[0], rf[2] if len(rf) > 2 else ""))
    return out


def _own_memory_cgroup() -> Tuple[Path, int]:
    """The directory of this process's memory cgroup and the cgroup version that controls memory."""
    v1: Dict[str, str] = {}
    v2: Optional[str] = None
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            hid, controllers, path = line.rstrip("\n").split(":", 2)
            if hid == "0" and controllers == "":
                v2 = path
            for c in controllers.split(","):
                v1[c] = path
    mounts = _mounts()
    if "memory" in v1:
        for root, point, fstype, opts in mounts:
            if fstype == "cgroup" and "memory" in opts.split(","):
                rel = v1["memory"]
                if root != "/" and rel.startswith(root):
                    rel = rel[len(root):]
                return Path(point + rel.rstrip("/")) if rel != "/" else Path(point), 1
        raise OSError("the memory controller (cgroup v1) is not mounted")
    if v2 is not None:
        for root, point, fstype, _ in mounts:
            if fstype == "cgroup2":
                rel = v2
                if root != "/" and rel.startswith(root):
                    rel = rel[len(root):]
                d = Path(point + rel.rstrip("/")) if rel != "/" else Path(point)
                if "memory" not in (d / "cgroup.controllers").read_text().split():
                    raise OSError(f"the memory controller is not available in {d} (cgroup v2)")
                return d, 2
    raise OSError("no memory cgroup found in /proc/self/cgroup")


class MemCgroup:
    """A child memory cgroup of this process's own; see the module doc. Remove it with ``remove()``."""

    def __init__(self, path: Path, version: int) -> None:
        self.path = path
        self.version = version

    @classmethod
    def create(cls, name: str) -> "MemCgroup":
        parent, version = _own_memory_cgroup()
        if version == 2:
            # v2: the parent must hand the memory controller to its children. A cgroup with processes in
            # it cannot do that (no internal processes), so this works only where it is already
            # delegated (e.g. a systemd user slice). Untested on the development VM (cgroup v1 there).
            ctl = parent / "cgroup.subtree_control"
            if "memory" not in ctl.read_text().split():
                ctl.write_text("+memory")
        path = parent / name
        path.mkdir()
        g = cls(path, version)
        if version == 1:
            try:  # v1 charges children to parents only with use_hierarchy (always on in recent kernels)
                (path / "memory.use_hierarchy").write_text("1")
            except OSError:
                pass
            try:
                (path / "memory.swappiness").write_text("0")
            except OSError:
                pass
        return g

    def _read(self, name: str) -> str:
        return (self.path / name).read_text()

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def procs(self) -> List[int]:
        try:
            return [int(x) for x in self._read("cgroup.procs").split()]
        except FileNotFoundError:
            return []

    def set_limit(self, nbytes: Optional[int]) -> None:
        """Sets the memory limit (None: unlimited). The kernel reclaims the group's page cache down to it;
        it refuses (EBUSY) when the group's unreclaimable memory alone is above it."""
        if self.version == 1:
            (self.path / "memory.limit_in_bytes").write_text("-1" if nbytes is None else str(int(nbytes)))
        else:
            (self.path / "memory.max").write_text("max" if nbytes is None else str(int(nbytes)))

    def limit(self) -> Optional[int]:
        v = self._read("memory.limit_in_bytes" if self.version == 1 else "memory.max").strip()
        return None if v == "max" or int(v) >= (1 << 62) else int(v)

    def usage(self) -> int:
        return int(self._read("memory.usage_in_bytes" if self.version == 1 else "memory.current"))

    def stat(self) -> Dict[str, int]:
        out = {}
        for line in self._read("memory.stat").splitlines():
            k, _, v = line.partition(" ")
            try:
                out[k] = int(v)
            except ValueError:
                pass
        return out

    def file_bytes(self) -> int:
        """The group's reclaimable page cache: active + inactive file pages (tmpfs/shm is not in them)."""
        s = self.stat()
        if self.version == 1:
            return s.get("total_active_file", s.get("active_file", 0)) + s.get("total_inactive_file",
                                                                              s.get("inactive_file", 0))
        return s.get("active_file", 0) + s.get("inactive_file", 0)

    def peak(self) -> Optional[int]:
        try:
            return int(self._read("memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"))
        except (OSError, ValueError):
            return None

    def reset_peak(self) -> bool:
        """Restarts ``peak()`` (v1: memory.max_usage_in_bytes); False where not done (v2's memory.peak
        resets per open file only)."""
        if self.version != 1:
            return False
        try:
            (self.path / "memory.max_usage_in_bytes").write_text("0")
            return True
        except OSError:
            return False

    def oom_kills(self) -> int:
        try:
            text = self._read("memory.oom_control" if self.version == 1 else "memory.events")
        except OSError:
            return 0
        for line in text.splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                return int(v)
        return 0

    def remove(self, timeout: float = 30.0) -> None:
        """Waits for the group's processes to exit (SIGTERM, then SIGKILL after ``timeout``: they are
        the benchmark's own), then removes the cgroup directory."""
        for sig, wait in ((None, timeout), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            if sig is not None:
                for pid in self.procs():
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
            deadline = time.monotonic() + wait
            while self.procs() and time.monotonic() < deadline:
                time.sleep(0.1)
            if not self.procs():
                break
        else:
            raise OSError(f"cgroup {self.path} still has processes {self.procs()}")
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:  # EBUSY right after the last exit, while the kernel finishes with it
                time.sleep(0.1)
        self.path.rmdir()

    def describe(self) -> str:
        parent = self.path.parent
        if self.version == 1:
            return (f"cgroup v1 memory controller: a child cgroup of this job's own ({parent}/<child>), "
                    f"memory.limit_in_bytes, swappiness 0")
        return f"cgroup v2: a child cgroup of this job's own ({parent}/<child>), memory.max"


def probe(name: str = "") -> Tuple[Optional[MemCgroup], str]:
    """Whether a child memory cgroup with a limit can be made here: (a removed example group, "") or
    (None, why not)."""
    name = name or f"unstall-probe-{os.getpid()}"
    try:
        g = MemCgroup.create(name)
    except Exception as e:  # noqa: BLE001 - any failure means "not usable", with the reason
        return None, f"{type(e).__name__}: {e}"
    try:
        g.set_limit(64 << 20)
        ok = g.limit() == 64 << 20
        g.set_limit(None)
    except Exception as e:  # noqa: BLE001
        g.remove()
        return None, f"setting a limit failed: {type(e).__name__}: {e}"
    g.remove()
    return (g, "") if ok else (None, "the limit did not read back")
