"""One rank of test_prep_ranks.py: ``python prep_rank.py SPEC_JSON``.

It joins a gloo process group of ``world`` ranks (a ``file://`` rendezvous) and runs the spec's ``runs`` in order,
each with a new prep loader over the sidecar of ``$UNSTALL_HOME`` (the group is the run's: every rank joins it,
``group_size`` = the world size), which takes its rank and world size from torch.distributed. ``loader`` is
``"prep"`` (a ``PrepLoader``, the sidecar's pipeline, over ``transport``) or ``"transform"`` (a
``SharedTransformLoader`` with ``num_workers`` worker processes), ``window`` optional. A run may first load a job
state (``load``: a JSON file), then does its ``loops``: ``null`` reads a whole ``for``; a list with one int per rank
reads that many batches and stops there (an interruption). ``lockstep``: the ranks meet at every step, as DDP's
gradient allreduce makes them, a rank whose share is read joining in until every rank's is. After loop ``k`` the
ranks' states are gathered with ``dist.all_gather_object`` and rank 0 writes their merge (``merge_states``) to
``<run>-<k>-job.json``, as a checkpoint would be saved. Each rank writes ``<run>-rank<r>.json``: the group's id and
per loop the epoch read, each batch's sample ids and images' digest, and ``state_dict()``; rank 0 adds the group's
``members`` and ``dropped`` once every rank closed its loader.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
from test_prep_support import PIPELINE_NCHW, digest

from unstall import prep
from unstall.elastic import merge_states

BATCH = 4
FINGERPRINT = "ranks-resize16"


def transform() -> Any:
    from torchvision import transforms

    return transforms.Compose([transforms.Resize((16, 16)), transforms.ToTensor()])


def loader_of(run: dict[str, Any], world: int, seed: int) -> Any:
    common = dict(batch_size=BATCH, seed=seed, with_ids=True, group_size=world, epochs=run["epochs"])
    if "window" in run:
        common["window"] = run["window"]
    if run["loader"] == "transform":
        return prep.SharedTransformLoader("imgs", transform(), fingerprint=FINGERPRINT,
                                          num_workers=run.get("num_workers", 0), **common)
    return prep.PrepLoader("imgs", PIPELINE_NCHW, transport=run.get("transport", "auto"), **common)


def step(has_batch: bool) -> bool:
    """Every rank at every step, as DDP's gradient allreduce; a rank whose share is read goes on joining in, as
    ``torch.distributed.algorithms.Join`` does with uneven shares. Whether any rank had a batch."""
    more = torch.tensor([int(has_batch)])
    dist.all_reduce(more)
    return bool(more.item())


def loop(loader: Any, batches: Optional[int], lockstep: bool) -> dict[str, Any]:
    """``state``: taken in the loop after its last batch (after a whole ``for``'s last batch: the epoch's end);
    ``after``: once the loop is over (after a whole ``for``: the next epoch's start, as torchdata's)."""
    epoch, read = loader.epoch, []
    state: Optional[dict[str, Any]] = None
    batches_left = iter(loader)
    while len(read) != batches:
        item = next(batches_left, None)
        if not (step(item is not None) if lockstep else item is not None):
            break
        if item is None:  # this rank's share is read, another rank's is not
            continue
        images, _, ids = item
        read.append([[int(i) for i in ids], digest(images.numpy())])
        state = loader.state_dict()
    after = loader.state_dict()
    return {"epoch": epoch, "batches": read, "state": state if state is not None else after, "after": after}


def main(spec: dict[str, Any]) -> None:
    rank, world, out = int(spec["rank"]), int(spec["world"]), Path(spec["out"])
    dist.init_process_group("gloo", init_method=f"file://{spec['rendezvous']}", rank=rank, world_size=world)
    for run in spec["runs"]:
        loader = loader_of(run, world, int(spec["seed"]))
        if run.get("load"):
            loader.load_state_dict(json.loads(Path(run["load"]).read_text()))
        loops = []
        for k, batches in enumerate(run["loops"]):
            loops.append(loop(loader, batches[rank] if isinstance(batches, list) else batches,
                              bool(run.get("lockstep"))))
            states: list[Any] = [None] * world
            dist.all_gather_object(states, loops[-1]["state"])  # every rank, at the same step
            if rank == 0:
                job = merge_states(states, what="PrepLoader")
                (out / f"{run['name']}-{k}-job.json").write_text(json.dumps(job))
        record: dict[str, Any] = {"group": loader.membership.group, "loops": loops}
        loader.close()
        dist.barrier()  # every rank left this run's group before any joins the next run's
        if rank == 0:
            group = json.loads(loader.membership.client.do_action("prep.stats")[0])["groups"][record["group"]]
            record["closed"] = {k: group[k] for k in ("members", "dropped")}
        (out / f"{run['name']}-rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
