"""CPU seconds of a set of processes and all their descendants, from /proc (Linux).

    from _cpu import CpuMeter

    with CpuMeter([os.getpid(), sidecar.pid]) as cpu:     # the main process, its workers, the sidecar
        for batch in loader: ...
    print(cpu.seconds, cpu.processes)

What is counted: utime + stime (fields 14 and 15 of ``/proc/<pid>/stat``, all threads of a process) of
every process that is one of ``pids`` or a descendant of one (unless under ``exclude``), from entering the
block to leaving it. A background thread rescans /proc every ``interval`` seconds, so processes started
inside the block (DataLoader workers, a fork server, a sidecar) are counted from zero.

Exact for processes alive at both ends (persistent DataLoader workers, the sidecar). A process that exits
inside the block is counted up to its last scan, and one that starts and exits between two scans is
missed: ``exited`` counts the former, so a report can say its number is a lower bound. Time of the
children a process reaps (cutime/cstime) is deliberately not added: it would double-count the children
already tracked here.

``read_bytes`` is counted alike from ``/proc/<pid>/io`` (bytes the processes made the kernel fetch from
storage, i.e. page-cache misses and their readahead); None where /proc/<pid>/io cannot be read.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass
import resource
import statistics
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Tuple

__all__ = ["CpuMeter", "ProcStat", "proc_stat", "thread_cpu", "machine_busy", "scan", "descendants", "io_read_bytes",
           "self_cpu", "client_server_rounds", "print_client_server"]

_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    comm: str
    ppid: int
    cpu_s: float  # utime + stime, seconds
    start_ticks: int  # starttime (clock ticks after boot): tells a reused pid apart


def _parse(pid: int, text: str) -> ProcStat:
    # comm is in parentheses and may contain spaces or ')': split at the last ')'
    head, rest = text.rsplit(")", 1)
    f = rest.split()  # f[0] is field 3 (state)
    return ProcStat(pid, head.split("(", 1)[1], int(f[1]), (int(f[11]) + int(f[12])) / _TCK, int(f[19]))


def proc_stat(pid: int) -> Optional[ProcStat]:
    """One process's /proc/<pid>/stat, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return _parse(pid, fh.read())
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


def thread_cpu(pid: int) -> Dict[str, float]:
    """CPU seconds of a live process's threads, summed by name with digits dropped (unstall-prep-worker-3 ->
    unstall-prep-worker-; the kernel keeps 15 characters of a name)."""
    out: Dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                st = _parse(int(tid), fh.read())
        except (FileNotFoundError, ProcessLookupError):  # the thread ended
            continue
        name = re.sub(r"[0-9]+", "", st.comm)
        out[name] = out.get(name, 0.0) + st.cpu_s
    return out


def machine_busy() -> Tuple[float, float]:
    """(busy, idle) CPU seconds of the whole machine since boot, all cores, from /proc/stat's ``cpu`` line
    (idle = idle + iowait; steal is left out of both)."""
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:]]
    idle = f[3] + f[4]
    busy = f[0] + f[1] + f[2] + f[5] + f[6]  # user, nice, system, irq, softirq
    return busy / _TCK, idle / _TCK


def scan() -> Dict[int, ProcStat]:
    """Every visible process."""
    out: Dict[int, ProcStat] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            if st is not None:
                out[st.pid] = st
    return out


def io_read_bytes(pid: int) -> Optional[int]:
    """``read_bytes`` of /proc/<pid>/io (storage reads), or None."""
    try:
        with open(f"/proc/{pid}/io") as fh:
            for line in fh:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def descendants(roots: Iterable[int], procs: Dict[int, ProcStat], exclude: Iterable[int] = ()) -> Dict[int, ProcStat]:
    """``roots`` and all their descendants among ``procs``, leaving out ``exclude`` and its subtrees."""
    children: Dict[int, list] = {}
    for st in procs.values():
        children.setdefault(st.ppid, []).append(st.pid)
    skip = set(exclude)
    out: Dict[int, ProcStat] = {}
    todo = [p for p in roots if p is not None]
    while todo:
        pid = todo.pop()
        if pid in skip or pid in out or pid not in procs:
            continue
        out[pid] = procs[pid]
        todo.extend(children.get(pid, ()))
    return out


def _boot_ticks_now() -> float:
    """Now, in the clock ticks after boot that ``starttime`` uses."""
    with open("/proc/uptime") as fh:
        return float(fh.read().split()[0]) * _TCK


class CpuMeter:
    """Context manager: CPU seconds of ``pids`` + descendants while inside the block (see the module doc).

    ``pids`` may hold None (ignored). ``add(pid)`` adds a root later. After the block: ``seconds``,
    ``processes`` (how many were seen), ``exited`` (how many left early: then ``seconds`` is a lower
    bound), ``by_process`` ({"comm[pid]": seconds}).
    """

    def __init__(self, pids: Iterable[Optional[int]], *, exclude: Iterable[Optional[int]] = (),
                 interval: float = 0.5) -> None:
        self.roots = {p for p in pids if p is not None}
        self.exclude = {p for p in exclude if p is not None}
        self.interval = interval
        self.seconds = 0.0
        self.processes = 0
        self.exited = 0
        self.by_process: Dict[str, float] = {}
        self.read_bytes: Optional[int] = 0
        # key (pid, start_ticks) -> [base cpu_s, last cpu_s, comm, base read_bytes, last read_bytes]
        self._seen: Dict[Tuple[int, int], list] = {}
        self._start_ticks = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def add(self, pid: Optional[int]) -> None:
        if pid is not None:
            with self._lock:
                self.roots.add(pid)
            self._sample()

    def _sample(self, first: bool = False) -> set:
        procs = descendants(self.roots, scan(), self.exclude)
        keys = set()
        with self._lock:
            for st in procs.values():
                key = (st.pid, st.start_ticks)
                keys.add(key)
                rb = io_read_bytes(st.pid)
                rec = self._seen.get(key)
                if rec is None:
                    # Alive when we started: count from now. Born since: count all of its time.
                    born_inside = not first and st.start_ticks >= self._start_ticks
                    self._seen[key] = [0.0 if born_inside else st.cpu_s, st.cpu_s, st.comm,
                                       None if rb is None else (0 if born_inside else rb), rb]
                else:
                    rec[1] = st.cpu_s
                    if rb is not None and rec[3] is not None:
                        rec[4] = rb
        return keys

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._sample()
            except Exception:  # a racy /proc read must not kill the meter
                pass

    def __enter__(self) -> "CpuMeter":
        self._start_ticks = _boot_ticks_now() - 1  # starttime has tick resolution
        self._sample(first=True)
        self._thread = threading.Thread(target=self._run, name="cpu-meter", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        alive = self._sample()
        self.seconds = 0.0
        self.by_process = {}
        self.read_bytes = 0
        for key, (base, last, comm, rb0, rb1) in self._seen.items():
            if rb0 is None or rb1 is None or self.read_bytes is None:
                self.read_bytes = None
            else:
                self.read_bytes += max(0, rb1 - rb0)
            d = max(0.0, last - base)
            self.seconds += d
            name = f"{comm}[{key[0]}]"
            self.by_process[name] = self.by_process.get(name, 0.0) + d
        self.processes = len(self._seen)
        self.exited = len(set(self._seen) - alive)


if __name__ == "__main__":  # a quick self-check: a busy child is counted, an excluded one is not
    import subprocess
    import sys

    busy = "import time\nt=time.process_time()\nwhile time.process_time()-t<0.6: pass\ntime.sleep(2)"
    a = subprocess.Popen([sys.executable, "-c", busy])
    b = subprocess.Popen([sys.executable, "-c", busy])
    t0 = time.perf_counter()
    with CpuMeter([os.getpid()], exclude=[b.pid]) as m:
        a.wait()
        b.wait()
    print(f"{m.seconds:.2f} CPU s over {time.perf_counter() - t0:.2f} s wall; {m.by_process}; exited {m.exited}")


def self_cpu() -> float:
    """This process's CPU seconds (all threads), from getrusage."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def client_server_rounds(ways: Mapping[str, Callable[[], float]], server_pid: int, rounds: int,
                         warmup: int) -> Dict[str, List[Tuple[float, float]]]:
    """Runs every way once a round, the ways interleaved so that drift on a shared machine hits them alike; the
    first ``warmup`` rounds (the JIT, caches) are not kept. A way returns how many units it did (calls, MB). Per
    way, one pair a kept round: (this process's CPU ms per unit, ``server_pid``'s CPU ms per unit)."""
    def server() -> float:
        st = proc_stat(server_pid)
        if st is None:
            raise RuntimeError(f"process {server_pid} is gone")
        return st.cpu_s

    per: Dict[str, List[Tuple[float, float]]] = {name: [] for name in ways}
    for rnd in range(warmup + rounds):
        for name, way in ways.items():
            c0, s0 = self_cpu(), server()
            units = way()
            if rnd >= warmup:
                per[name].append(((self_cpu() - c0) / units * 1e3, (server() - s0) / units * 1e3))
    return per


def print_client_server(per: Mapping[str, List[Tuple[float, float]]], first_column: str, unit: str,
                        digits: int = 3) -> None:
    """A markdown table of client_server_rounds: medians, the rounds' min-max in brackets."""
    def cell(xs: List[float]) -> str:
        return f"{statistics.median(xs):.{digits}f} ({min(xs):.{digits}f}-{max(xs):.{digits}f})"

    print()
    print(f"| {first_column} | client CPU ms per {unit} | sidecar CPU ms per {unit} | both |")
    print("|---|---|---|---|")
    for name, pairs in per.items():
        client, server = [p[0] for p in pairs], [p[1] for p in pairs]
        print(f"| {name} | {cell(client)} | {cell(server)} | "
              f"{statistics.median(client) + statistics.median(server):.{digits}f} |")
