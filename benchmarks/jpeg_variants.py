"""Derived JPEG sets for the C-only native prep benchmark (flight-server/src/test/c/native_prep_bench.sh): the first
N of bench_prep's generated images, blurred and saved again by PIL as smoother q75 baseline JPEGs (closer to
photographs' bits per pixel) and as progressive q85 JPEGs. Not a test; docs/BENCHMARKS.md, "Prep micro-benchmarks".

    python benchmarks/jpeg_variants.py [--src DIR] [--out /tmp/jpeg-variants] [--n 320]
    REINDEX_SPAN=32 flight-server/src/test/c/native_prep_bench.sh "/tmp/jpeg-variants/q75/*/*.jpg" 2
"""

from __future__ import annotations

import argparse
from pathlib import Path

VARIANTS = {  # name: (PIL save options, Gaussian blur radius)
    "q75": ({"quality": 75}, 1.2),
    "prog": ({"quality": 85, "progressive": True}, 0.8),
}


def main() -> None:
    from PIL import Image, ImageFilter

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=Path.home() / ".cache" / "unstall" / "bench-prep" / "n1280")
    ap.add_argument("--out", type=Path, default=Path("/tmp/jpeg-variants"))
    ap.add_argument("--n", type=int, default=320)
    args = ap.parse_args()
    src = sorted(args.src.glob("*/*.jpg"))[:args.n]
    if not src:
        raise SystemExit(f"no JPEGs under {args.src}/*/ (run benchmarks/bench_prep.py once to generate them)")
    for name, (options, blur) in VARIANTS.items():
        out = args.out / name / "c0"
        out.mkdir(parents=True, exist_ok=True)
        total = 0
        for i, p in enumerate(src):
            q = out / f"{i:04d}.jpg"
            Image.open(p).convert("RGB").filter(ImageFilter.GaussianBlur(blur)).save(q, "JPEG", **options)
            total += q.stat().st_size
        print(f"{name}: {len(src)} JPEGs in {out}, {total / len(src) / 1000:.1f} KB on average")


if __name__ == "__main__":
    main()
