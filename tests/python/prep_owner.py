"""The group's host in test_remote_prep.py, run on its "host" (a network namespace, or a loopback address): it
starts its sidecar (the shim's embedded one) in the cluster, registers the test images as ``imgs`` and prints
``READY <flight location> <token>``; then answers each ``stats`` line on stdin with ``STATS <prep.stats json>``
until stdin closes. ``python prep_owner.py SPEC_JSON``; ``Rank`` (cluster_rank.py) is the test's side."""

from __future__ import annotations

import json
import sys
from typing import Any

import unstall


def main(spec: dict[str, Any]) -> None:
    sidecar = unstall.Sidecar(home=spec["home"], cache_capacity="16MiB", memory_budget="256MiB", jar=spec["jar"],
                              java_options=["-Xmx384m"], extra_args=spec["extra_args"], startup_timeout=120)
    try:
        sidecar.register_dataset("imgs", spec["root"])
        print(f"READY {sidecar.flight_location} {sidecar.token}", flush=True)
        for line in sys.stdin:
            if line.strip() == "stats":
                with unstall.FlightClient(sidecar.flight_location, sidecar.token) as c:
                    stats = json.loads(c.do_action("prep.stats")[0])
                print(f"STATS {json.dumps(stats)}", flush=True)
    finally:
        sidecar.close()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
