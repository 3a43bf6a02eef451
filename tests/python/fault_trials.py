"""Exactly once under faults: a dataset whose every sample's bytes name its file, and a training loop that
counts what each epoch delivered. Used by test_faults.py and scripts/kill_trials.py."""

from __future__ import annotations

import os
import random
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

from unstall.sidecar import find_java, java_flags, read_state

CLASSES = ("ant", "bee", "cat", "dog")


@dataclass(frozen=True)
class Sample:
    path: str  # relative to the dataset root
    label: int


def make_dataset(root: Path, n: int = 200, size: int = 3000, seed: int = 0) -> dict[bytes, Sample]:
    """``n`` files of ``size`` bytes in ``len(CLASSES)`` class folders, each starting with its own name
    (so bytes identify the file); returns bytes -> the sample they must be delivered as."""
    rng = random.Random(seed)
    files: dict[bytes, Sample] = {}
    for i in range(n):
        label = i % len(CLASSES)
        rel = f"{CLASSES[label]}/{i:05d}.jpg"
        head = f"sample {rel} ".encode()
        data = head + rng.randbytes(size - len(head))
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        files[data] = Sample(rel, label)
    return files


def keep(batch: list[Any]) -> list[Any]:
    """collate_fn that keeps the (bytes, label) pairs."""
    return batch


def count_epoch(batches: Iterable[list[tuple[bytes, int]]], files: dict[bytes, Sample],
                after_batch: Callable[[int], None] = lambda k: None) -> tuple[Counter[str], int]:
    """Counts the samples an epoch delivered, by file; returns (counts, samples whose bytes or label match
    no file). ``after_batch(k)`` runs after the k-th batch (fault injection)."""
    seen: Counter[str] = Counter()
    wrong = 0
    for k, batch in enumerate(batches):
        for payload, label in batch:
            sample = files.get(payload)
            if sample is None or sample.label != label:
                wrong += 1
            else:
                seen[sample.path] += 1
        after_batch(k)
    return seen, wrong


def lost_and_duplicated(seen: Counter[str], files: dict[bytes, Sample]) -> tuple[int, int]:
    """Samples of the dataset not delivered, and deliveries beyond the first of a sample."""
    lost = sum(1 for s in files.values() if seen[s.path] == 0)
    duplicated = sum(c - 1 for c in seen.values() if c > 1)
    return lost, duplicated


def serve_standalone(jar: Path, home: Path, extra: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """A sidecar nobody's ``Sidecar`` started (as a service would run it): shims only attach to it.
    Returns once its state file names it; the caller stops it."""
    home.mkdir(parents=True, exist_ok=True)
    log = open(home / "sidecar.log", "ab")
    java = find_java()
    proc = subprocess.Popen([java, *java_flags(java), "-jar", str(jar), "serve", "--port", "0", "--home", str(home),
                             *extra],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, UNSTALL_HOME=str(home)))
    log.close()
    return proc


def state_pid(home: Path) -> Optional[int]:
    state = read_state(home / "sidecar.json")
    return state.pid if state is not None and state.alive else None
