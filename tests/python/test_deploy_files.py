"""The deployment recipes parse and agree with the sidecar: the Kubernetes manifests (deploy/k8s) are valid YAML
whose DaemonSet and headless Service fit together and whose sidecar options exist; the SLURM recipe and the
torchrun example are valid bash."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from unstall.sidecar import find_java

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"


def documents() -> list[dict[str, Any]]:
    docs = [d for f in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d is not None]
    assert docs and all(isinstance(d, dict) and d.get("apiVersion") and d.get("kind") for d in docs)
    return docs


def one(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}"
    return found[0]


def test_the_daemonset_shares_the_hosts_memory_and_joins_through_the_headless_service() -> None:
    ds, svc = one("DaemonSet", "unstall-sidecar"), one("Service", "unstall-cluster")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostIPC"] and pod["hostPID"] and pod["hostNetwork"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    assert svc["spec"]["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert {p["port"] for p in svc["spec"]["ports"]} == {5701, 8816}
    args = pod["containers"][0]["args"]
    members = next(a.split("=", 1)[1] for a in args if a.startswith("--cluster-members="))
    assert members == f"k8s:{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local"
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert host_paths["shm"] == mounts["shm"] == "/dev/shm"
    home = next(a.split("=", 1)[1] for a in args if a.startswith("--home="))
    assert host_paths["home"] == mounts["home"] == home  # trainers find the state file at the same path
    trainer = one("Job", "ddp-example")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in trainer["containers"][0]["env"]}
    assert env["UNSTALL_HOME"] == home and trainer["hostIPC"] and trainer["hostPID"] and trainer["hostNetwork"]
    assert trainer["securityContext"]["runAsUser"] == pod["securityContext"]["runAsUser"]


def test_every_sidecar_option_in_the_daemonset_exists(sidecar_jar: Path) -> None:
    ds = one("DaemonSet", "unstall-sidecar")
    args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "serve"
    usage = subprocess.run([find_java(), "-jar", str(sidecar_jar), "serve", "--help"], capture_output=True, text=True,
                           timeout=60).stdout
    known = set(re.findall(r"--[a-z][a-z-]+", usage))
    assert {a.split("=", 1)[0] for a in args[1:]} <= known


@pytest.mark.parametrize("script", ["deploy/slurm/unstall.sbatch", "examples/torchrun/run.sh"])
def test_shell_recipes_are_valid_bash(script: str) -> None:
    done = subprocess.run(["bash", "-n", str(REPO / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_slurm_recipe_starts_one_sidecar_per_node_from_slurms_node_list() -> None:
    text = (REPO / "deploy" / "slurm" / "unstall.sbatch").read_text()
    assert "--cluster-members auto" in text  # SLURM_JOB_NODELIST, expanded by the sidecar
    assert "UNSTALL_HOME=${TMPDIR:-/tmp}/unstall-$SLURM_JOB_ID" in text  # node-local: one sidecar per node
    assert '!= 600' in text  # the cluster token file is refused unless 0600
