"""The offline bundle as a GPU node gets it: scripts/build_bundle.sh's one file, under 60 MB, installed with the
documented ``pip install --no-index --find-links`` into a fresh venv that has torch, pyarrow and numpy but no
py4j, with no ``java`` on PATH and neither JAVA_HOME nor UNSTALL_JAVA. A sidecar started there runs on the
bundle's own Java runtime and prepares JPEG and PNG batches through ``unstall.prep.PrepLoader`` with the native
decoder, the same bytes as the checkout's sidecar on the system's Java.

The node's packages are the dependencies venv's, seen through a ``.pth`` to a directory of links to them that
leaves out py4j and any unstall, so pip finds torch's neighbours installed and must take py4j from the bundle.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import bundle_node
from datagen import make_image_folder
from fresh_venv import REPO, clean_env, path_without_java

LIMIT = 60 * 1000 * 1000


def _node_site(tmp_path: Path) -> Path:
    """Links to the dependencies venv's packages, less py4j and unstall: what the GPU node has installed."""
    import torch

    deps = Path(torch.__file__).resolve().parents[1]
    node = tmp_path / "node-site"
    node.mkdir()
    for p in deps.iterdir():
        if not p.name.lower().startswith(("py4j", "unstall", "__editable__")) and p.suffix != ".pth":
            (node / p.name).symlink_to(p)
    return node


@pytest.mark.slow
def test_bundle_installs_offline_and_prepares_on_its_own_java(sidecar_jar: Path, tmp_path: Path) -> None:
    import unstall

    dist = tmp_path / "dist"
    subprocess.run(["bash", str(REPO / "scripts" / "build_bundle.sh"), "--jar", str(sidecar_jar), "--out", str(dist)],
                   check=True, env=clean_env(), stdin=subprocess.DEVNULL)
    (bundle,) = dist.glob("unstall-offline-*-linux-x86_64.tar.xz")
    assert bundle.stat().st_size < LIMIT, f"{bundle.name} is {bundle.stat().st_size} bytes"

    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "zz-node-site.pth").write_text(f"{_node_site(tmp_path)}\n")

    # The README's install: unpack, then pip from the unpacked directory alone.
    unpacked = tmp_path / "node"
    unpacked.mkdir()
    with tarfile.open(bundle) as tar:
        tar.extractall(unpacked, filter="data")
    (directory,) = unpacked.iterdir()
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "-q", "--disable-pip-version-check",
                    "install", "--no-compile", "--no-index", "--find-links", directory.name, "unstall"],
                   check=True, cwd=unpacked, env=clean_env(), stdin=subprocess.DEVNULL)

    images = tmp_path / "images"
    make_image_folder(images, ["cat", "dog", "eel"], per_class=6)  # JPEGs and PNGs
    script = tmp_path / "bundle_node.py"
    shutil.copy(Path(bundle_node.__file__), script)
    path = path_without_java(venv / "bin")
    assert shutil.which("java", path=path) is None
    run = subprocess.run([str(python), str(script), str(images), str(tmp_path / "home")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
                         env=clean_env(PATH=path))
    assert run.returncode == 0, f"the node's sidecar failed:\n{run.stderr[-4000:]}"
    out = json.loads(run.stdout.strip().splitlines()[-1])

    # Everything came from the bundle: the shim and py4j installed from it, the sidecar on its runtime.
    assert Path(out["unstall"]).is_relative_to(site) and Path(out["py4j"]).is_relative_to(site), out
    assert not any(Path(p).resolve().is_relative_to(REPO) for p in out["sys_path"] if p), out["sys_path"]
    java = site / "unstall" / "_jre" / "bin" / "java"
    assert Path(out["java"]) == java and Path(out["sidecar_exe"]).resolve() == java.resolve()
    assert out["decode"]["decoder"] == "libjpeg-turbo-crop", out["decode"]
    assert "WARN" not in out["log"] and "Exception" not in out["log"], out["log"][-4000:]

    # The same prepared bytes and labels as the checkout's sidecar on the system's Java, every sample once.
    with unstall.Sidecar(home=tmp_path / "reference", jar=sidecar_jar, cache_capacity="16MiB",
                         memory_budget="1GiB") as reference:
        reference.register_dataset("imgs", images)
        with unstall.FlightClient(reference.flight_location, reference.token) as client:
            expected = bundle_node.read_prepared(client)
    from torchvision.datasets import ImageFolder

    labels = sorted(label for _, label in ImageFolder(str(images)).samples)
    assert sorted(expected) == sorted(str(i) for i in range(len(labels)))
    assert sorted(label for _, label in expected.values()) == labels
    assert len({digest for digest, _ in expected.values()}) == len(labels)
    assert out["samples"] == expected
    # Passed: the venv and the unpacked bundle (about 0.6 GB) are not kept in pytest's retained tmp directories.
    shutil.rmtree(venv)
    shutil.rmtree(unpacked)
    shutil.rmtree(dist)
