"""CPU per prep group call: a Flight DoAction from pyarrow against the local socket's PREP frame.

A shared-memory member asks ``prep.next`` once per batch. This probe sends ``prep.heartbeat`` (the same path
through the sidecar, without waiting for a batch) N times each way, after a warm-up so that the sidecar's JIT
has compiled both paths, and prints the CPU seconds each call cost this process (the client) and the sidecar,
per call, as medians over rounds. Interleaved rounds, so drift on this shared machine hits both alike.

    .venv/bin/python benchmarks/probe_prep_rpc.py [--calls 2000] [--rounds 5]

Needs the sidecar jar (mvn -pl flight-server,sidecar -am package) and the dataset bench_prep makes.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python-shim" / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import unstall  # noqa: E402
from unstall import prep  # noqa: E402

from _cpu import client_server_rounds, print_client_server  # noqa: E402
from bench_prep import probe_arguments, utc_stamp  # noqa: E402


def main() -> None:
    args, data = probe_arguments(__doc__, calls=2000, rounds=5)
    print(f"# prep group calls, {utc_stamp()}; "
          f"{args.rounds} rounds of {args.calls} calls each way")
    with tempfile.TemporaryDirectory(prefix="unstall-probe-") as home, unstall.Sidecar(home=Path(home)) as sc:
        sc.register_dataset("probe", data)
        client = unstall.FlightClient(sc.flight_location, sc.token)
        m = prep.join("probe", prep.imagenet_train(224, dtype="uint8"), batch_size=64, client=client,
                      transport="shm")
        local = m._local_client()
        if local is None:
            raise SystemExit("the sidecar named no local socket (no writable /dev/shm?)")
        body = json.dumps({"group": m.group, "member": m.member}).encode()

        def repeated(call: Callable[[], object]) -> Callable[[], float]:
            def run() -> float:
                for _ in range(args.calls):
                    call()
                return args.calls
            return run

        per = client_server_rounds({
            "Flight DoAction (pyarrow, gRPC)": repeated(lambda: client.do_action("prep.heartbeat", body, recover=False)),
            "local socket PREP frame": repeated(lambda: local.prep_action("prep.heartbeat", body)),
        }, sc.pid, args.rounds, warmup=2)  # the two warm-up rounds let the JIT compile both paths
        m.leave()
        client.close()
    print_client_server(per, "way", "call")


if __name__ == "__main__":
    main()
