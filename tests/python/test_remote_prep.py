"""Remote prep workers, process level (issue 12): a prep group runs on one "host" (its sidecar and two member
processes training on its batches); a sidecar on a second host started with ``serve --prep-worker`` (a CPU node,
as a user would start one) joins the running group through the cluster's directory, prepares some of its batches,
and leaves: stopped (SIGTERM: it gives its claims back) or killed (SIGKILL: its claims expire and the group's
sidecar prepares them). Every member still sees every batch of every epoch exactly once, and the batches equal
those of the same group run without a worker (the same (seed, epoch, sample) -> the same crops). Hosts are
network namespaces where permitted, loopback addresses otherwise (cluster_hosts.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cluster_hosts import Hosts, make_cluster_certificate
from cluster_rank import Rank
from test_prep_support import BATCH, N_SAMPLES, make_images, start_env, start_member, wait_all
from waits import wait_until

from unstall.sidecar import find_java, java_flags

HERE = Path(__file__).resolve().parent
NUM_BATCHES = -(-N_SAMPLES // BATCH)
EPOCHS = 12
GATE_JOIN = 6  # members hold after their 6th batch until the worker has enlisted
GATE_LEAVE = 30  # ... and after their 30th until it has left (stopped or killed)
SEED = 11


def member(hosts: Hosts, location: str, token: str, out: Path, gates: str) -> subprocess.Popen[bytes]:
    """A member process on host 0: a torch job of the group (2 members, EPOCHS epochs), paced so the worker gets work."""
    return start_member(location, token, out, "torch", str(SEED), "2", str(EPOCHS), "120", "0",
                        wrap=hosts.command(0, []), env={"UNSTALL_TEST_GATES": gates, "UNSTALL_TEST_STEP_MS": "30"})


def at_gate(outs: list[Path], procs: list[subprocess.Popen[bytes]], n: int) -> None:
    """Waits until every member holds at gate n; a member that exited instead fails the test with its output."""
    def there() -> bool:
        for p in procs:
            if p.poll() is not None:
                out = p.stdout.read().decode(errors="replace") if p.stdout else ""
                pytest.fail(f"member {p.pid} exited ({p.returncode}) before gate {n}:\n{out[-4000:]}")
        return all(Path(f"{o}.at{n}").exists() for o in outs)

    wait_until(there, f"the members at gate {n}", timeout=180)


def batches(out: Path) -> dict[str, list[Any]]:
    return json.loads(out.read_text())["epochs"]


def group_of(owner: Rank) -> dict[str, Any]:
    owner.go("stats")
    groups = json.loads(owner.expect("STATS "))["groups"]
    live = [g for g in groups.values() if g["state"] != "closed"]
    return live[0] if live else {}


@pytest.mark.parametrize("leave", ["stop", "crash"])
def test_a_remote_prep_worker_joins_a_running_group_and_leaves(leave: str, tmp_path: Path, sidecar_jar: Path,
                                                               record_property: Any) -> None:
    root = make_images(tmp_path / "imgs")
    token = tmp_path / "cluster-token"
    token.write_text("cluster-" + os.urandom(16).hex() + "\n")
    token.chmod(0o600)
    with Hosts(2) as hosts:
        record_property("hosts", hosts.describe())
        print(f"\nhosts: {hosts.describe()}")
        cert, key = make_cluster_certificate(tmp_path, hosts.addresses)
        members = ",".join(f"{a}:5701" for a in hosts.addresses)

        def cluster_args(k: int) -> list[str]:
            return ["--cluster-members", members, "--cluster-bind", hosts.addresses[k], "--cluster-name",
                    f"unstall-prep-{os.getpid()}", "--cluster-token", str(token), "--peer-tls-cert", str(cert),
                    "--peer-tls-key", str(key), "--peer-tls-ca", str(cert)]

        spec = {"home": str(tmp_path / "home0"), "root": str(root), "jar": str(sidecar_jar),
                "extra_args": [*cluster_args(0), "--prep-claim-timeout", "5"]}
        owner = Rank(0, hosts.command(0, [sys.executable, str(HERE / "prep_owner.py"), json.dumps(spec)]),
                     tmp_path / "owner.log")
        worker_log = tmp_path / "worker.log"
        worker = None
        try:
            location, flight_token = owner.expect("READY").split()
            outs = [tmp_path / f"m{i}.json" for i in range(2)]
            gates = f"{GATE_JOIN}:{tmp_path / 'joined'},{GATE_LEAVE}:{tmp_path / 'left'}"
            procs = [member(hosts, location, flight_token, o, gates) for o in outs]
            at_gate(outs, procs, GATE_JOIN)

            # A CPU node joins while the group runs: `serve --prep-worker` on host 1.
            java = find_java()
            argv = [java, *java_flags(java), "-Xmx384m", "--add-opens=java.base/java.nio=ALL-UNNAMED", "-jar",
                    str(sidecar_jar),
                    "serve", "--port", "0", "--home", str(tmp_path / "home1"), "--cache-capacity", "16MiB",
                    "--memory-budget", "256MiB", "--prep-worker", *cluster_args(1)]
            with open(worker_log, "wb") as log:
                worker = subprocess.Popen(hosts.command(1, argv), stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT)
            wait_until(lambda: group_of(owner).get("workers"), "the worker enlisted in the group", timeout=180)
            (tmp_path / "joined").touch()

            at_gate(outs, procs, GATE_LEAVE)

            def by_worker() -> int:
                return sum(c for n, c in group_of(owner)["batches_prepared_by"].items() if n != "local")

            # the members wait at the gate; a claim the worker holds there is finished and counted meanwhile
            wait_until(lambda: by_worker() > 0, "the worker prepared one of the group's batches", timeout=120)
            during = group_of(owner)
            if leave == "stop":
                worker.send_signal(signal.SIGTERM)  # leaves: its claims go back at once
                assert worker.wait(timeout=60) == 128 + signal.SIGTERM, worker_log.read_text()[-3000:]  # the JVM's way
                assert "unstall sidecar stopped" in worker_log.read_text(), "a clean stop"
            else:
                worker.kill()  # a crashed node: its claims expire (--prep-claim-timeout) and the owner makes them
                worker.wait(timeout=60)
            wait_until(lambda: not group_of(owner).get("workers") or leave == "crash", "the worker gone from the group",
                       timeout=60)
            (tmp_path / "left").touch()

            logs = wait_all(procs, timeout=300)
            assert [p.returncode for p in procs] == [0, 0], logs
        finally:
            if worker is not None and worker.poll() is None:
                worker.kill()
                worker.wait()
            owner.stop()

    with_worker = [batches(o) for o in outs]
    for b in with_worker:
        for e in range(EPOCHS):
            ids = sorted(i for batch in b[str(e)] for i in batch["ids"])
            assert ids == list(range(N_SAMPLES)), f"epoch {e}: every sample exactly once"
            assert len(b[str(e)]) == NUM_BATCHES
    assert with_worker[0] == with_worker[1], "both members got the same batches"
    print(f"batches prepared by, when the worker left: {during['batches_prepared_by']}")

    # Determinism: the same group without any worker makes the very same batches (same ids, same crops).
    env_iter = start_env(tmp_path / "reference")
    env = next(env_iter)
    try:
        ref_out = tmp_path / "ref.json"
        ref = env.member(ref_out, "torch", str(SEED), "1", str(EPOCHS), "120", "0")
        logs = wait_all([ref], timeout=300)
        assert ref.returncode == 0, logs
    finally:
        env_iter.close()
    assert batches(ref_out) == with_worker[0], "a worker's batches are the owner's, crop for crop"
