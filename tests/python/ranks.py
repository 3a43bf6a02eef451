"""Starting the ranks of a cross-process test: one fresh interpreter per rank, all at once, each given its JSON spec
(``python SCRIPT SPEC_JSON``), waited for with a bound, and their logs in the failure when any exits non-zero."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from waits import wait_until

__all__ = ["rank_env", "run_ranks"]

HERE = Path(__file__).parent


def rank_env(**extra: str) -> dict[str, str]:
    """This environment without what would attach a rank to another sidecar or job, with this folder importable."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("UNSTALL_SIDECAR", "UNSTALL_TOKEN", "UNSTALL_CONTROL_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def run_ranks(script: str, specs: Sequence[Mapping[str, Any]], env: Mapping[str, str], logs: Path,
              timeout: float = 300) -> None:
    """Runs ``script`` (in this folder) once per spec, all at the same instant, rank ``k`` with ``LOCAL_RANK=k``; fails
    with the tail of every rank's log (``logs/rank<k>.log``) unless all exit 0."""
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for k, spec in enumerate(specs):
        with (logs / f"rank{k}.log").open("wb") as log:
            procs.append(subprocess.Popen([sys.executable, str(HERE / script), json.dumps(spec)],
                                          env=dict(env, LOCAL_RANK=str(k)), stdout=log, stderr=subprocess.STDOUT))
    try:
        wait_until(lambda: all(p.poll() is not None for p in procs), f"{len(procs)} ranks of {script} to finish",
                   timeout=timeout, interval=0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    tails = "\n".join(f"--- rank {k}:\n" + (logs / f"rank{k}.log").read_text(errors="replace")[-3000:]
                      for k in range(len(procs)))
    assert [p.returncode for p in procs] == [0] * len(procs), tails
