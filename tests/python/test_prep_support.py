"""Shared parts of the coordinated-prep tests (no tests here): a dataset of real JPEG/PNG files, a real
sidecar process, and group members that run as their own processes (``python test_prep_support.py
member ...``) with real torch or real TensorFlow."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SHIM = REPO / "python-shim" / "src"
if str(SHIM) not in sys.path:
    sys.path.insert(0, str(SHIM))  # this checkout's shim, also in member processes

import numpy as np  # noqa: E402
from waits import wait_until  # noqa: E402

N_SAMPLES = 37  # odd on purpose: the last batch is partial
BATCH = 8
SIZE = 32
PIPELINE_NCHW = {
    "ops": [
        {"op": "decode"},
        {"op": "random_resized_crop", "size": SIZE},
        {"op": "hflip"},
        {"op": "normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
    ],
    "layout": "NCHW",
    "dtype": "float32",
}
PIPELINE_NHWC = dict(PIPELINE_NCHW, layout="NHWC")


def make_images(root: Path, n: int = N_SAMPLES, seed: int = 0, png_every: int = 7) -> Path:
    """``n`` small photo-ish JPEGs (every ``png_every``-th a PNG; 0: none) in 3 class folders."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    for i in range(n):
        w, h = int(rng.integers(48, 120)), int(rng.integers(40, 100))
        img = Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
        d = ImageDraw.Draw(img)
        for _ in range(6):
            x, y = int(rng.integers(0, w)), int(rng.integers(0, h))
            d.rectangle([x, y, x + int(rng.integers(4, 30)), y + int(rng.integers(4, 30))],
                        fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
        cls = root / f"class{i % 3}"
        cls.mkdir(parents=True, exist_ok=True)
        fmt = "PNG" if png_every and i % png_every == 0 else "JPEG"
        img.save(cls / f"img{i:03d}.{'png' if fmt == 'PNG' else 'jpg'}", fmt)
    return root


@dataclass
class PrepEnv:
    """A running sidecar with the test dataset registered as ``imgs``."""

    sidecar: Any
    root: Path
    tmp: Path

    @property
    def location(self) -> str:
        return self.sidecar.flight_location

    def client(self) -> Any:
        import unstall

        return unstall.FlightClient(self.location, self.sidecar.token)

    def stats(self) -> dict[str, Any]:
        with self.client() as c:
            return json.loads(c.do_action("prep.stats")[0])

    def group_stats(self, group: str) -> dict[str, Any]:
        return self.stats()["groups"][group]

    def member(self, out: Path, *args: str) -> subprocess.Popen[bytes]:
        """Starts a member process; it writes its batches (ids and tensor digests) as JSON to ``out``."""
        return start_member(self.location, self.sidecar.token, out, *args)


def start_member(location: str, token: str, out: Path, *args: str, wrap: Sequence[str] = (),
                 env: Optional[dict[str, str]] = None) -> subprocess.Popen[bytes]:
    """A member process of the group at ``location`` (``python test_prep_support.py member ...``), run under
    ``wrap`` (e.g. ``ip netns exec NS``) with ``env`` added to its environment."""
    full = dict(os.environ, PYTHONPATH=str(SHIM), UNSTALL_TOKEN=token, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
                **(env or {}))
    cmd = [*wrap, sys.executable, str(HERE / "test_prep_support.py"), "member", location, str(out), *args]
    return subprocess.Popen(cmd, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def start_env(tmp: Path, java_options: Sequence[str] = (), extra_args: Sequence[str] = ()) -> Iterator[PrepEnv]:
    import pytest
    import unstall
    from unstall.sidecar import find_jar

    try:
        jar = find_jar()
    except unstall.SidecarStartError as e:
        pytest.skip(f"sidecar jar not built: {e}")
    root = make_images(tmp / "imgs")
    sidecar = unstall.Sidecar(home=tmp / "home", jar=jar, cache_capacity="16MiB", memory_budget="1GiB",
                              java_options=list(java_options), extra_args=list(extra_args), start=True)
    try:
        sidecar.register_dataset("imgs", root)
        yield PrepEnv(sidecar, root, tmp)
    finally:
        sidecar.close()


def wait_all(procs: list[subprocess.Popen[bytes]], timeout: float = 240) -> list[str]:
    """Waits for every process; returns their outputs (the test fails on a hang, naming the output)."""
    deadline = time.monotonic() + timeout
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            raise AssertionError(f"member {p.args} hung; output:\n{out.decode(errors='replace')[-3000:]}") from None
        outs.append(out.decode(errors="replace"))
    return outs


def digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Member processes


class RecordingTransform:
    """A transform run in DataLoader worker processes (pickled to them): appends its pid to ``DIR/pids`` per call.
    ``hang``: the first call to create ``DIR/victim`` writes its pid there and blocks (the test kills it);
    ``fail``: every call raises ValueError."""

    def __init__(self, inner: Any, where: str, hang: bool = False, fail: bool = False) -> None:
        self.inner, self.where, self.hang, self.fail = inner, where, hang, fail

    def __call__(self, img: Any) -> Any:
        with open(os.path.join(self.where, "pids"), "a") as f:
            f.write(f"{os.getpid()}\n")
        if self.fail:
            raise ValueError("this transform refuses every image")
        if self.hang:
            try:
                fd = os.open(os.path.join(self.where, "victim"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return self.inner(img)
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            wait_until(lambda: False, "the test to kill this worker", timeout=600)
        return self.inner(img)


def _member(location: str, out: str, framework: str, seed: int, group_size: int, epochs: int,
            member_timeout: float, kill_after: int, layout: str = "NCHW", transport: str = "auto") -> None:
    import unstall
    from unstall import prep

    client = unstall.FlightClient(location, os.environ["UNSTALL_TOKEN"])
    record: dict[str, Any] = {"pid": os.getpid(), "epochs": {}}
    seen = 0
    # UNSTALL_TEST_GATES="8:/tmp/g1,20:/tmp/g2": after its 8th batch the member waits until /tmp/g1 exists (and
    # touches OUT.at8 to say it got there); UNSTALL_TEST_STEP_MS: a pause after every batch.
    gates = {int(n): Path(f) for n, f in (g.split(":", 1) for g in os.environ.get("UNSTALL_TEST_GATES", "").split(",")
                                          if g)}
    step_s = float(os.environ.get("UNSTALL_TEST_STEP_MS", "0")) / 1000

    def note(epoch: int, ids: np.ndarray, images: np.ndarray, labels: np.ndarray) -> None:
        nonlocal seen
        record["epochs"].setdefault(str(epoch), []).append(
            {"ids": [int(i) for i in ids], "digest": digest(images), "labels": [int(v) for v in labels],
             "shape": list(images.shape)})
        seen += 1
        gate = gates.get(seen)
        if gate is not None:  # the test holds the member here (it starts or kills a remote prep worker meanwhile)
            Path(f"{out}.at{seen}").touch()
            wait_until(gate.exists, f"gate {gate}", timeout=240)
        if step_s:
            time.sleep(step_s)  # a slower model's step
        if kill_after and seen >= kill_after:
            Path(out).write_text(json.dumps(record))
            os.kill(os.getpid(), signal.SIGKILL)  # a crash mid-epoch: no leave, no more heartbeats

    join = dict(batch_size=BATCH, seed=seed, group_size=group_size, epochs=epochs, member_timeout=member_timeout,
                join_timeout=120, client=client, window=3, transport=transport)
    if framework == "torch":
        import torch

        model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                    torch.nn.Linear(4, 3))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = prep.PrepLoader("imgs", PIPELINE_NCHW, with_ids=True, **join)
        record["info"] = loader.membership.info
        for _ in range(epochs):
            epoch = loader.epoch
            for images, labels, ids in loader:
                loss = torch.nn.functional.cross_entropy(model(images), labels)  # a real training step
                opt.zero_grad()
                loss.backward()
                opt.step()
                note(epoch, ids.numpy(), images.numpy(), labels.numpy())
    elif framework in ("torch-py", "torch-pyw"):  # Python-side transforms, shared through the group
        import torch
        from torchvision import transforms

        tf_ = transforms.Compose([transforms.RandomResizedCrop(SIZE), transforms.RandomHorizontalFlip(),
                                  transforms.ToTensor(), transforms.Normalize((0.485, 0.456, 0.406),
                                                                              (0.229, 0.224, 0.225))])
        join.pop("transport")
        if framework == "torch-pyw":  # in DataLoader worker processes: UNSTALL_TEST_WORKERS="w:DIR[:hang|:fail]"
            w, where, *mode = os.environ["UNSTALL_TEST_WORKERS"].split(":")
            tf_ = RecordingTransform(tf_, where, hang="hang" in mode, fail="fail" in mode)
            join.update(num_workers=int(w), window=4)
        loader = prep.SharedTransformLoader("imgs", tf_, fingerprint="rrc32-flip-norm", with_ids=True, **join)
        record["info"] = loader.membership.info
        for _ in range(epochs):
            epoch = loader.epoch
            for images, labels, ids in loader:
                note(epoch, ids.numpy(), images.numpy(), labels.numpy())
        record["made"] = loader.made
    else:
        import tensorflow as tf
        import unstall.tf

        ds = unstall.tf.dataset("imgs", PIPELINE_NHWC if layout == "NHWC" else PIPELINE_NCHW, with_ids=True, **join)
        m = unstall.tf.membership(ds)
        record["info"] = m.info
        record["element_spec"] = [str(s) for s in ds.element_spec]
        epoch = m.start_epoch
        for images, labels, ids in ds.prefetch(2):  # epoch 0 by hand, recording what came
            note(epoch, ids.numpy(), images.numpy(), labels.numpy())
        model = tf.keras.Sequential([tf.keras.Input((SIZE, SIZE, 3)), tf.keras.layers.Conv2D(4, 3),
                                     tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(3)])
        model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        rest = epochs - 1
        if rest:
            # Conv2D on CPU wants NHWC: a job that shares the torch (NCHW) group transposes on its side.
            fix = (lambda x: x) if layout == "NHWC" else (lambda x: tf.transpose(x, [0, 2, 3, 1]))
            hist = model.fit(ds.map(lambda x, y, i: (fix(x), y)).prefetch(2), epochs=rest, verbose=0)
            record["fit_loss"] = [float(v) for v in hist.history["loss"]]
    Path(out).write_text(json.dumps(record))


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "member":
        loc, out, fw, seed, gs, ep, mt, ka = sys.argv[2:10]
        _member(loc, out, fw, int(seed), int(gs), int(ep), float(mt), int(ka), *sys.argv[10:12])
