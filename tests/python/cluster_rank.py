"""One rank of the partitioned-cache tests (test_cluster.py), run on its "host" (a network namespace, or a
loopback address): it starts its own sidecar (the shim's embedded one) that joins the cluster, and reads
``epochs`` epochs of its DistributedSampler shard through ``unstall.torch.DataLoader``.

``python cluster_rank.py SPEC_JSON``. It talks to the test over lines: it prints ``READY`` once its sidecar
sees the whole cluster, and before each epoch (and once after the last) ``EPOCH e``; then it answers each
``stats`` line on its stdin with ``STATS <json>`` (its sidecar's counters: asked once every rank is at the
barrier, so no other rank is still reading the previous epoch from this sidecar) and goes on at ``go``.
In epoch ``pause_epoch``, after ``pause_after`` batches, it prints
``PAUSED`` and waits for a line again (the test kills a sidecar there). At the end it prints ``DONE <json>``:
the sha256 of every sample of every epoch, each epoch's wall time and the loader's peer hits.

``Rank`` is the other side of these lines, for the test and ``benchmarks/bench_cluster.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import unstall

LINE_TIMEOUT = 240.0  # a bound on a hang, not a timing assertion


class Rank:
    """A rank's process and its stdout lines, read by a thread so that every wait is a bounded queue read."""

    def __init__(self, k: int, argv: list[str], log: Path, env: Optional[dict[str, str]] = None) -> None:
        self.k = k
        self.log = log
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("wb"),
                                     text=True, env=dict(os.environ, **(env or {}), PYTHONPATH=str(Path(__file__).parent)))
        self.lines: queue.Queue[Optional[str]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, prefix: str) -> str:
        """The rest of the next line that starts with ``prefix`` (other lines are skipped)."""
        while True:
            try:
                line = self.lines.get(timeout=LINE_TIMEOUT)
            except queue.Empty:
                raise RuntimeError(f"rank {self.k}: no '{prefix}' within {LINE_TIMEOUT:.0f}s; log {self.log}:\n"
                                   f"{self.tail()}") from None
            if line is None:
                raise RuntimeError(f"rank {self.k} exited ({self.proc.wait()}) before '{prefix}'; log {self.log}:\n"
                                   f"{self.tail()}")
            if line.startswith(prefix):
                return line[len(prefix):].strip()

    def go(self, word: str = "go") -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def rank_argv(spec: dict[str, Any]) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), json.dumps(spec)]


def digest(sample: bytes) -> str:
    return hashlib.sha256(sample).hexdigest()


def keep(batch: list[Any]) -> list[Any]:
    return batch


def say(line: str) -> None:
    print(line, flush=True)


def wait_for_test(sidecar: Optional[unstall.Sidecar] = None, dataset: str = "") -> None:
    """Blocks until the test says ``go``, answering ``stats`` with this sidecar's counters meanwhile."""
    while True:
        line = sys.stdin.readline()
        if not line:
            raise SystemExit("the test closed stdin")
        if line.strip() == "stats" and sidecar is not None:
            say(f"STATS {json.dumps(counters(sidecar, dataset))}")
            continue
        return


def counters(sidecar: unstall.Sidecar, dataset: str) -> dict[str, Any]:
    s = sidecar.stats()
    d = s.dataset(dataset)
    peers = d.served_to_peers
    epochs = sorted(set(d.epochs) | set(peers.epochs if peers else {}))
    return {
        "used_bytes": s.cache.used_bytes,
        "capacity_bytes": s.cache.capacity_bytes,
        "members": s.cluster.members if s.cluster else 1,
        "epochs": {
            str(e): {
                "samples": d.epoch(e).samples, "storage_bytes": d.epoch(e).storage_bytes, "hits": d.epoch(e).hits,
                "peer_hits": d.epoch(e).peer_hits, "peer_fallbacks": d.epoch(e).peer_fallbacks,
                "peer_storage_bytes": peers.epoch(e).storage_bytes if peers else 0,
            }
            for e in epochs
        },
    }


def main(spec: dict[str, Any]) -> None:
    from torch.utils.data import DistributedSampler

    from unstall.torch import DataLoader, Dataset

    sidecar = unstall.Sidecar(home=spec["home"], cache_capacity=spec["cache_capacity"],
                              memory_budget=spec["memory_budget"], jar=spec["jar"], java_options=spec["java_options"],
                              extra_args=spec["extra_args"], startup_timeout=120)
    name = spec["dataset"]
    ds = Dataset(name, root=spec["root"], sidecar=sidecar, transform=digest)
    # The cluster forms as the ranks start: wait (bounded) until this sidecar sees every member, settled.
    deadline = time.monotonic() + 120
    while True:
        s = sidecar.stats()
        if s.cluster is not None and s.cluster.members == spec["ranks"] and s.cluster.settled:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"rank {spec['rank']}: the cluster did not form: {s.cluster}")
        time.sleep(0.2)
    say("READY")
    wait_for_test()
    sampler = DistributedSampler(ds, num_replicas=spec["ranks"], rank=spec["rank"], shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=spec["batch_size"], sampler=sampler, num_workers=0, collate_fn=keep)
    epochs: list[list[str]] = []
    seconds: list[float] = []
    peer_hits: list[int] = []
    for e in range(spec["epochs"]):
        say(f"EPOCH {e}")
        wait_for_test(sidecar, name)
        loader.set_epoch(e)
        got: list[str] = []
        t0 = time.monotonic()
        for b, batch in enumerate(loader):
            got.extend(x for x, _ in batch)
            if e == spec.get("pause_epoch") and b + 1 == spec.get("pause_after"):
                say("PAUSED")
                wait_for_test()
        seconds.append(time.monotonic() - t0)
        epochs.append(got)
        peer_hits.append(loader.stats().peer_hits or 0)
    say(f"EPOCH {spec['epochs']}")
    wait_for_test(sidecar, name)
    say(f"DONE {json.dumps({'epochs': epochs, 'seconds': seconds, 'peer_hits': peer_hits})}")
    sidecar.close()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
