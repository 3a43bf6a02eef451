"""Probe (not a test): how far ``decode(device="mixed")`` lands from the sidecar's CPU path, in uint8 units, over
every pixel of every crop, through a real sidecar; the numbers docs/PREP.md ("Decoding on the GPU") quotes and
tests/python/test_prep_mixed.py bounds. The images and loaders are that test's (12 synthetic JPEGs 97x61 to
1203x901, 4:2:0, 4:4:4 and grayscale; seed 7, batch 4, 2 epochs).

    python benchmarks/probe_mixed_pixels.py [--device cpu|cuda] [--backends torchvision,nvimgcodec]

``--backends``: the mixed path's decode backends measured (``decode(backend=...)``), each against the same CPU run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "python-shim" / "src"), str(HERE.parent / "tests" / "python")]

from test_prep_mixed import _epochs  # noqa: E402
from test_prep_native import _images  # noqa: E402
from test_prep_support import start_env  # noqa: E402

from unstall import prep  # noqa: E402
from unstall.prep.mixed import resolve_backend  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="where the mixed path decodes (cpu: the backends' CPU decoders)")
    ap.add_argument("--backends", default="torchvision,nvimgcodec",
                    help="comma-separated decode backends of the mixed path (default torchvision,nvimgcodec)")
    args = ap.parse_args()
    backends = [resolve_backend(b, args.device.split(":")[0]) for b in args.backends.split(",")]  # "auto": the one that runs here
    cases = {
        "random_resized_crop 48 + hflip": (
            prep.imagenet_train(48, dtype="uint8", layout="NHWC"),
            lambda b: prep.imagenet_train(48, dtype="uint8", layout="NHWC", decode_device="mixed", decode_backend=b)),
        "resize 56 + center_crop 48": (
            prep.Pipeline((prep.decode(), prep.resize(56), prep.center_crop(48)), layout="NHWC", dtype="uint8"),
            lambda b: prep.Pipeline((prep.decode(device="mixed", backend=b), prep.resize(56), prep.center_crop(48)),
                                    layout="NHWC", dtype="uint8")),
    }
    print("| pipeline | device | backend | pixels | mean abs | p99 | p99.9 | max |")
    print("|---|---|---|---|---|---|---|---|")
    tmp = Path(tempfile.mkdtemp(prefix="unstall-mixed-pixels-"))
    for e in start_env(tmp):
        _images(tmp / "jpegs")
        e.sidecar.register_dataset("jpegs", tmp / "jpegs")
        for name, (cpu_pipe, mixed_pipe) in cases.items():
            cpu = _epochs(e, cpu_pipe)
            for backend in backends:
                mixed = _epochs(e, mixed_pipe(backend), args.device)
                d = np.concatenate([np.abs(a.astype(np.int16) - b.astype(np.int16)).ravel()
                                    for ec, em in zip(cpu, mixed) for (_, a, _), (_, b, _) in zip(ec, em)])
                print(f"| {name} | {args.device} | {backend} | {d.size} | {d.mean():.2f} | "
                      f"{np.percentile(d, 99):.0f} | {np.percentile(d, 99.9):.0f} | {d.max()} |", flush=True)


if __name__ == "__main__":
    main()
