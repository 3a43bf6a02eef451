"""A training-loop stand-in run by test_local_transport.py in a fresh interpreter, as a user's script is:
this process must never use gRPC, so that torch's default ``fork`` start method is the one used.

``python local_job.py SPEC_JSON`` attaches to the sidecar of ``$UNSTALL_HOME`` (its state file), reads
``epochs`` epochs through ``unstall.torch.DataLoader`` and prints one JSON line: what every epoch
yielded (sha256 of each sample, target), the transport, where the payloads of one more fetch lay, how
the workers were started, and the sidecar's counters for the loader's session.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import sys
from pathlib import Path

import unstall
from unstall.client import grpc_used_in_this_process
from unstall.torch import DataLoader, Dataset

STARTED_BY = {}  # set by the main process: a forked worker inherits it, a spawned one re-imports it empty


def digest(sample) -> str:
    assert type(sample) is bytes, type(sample)  # loader=None: the payload as bytes
    return hashlib.sha256(sample).hexdigest()


def keep(batch):
    return batch


def record_worker(out: str, worker_id: int) -> None:
    doc = {"pid": os.getpid(), "ppid": os.getppid(), "started_by": STARTED_BY.get("pid"), "worker": worker_id}
    Path(out, f"worker-{os.getpid()}.json").write_text(json.dumps(doc))


def main(spec: dict) -> dict:
    STARTED_BY["pid"] = os.getpid()
    out = spec["out"]
    ds = Dataset(spec["dataset"], transport=spec.get("transport"))
    kwargs = dict(batch_size=spec.get("batch_size", 4), shuffle=True, seed=spec.get("seed", 0),
                  num_workers=spec["num_workers"], multiprocessing_context=spec.get("context"))
    if spec.get("lambdas"):
        # Not picklable: works only when the workers are forked.
        ds.transform = lambda b: hashlib.sha256(b).hexdigest()
        kwargs.update(collate_fn=lambda batch: [(x, t) for x, t in batch],
                      worker_init_fn=lambda w: record_worker(out, w))
    else:
        ds.transform = digest
        kwargs.update(collate_fn=keep, persistent_workers=spec["num_workers"] > 0 and spec.get("context") == "spawn")
    loader = DataLoader(ds, **kwargs)
    epochs = [[[x, t] for batch in loader for x, t in batch] for _ in range(spec["epochs"])]
    # Where the payloads of one more fetch lie: the cache arena (zero copy) or the reply's staging file.
    batch = ds.fetch_samples(list(range(len(ds))), epoch=spec["epochs"], session=loader.session or 0)
    arenas = [m for m in ds._local._cache_maps.values()] if ds._local is not None else []
    from_cache = sum(1 for p in batch.payloads if any(p.obj is m for m in arenas))
    stats = loader.stats()
    session = unstall.default_sidecar().stats().session(loader.session) if loader.session is not None else None
    return {
        "epochs": epochs,
        "dataset_transport": ds.transport,
        "loader_transport": stats.transport,
        "fetched": {"from_cache_segments": from_cache, "from_stage": len(batch) - from_cache,
                    "transport": batch.transport},
        "session": loader.session,
        "session_stats": session and {"dataset": session.dataset, "name": session.name,
                                      "transport": session.transport, "samples": session.total.samples},
        "context": None if loader.multiprocessing_context is None else type(loader.multiprocessing_context).__name__,
        "default_start_method": multiprocessing.get_start_method(),
        "grpc_used": grpc_used_in_this_process(),
        "pid": os.getpid(),
        "workers": [json.loads(p.read_text()) for p in sorted(Path(out).glob("worker-*.json"))],
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
