"""A training loop that checkpoints its loader and is killed, run by test_resume.py in a fresh interpreter.

``python resume_job.py SPEC_JSON`` attaches to the sidecar of ``$UNSTALL_HOME`` (DataLoader) or to the
Flight location in the spec (prep group), reads ``epochs`` epochs and records every sample it is handed
as ``[epoch, id, sha256 of its bytes]``. With ``restore`` it first loads the ``torch.save``d checkpoint
there (``loader.load_state_dict``) and reads from where it left off. With ``kill_at = [epoch, batch]`` it
saves ``{"loader": loader.state_dict(), "seen": [...]}`` with ``torch.save`` after handing that batch to
the loop, then SIGKILLs itself (no clean shutdown: its workers are mid-prefetch). Otherwise it prints one
JSON line: what it saw, the loader's state at the end and the sidecar's count of samples it fetched.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
from typing import Any, Iterator, List, Sequence, Tuple

import torch

import unstall
from unstall import prep
from unstall.torch import DataLoader, Dataset, EpochIndex


class Recorded(Dataset):
    """Each item is ``(id, sha256 of the payload, target)``: the id the sampler drew, the bytes served."""

    def __getitems__(self, indices: Sequence[EpochIndex]) -> List[Tuple[int, str, Any]]:  # type: ignore[override]
        items = super().__getitems__(indices)
        return [(ix.index, sample, target) for ix, (sample, target) in zip(indices, items)]


def sha(payload: memoryview) -> str:
    return hashlib.sha256(payload).hexdigest()


def keep(batch: list) -> list:
    return batch


Batches = Iterator[Tuple[int, int, List[Tuple[int, str]]]]


def epochs(loader: Any, total: int) -> Iterator[Tuple[int, int]]:
    """``(epoch, index of its first batch)`` of each ``for`` left until ``total`` epochs (a restored loader
    continues an epoch: its state says how many batches of it were handed out before)."""
    while loader.epoch < total:
        state = loader.state_dict()  # after an epoch's last batch it may name that epoch (its end)
        yield loader.epoch, state["batches_yielded"] if state["epoch"] == loader.epoch else 0


def loader_batches(spec: dict) -> Tuple[Any, Batches]:
    """The loader and, per batch handed to the loop, ``(epoch, batch index, [(id, sha), ...])``."""
    if spec["kind"] == "dataloader":
        ds = Recorded(spec["dataset"], loader=sha, transport="shm")
        seed = spec.get("seed")
        loader: Any = DataLoader(ds, batch_size=spec["batch_size"], shuffle=True, num_workers=spec["num_workers"],
                                 collate_fn=keep, **({"seed": seed} if seed is not None else {}))

        def dl() -> Batches:
            for epoch, first in epochs(loader, spec["epochs"]):
                for b, batch in enumerate(loader, first):
                    yield epoch, b, [(i, h) for i, h, _ in batch]

        return loader, dl()
    client = unstall.FlightClient(spec["location"], os.environ["UNSTALL_TOKEN"])
    loader = prep.PrepLoader(spec["dataset"], spec["pipeline"], batch_size=spec["batch_size"], seed=spec["seed"],
                             epochs=spec["epochs"], client=client, with_ids=True, window=2,
                             member_timeout=spec.get("member_timeout", 30))

    def pl() -> Batches:
        for epoch, first in epochs(loader, spec["epochs"]):
            for b, (images, _labels, ids) in enumerate(loader, first):  # the prepared tensors' bytes
                rows = [hashlib.sha256(x.numpy().tobytes()).hexdigest() for x in images]
                yield epoch, b, list(zip(ids.tolist(), rows))

    return loader, pl()


def main(spec: dict) -> dict:
    seen: List[List[Any]] = []
    loader, batches = loader_batches(spec)
    if spec.get("restore"):
        loader.load_state_dict(torch.load(spec["restore"])["loader"])
    for epoch, b, items in batches:
        seen.extend([epoch, i, h] for i, h in items)
        if [epoch, b] == spec.get("kill_at"):
            torch.save({"loader": loader.state_dict(), "seen": seen}, spec["checkpoint"])
            os.kill(os.getpid(), signal.SIGKILL)
    out: dict = {"seen": seen, "state": loader.state_dict()}
    if spec["kind"] == "dataloader":
        out["session_samples"] = unstall.default_sidecar().stats().session(loader.session).total.samples
    else:
        out["group"] = loader.membership.group
        loader.close()
    return out


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
