"""One rank of test_elastic_ranks.py: ``python elastic_rank.py SPEC_JSON``.

It joins a gloo process group of ``world`` ranks (a ``file://`` rendezvous), attaches to the sidecar of
``$UNSTALL_HOME`` and runs the spec's ``runs`` in order, each with a new ``unstall.torch.DataLoader`` over the
dataset, shuffled (no sampler: the loader's default under torch.distributed, the job-wide order), or with
``"mixture": true`` over the ``Mixture`` of the spec's ``mixture`` (``[[dataset, weight], ...]``), unshuffled as a
mixture is read. A run may first load a state (``load``: a JSON file, the same job state for every rank, or
``{"run": NAME}``: this rank's own state at the end of that earlier run), then does its ``loops``: ``null`` reads a
whole ``for``; an int, or a list with one int per rank, reads that many batches and stops there (an interruption).
After each loop it records the epoch read, the sample ids it was handed (each file's bytes are its id), the size of
each batch and ``state_dict()`` (in the loop after its last batch, and after the loop). Writes
``<run>-rank<r>.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import torch.distributed as dist

from unstall.torch import DataLoader, Dataset, Mixture


def sample_id(payload: memoryview) -> int:
    return int(bytes(payload))


def keep(batch: list) -> list:
    return batch


def loop(loader: DataLoader, batches: Optional[int]) -> dict[str, Any]:
    """``state``: taken in the loop after its last batch (after a whole ``for``'s last batch: the epoch's end);
    ``after``: taken once the loop is over (after a whole ``for``: the next epoch's start, as torchdata's)."""
    epoch, ids, sizes = loader.epoch, [], []
    state: Optional[dict[str, Any]] = None
    for i, batch in enumerate(loader):
        ids.extend(sid for sid, _ in batch)
        sizes.append(len(batch))
        state = loader.state_dict()
        if batches is not None and i + 1 == batches:
            break
    after = loader.state_dict()
    return {"epoch": epoch, "ids": ids, "sizes": sizes, "state": state if state is not None else after,
            "after": after}


def main(spec: dict[str, Any]) -> None:
    rank, world, out = int(spec["rank"]), int(spec["world"]), Path(spec["out"])
    dist.init_process_group("gloo", init_method=f"file://{spec['rendezvous']}", rank=rank, world_size=world)
    ds = Dataset(spec["dataset"], loader=sample_id, transport="shm")
    mix = Mixture([(Dataset(name, loader=sample_id, transport="shm"), w) for name, w in spec["mixture"]])
    ends: dict[str, dict[str, Any]] = {}
    for run in spec["runs"]:
        mixed = bool(run.get("mixture"))
        loader = DataLoader(mix if mixed else ds, batch_size=run["batch_size"], shuffle=not mixed, seed=spec["seed"],
                            num_workers=run.get("num_workers", 0), collate_fn=keep)
        load = run.get("load")
        if isinstance(load, str):
            loader.load_state_dict(json.loads(Path(load).read_text()))
        elif load is not None:
            loader.load_state_dict(ends[load["run"]])
        loops = []
        for batches in run["loops"]:
            loops.append(loop(loader, batches[rank] if isinstance(batches, list) else batches))
        ends[run["name"]] = loops[-1]["state"]
        (out / f"{run['name']}-rank{rank}.json").write_text(json.dumps(loops))
    dist.barrier()  # none leaves the group while another still reads
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
