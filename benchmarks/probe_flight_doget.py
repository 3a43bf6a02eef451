"""CPU per MB of a Flight DoGet over loopback, both sides, for a few pyarrow client gRPC options.

Fetches the same ~9.7 MB raw batch (90 cached samples of bench_prep's images: the size of a uint8 prep batch of
64) many times through each client configuration, in interleaved rounds after four warm-up rounds, and prints the
CPU milliseconds per MB received, in this process (the client: pyarrow's gRPC receive and its copy into one
buffer) and in the sidecar (Netty and the kernel's send, which on loopback also runs the receiver's TCP
processing), as medians over the rounds.

    .venv/bin/python benchmarks/probe_flight_doget.py [--calls 30] [--rounds 6]

Needs the sidecar jar (mvn -pl flight-server,sidecar -am package) and the dataset bench_prep makes.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python-shim" / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyarrow.flight as fl  # noqa: E402

import unstall  # noqa: E402

from _cpu import client_server_rounds, print_client_server  # noqa: E402
from bench_prep import probe_arguments, utc_stamp  # noqa: E402

OPTIONS: dict[str, list[tuple[str, Any]]] = {
    "defaults": [],
    "max_frame_size 4 MiB": [("grpc.http2.max_frame_size", 4 << 20)],
    "16 MiB window, no BDP probe": [("grpc.http2.lookahead_bytes", 16 << 20), ("grpc.http2.bdp_probe", 0)],
}


def main() -> None:
    args, data = probe_arguments(__doc__, calls=30, rounds=6)
    ids = list(range(90))
    print(f"# Flight DoGet CPU per MB, {utc_stamp()}; "
          f"{args.rounds} rounds of {args.calls} DoGets per configuration")
    with tempfile.TemporaryDirectory(prefix="unstall-probe-") as home, \
            unstall.Sidecar(home=Path(home), cache_capacity="256MiB") as sc:
        sc.register_dataset("probe", data)
        clients = {}
        for name, opts in OPTIONS.items():
            c = unstall.FlightClient(sc.flight_location, sc.token)
            c._conn, c._pid = fl.FlightClient(sc.flight_location, generic_options=opts), os.getpid()
            clients[name] = c

        def fetches(c: unstall.FlightClient) -> Callable[[], float]:
            def run() -> float:
                return sum(c.fetch("probe", ids).nbytes for _ in range(args.calls)) / 1e6
            return run

        # the four warm-up rounds fill the cache and let the JIT compile
        per = client_server_rounds({n: fetches(c) for n, c in clients.items()}, sc.pid, args.rounds, warmup=4)
        for c in clients.values():
            c.close()
    print_client_server(per, "client options", "MB", digits=2)


if __name__ == "__main__":
    main()
