"""The offline bundle as a GPU node gets it: scripts/build_bundle.sh's one file, under 60 MB, installed with the
documented ``pip install --no-index --find-links`` (with nvImageCodec and nvJPEG) into a fresh venv that has
torch, pyarrow and numpy but no py4j or nvImageCodec, with no ``java`` on PATH and neither JAVA_HOME nor
UNSTALL_JAVA. A sidecar started there runs on the bundle's own Java runtime and prepares JPEG and PNG batches
through ``unstall.prep.PrepLoader`` with the native decoder, the same bytes as the checkout's sidecar on the
system's Java; ``decode(device="mixed", backend="nvimgcodec")`` on the CPU decodes the same windows with the
bundle's nvImageCodec as with the checkout's.

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
from typing import Iterator

import pytest

import bundle_node
from datagen import make_image_folder
from fresh_venv import REPO, clean_env, path_without_java

LIMIT = 60 * 1000 * 1000


# What the node lacks and must take from the bundle: py4j, and (the nvimgcodec extra) nvImageCodec and nvJPEG, whose
# files lie among torch's CUDA libraries in nvidia/.
_FROM_BUNDLE = ("py4j", "unstall", "__editable__", "nvidia_nvimgcodec", "nvidia_nvjpeg")
_FROM_BUNDLE_FILES = {"nvidia/__init__.py", "nvidia/__pycache__", "nvidia/nvimgcodec", "nvidia/cu13/lib/libnvjpeg.so.13"}


def _link(src: Path, dst: Path, rel: str = "") -> None:
    """``dst`` as a directory of links to ``src``'s entries, less ``_FROM_BUNDLE_FILES``; a directory holding one of
    them is made of links in turn."""
    dst.mkdir()
    for p in src.iterdir():
        path = f"{rel}{p.name}"
        if path in _FROM_BUNDLE_FILES or (not rel and (p.name.lower().startswith(_FROM_BUNDLE) or p.suffix == ".pth")):
            continue
        if any(f.startswith(path + "/") for f in _FROM_BUNDLE_FILES):
            _link(p, dst / p.name, path + "/")
        else:
            (dst / p.name).symlink_to(p)


def _node_site(tmp_path: Path) -> Path:
    """Links to the dependencies venv's packages, less what the node takes from the bundle: what the GPU node has
    installed."""
    import torch

    node = tmp_path / "node-site"
    _link(Path(torch.__file__).resolve().parents[1], node)
    return node


@pytest.fixture(scope="module")
def bundle(sidecar_jar: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """scripts/build_bundle.sh's one file, built once for this module's tests (removed after them)."""
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run(["bash", str(REPO / "scripts" / "build_bundle.sh"), "--jar", str(sidecar_jar), "--out", str(dist)],
                   check=True, env=clean_env(), stdin=subprocess.DEVNULL)
    (built,) = dist.glob("unstall-offline-*-linux-x86_64.tar.xz")
    yield built
    shutil.rmtree(dist)


@pytest.mark.slow
def test_bundle_installs_offline_and_prepares_on_its_own_java(sidecar_jar: Path, bundle: Path, tmp_path: Path) -> None:
    import unstall

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
                    "install", "--no-compile", "--no-index", "--find-links", directory.name, "unstall",
                    "nvidia-nvimgcodec-cu13", "nvidia-nvjpeg"],
                   check=True, cwd=unpacked, env=clean_env(), stdin=subprocess.DEVNULL)

    images = tmp_path / "images"
    make_image_folder(images, ["cat", "dog", "eel"], per_class=6)  # JPEGs and PNGs
    jpegs = tmp_path / "jpegs"
    for path in sorted(images.rglob("*")):
        if path.suffix.lower() == ".jpg":
            target = jpegs / path.relative_to(images)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
    script = tmp_path / "bundle_node.py"
    shutil.copy(Path(bundle_node.__file__), script)
    path = path_without_java(venv / "bin")
    assert shutil.which("java", path=path) is None
    run = subprocess.run([str(python), str(script), str(images), str(tmp_path / "home"), str(jpegs)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
                         env=clean_env(PATH=path))
    assert run.returncode == 0, f"the node's sidecar failed:\n{run.stderr[-4000:]}"
    out = json.loads(run.stdout.strip().splitlines()[-1])

    # Everything came from the bundle: the shim and py4j installed from it, the sidecar on its runtime.
    assert all(Path(out[m]).is_relative_to(site) for m in ("unstall", "py4j", "nvimgcodec")), out
    assert not any(Path(p).resolve().is_relative_to(REPO) for p in out["sys_path"] if p), out["sys_path"]
    java = site / "unstall" / "_jre" / "bin" / "java"
    assert Path(out["java"]) == java and Path(out["sidecar_exe"]).resolve() == java.resolve()
    assert out["decode"]["decoder"] == "libjpeg-turbo-crop", out["decode"]
    assert "WARN" not in out["log"] and "Exception" not in out["log"], out["log"][-4000:]

    # The same prepared bytes and labels as the checkout's sidecar on the system's Java, every sample once.
    with unstall.Sidecar(home=tmp_path / "reference", jar=sidecar_jar, cache_capacity="16MiB",
                         memory_budget="1GiB") as reference:
        reference.register_dataset("imgs", images)
        reference.register_dataset("jpegs", jpegs)
        with unstall.FlightClient(reference.flight_location, reference.token) as client:
            expected = bundle_node.read_prepared(client)
            expected_roi = bundle_node.read_prepared(client, "jpegs", bundle_node.ROI_PIPELINE)
    from torchvision.datasets import ImageFolder

    labels = sorted(label for _, label in ImageFolder(str(images)).samples)
    assert sorted(expected) == sorted(str(i) for i in range(len(labels)))
    assert sorted(label for _, label in expected.values()) == labels
    assert len({digest for digest, _ in expected.values()}) == len(labels)
    assert out["samples"] == expected
    # The bundle's nvImageCodec, cut down to JPEG, decodes each crop's window as the checkout's full package does.
    assert len(expected_roi) == sum(1 for p in jpegs.rglob("*") if p.is_file()) and out["roi"] == expected_roi
    # Passed: the venv and the unpacked bundle (about 0.6 GB) are not kept in pytest's retained tmp directories.
    shutil.rmtree(venv)
    shutil.rmtree(unpacked)


@pytest.mark.slow
def test_gpu_node_runs_every_part_of_the_prepared_gpu_run_on_the_cpu(bundle: Path, tmp_path: Path) -> None:
    """benchmarks/gpu_node.sh, the one script a GPU session runs with the bundle, end to end at toy size on the CPU:
    it installs the bundle's wheels into a private directory, starts the sidecar on the bundle's Java runtime, runs
    the tests it is given (GPU_NODE_PYTEST), bench_decode_share (GPU_NODE_SHARE), bench_mixed_backends
    (GPU_NODE_MIXED), bench_hybrid (GPU_NODE_HYBRID) and bench_gpu, and writes every file it promises; no row fails
    (exit 0). No figure here is a GPU figure: this guards the script, so that a GPU session's minutes go to
    measuring."""
    out = tmp_path / "out"
    env = clean_env(PYTHON=sys.executable, GPU_NODE_PYTEST="python-shim/tests/test_draws.py", GPU_NODE_PYTEST_TIMEOUT="300",
                    GPU_NODE_SHARE="--toy",
                    GPU_NODE_MIXED="--images 8 --size 64x48 --batch 4 --batches 2 --crop 32 --repeats 2 --variants whole",
                    GPU_NODE_HYBRID="--toy --device cpu")
    run = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_node.sh"), str(bundle), str(out), "resnet18", "--toy",
                          "--device", "cpu"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         stdin=subprocess.DEVNULL, timeout=1200)  # a bound on a hang, not on the speed
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    started = next(line for line in run.stderr.splitlines() if line.startswith("gpu_node: unstall"))
    shim = Path(started.split(" from ")[1].split(";")[0])
    assert "/_jre/" in started and shim.parent.parent.name == "site" and not shim.is_relative_to(REPO), started
    files = sorted(p.name for p in out.iterdir())
    for prefix in ("gpu-resnet18-", "mixed-", "share-", "hybrid-"):
        assert {f.rsplit(".", 1)[1] for f in files if f.startswith(prefix)} >= {"md", "log"}, (prefix, files)
    assert any(f.startswith("gpu-resnet18-") and f.endswith(".json") for f in files), files
    assert len(json.loads(next(out.glob("hybrid-*.json")).read_text())["rows"]) == 3, files
    assert " passed" in (out / "pytest.log").read_text()
    assert (out / "data.log").read_text().splitlines()[-1].endswith("n48-64x48-q75")  # made while the tests ran
    rows = json.loads(next(out.glob("gpu-resnet18-*.json")).read_text())["rows"]
    assert len(rows) > 10 and all(r["error"] is None and r["images_per_s"] > 0 for r in rows), rows
