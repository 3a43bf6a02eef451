#!/usr/bin/env python3
"""decode(device="mixed")'s two backends on the same raw batches (no sidecar, no model): images/s of each.

Usage:
    python benchmarks/bench_mixed_backends.py [--device cpu|cuda] [--batch 64] [--batches 8] [--crop 224]
        [--repeats 4] [--images 512] [--size 500x375] [--jpeg q75] [--data DIR] [--variants whole,hw0,hw65,hw100]
        [--json PATH]

The same JPEGs (bench_gpu.py's generated photos, or ``--data``) go through ``MixedDecode`` (the code
``PrepLoader(device=...)`` runs on each raw batch: ``imagenet_train(crop)``'s RandomResizedCrop + flip, uint8 NHWC)
once with ``backend="torchvision"`` (whole images decoded) and once with ``backend="nvimgcodec"`` (only each
sample's window decoded), in ABBA order, each pass over the same ``--batches`` batches of ``--batch``. The table
gives images/s per backend, their ratio, this process's busy cores (CPU seconds / wall seconds: on CUDA, the host
Huffman decode nvJPEG leaves to the CPU for small JPEGs) and the share of each image's pixels the windows hold
(what a region decode can save at most). ``--variants`` adds nvImageCodec rows to the same rotation: ``whole``
(``roi=False``), ``hwN`` (``hw_decoder_load=N/100``: the GPU's hardware JPEG engine's share). A second table
times the nvImageCodec backend's batched resampling three ways on the same decoded windows: one ``roi_align`` per
stack of windows of like sizes (what ``RoiDecode`` does on CUDA: ``stack_groups``), one over a single stack padded to
the largest window, and one per window (what it does on the CPU). Last, the host's checks before the decode
(``MixedDecode._check``) per image, on rows the sidecar does not vouch for and on rows it does (their headers packed
here from ``jpeg_rules``' answer, which is the sidecar's: flight-server's ImageHeaderTest, tests/python/
test_prep_mixed_vouched.py). On a CPU the decoders are libjpeg-turbo on this process's threads: a CPU figure, not a
GPU one."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_gpu import add_photo_options, dataset_dir, git_commit, gpu_name, raw_batches, sync  # noqa: E402
from _report import header  # noqa: E402

BACKENDS = ("torchvision", "nvimgcodec")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="torch device the mixed path decodes on (default cpu)")
    ap.add_argument("--batch", type=int, default=64, help="samples per batch (default 64)")
    ap.add_argument("--batches", type=int, default=8, help="batches per pass (default 8)")
    ap.add_argument("--crop", type=int, default=224, help="RandomResizedCrop's size (default 224)")
    ap.add_argument("--repeats", type=int, default=4, help="passes of each backend, in ABBA order (default 4)")
    add_photo_options(ap, "default 512", "default 500x375", 512, "500x375")
    ap.add_argument("--variants", default="", help="comma-separated nvImageCodec variants to add: whole (roi=False), "
                    "hwN (hw_decoder_load=N/100), e.g. whole,hw0,hw65,hw100")
    ap.add_argument("--sidecar-jar", type=Path, default=HERE.parent / "sidecar" / "target" / "unstall-sidecar.jar",
                    help="the sidecar jar whose header read (HeaderRead.java) is timed over the same files beside the "
                    "host's checks (default sidecar/target/unstall-sidecar.jar; skipped with a line saying so when it "
                    "or java is missing)")
    ap.add_argument("--json", type=Path, help="also write the rows and the run's header as JSON")
    args = ap.parse_args(argv)
    try:
        args.variants = {v: variant_op(v) for v in args.variants.split(",") if v}
    except ValueError as e:
        ap.error(f"--variants: {e}")
    for key in ("batch", "batches", "crop", "repeats", "images"):
        if getattr(args, key) < 1:
            ap.error(f"--{key} must be at least 1, got {getattr(args, key)}")
    return args


def variant_op(name: str) -> dict[str, Any]:
    """The decode op's extra keys of a ``--variants`` name."""
    if name == "whole":
        return {"roi": False}
    if name.startswith("hw") and name[2:].isdigit() and int(name[2:]) <= 100:
        return {"hw_decoder_load": int(name[2:]) / 100}
    raise ValueError(f"unknown variant {name!r} (whole, hw0..hw100)")


def timed(dev: Any, passes: int, run: Callable[[], None]) -> List[float]:
    out = []
    for _ in range(passes):
        sync(dev)
        t0 = time.perf_counter()
        run()
        sync(dev)
        out.append(time.perf_counter() - t0)
    return out


def sidecar_read(jar: Path, files: Sequence[Path], rounds: int) -> Any:
    """The sidecar's header read, us per image, per round (``HeaderRead.java`` on ``jar``), or why it did not run."""
    java = shutil.which("java")
    if java is None or not jar.is_file():
        return f"not measured ({'java is not on PATH' if java is None else f'{jar} is missing'})"
    out = subprocess.run([java, "-cp", str(jar), str(HERE / "HeaderRead.java"), str(max(3, rounds)),
                          *map(str, files)], capture_output=True, text=True, check=True).stdout
    return [float(line.split()[1]) for line in out.splitlines() if line.strip()]


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    import torch

    from unstall import prep
    from unstall.prep.mixed import MixedDecode
    from unstall.prep.mixed_parts import image_header
    from unstall.prep.nvimgcodec_decode import STACK_SLACK, stack_groups

    dev = torch.device(args.device)
    data = dataset_dir(args)
    files = sorted(p for p in data.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    need = args.batch * args.batches
    if len(files) < need:
        raise SystemExit(f"{data}: {len(files)} JPEGs, fewer than {args.batches} batches of {args.batch}")
    raw = raw_batches(data, args.batch, args.batches)  # each row's bytes, and the header the sidecar vouches for
    batches = [(p, ids) for p, ids, _ in raw]
    keys = [""] * args.batch
    def decoder(backend: str, extra: dict[str, Any]) -> MixedDecode:
        ops = [dict(o) for o in prep.imagenet_train(args.crop, dtype="uint8", layout="NHWC", decode_device="mixed",
                                                    decode_backend=backend).ops]
        ops[0].update(extra)
        return MixedDecode(ops, "uint8", "NHWC", dev)

    decoders = {b: decoder(b, {}) for b in BACKENDS}
    decoders.update({f"nvimgcodec {v}": decoder("nvimgcodec", extra) for v, extra in args.variants.items()})
    names = list(decoders)

    def one_pass(backend: str) -> Callable[[], None]:
        def run() -> None:
            for p, ids in batches:
                decoders[backend](p, ids, 0, 7, keys)
        return run

    for b in names:  # warm-up: allocations, decoder state
        one_pass(b)()
    order = [b for _ in range(args.repeats // 2) for b in names + names[::-1]] + (names if args.repeats % 2 else [])
    seconds: dict[str, List[float]] = {b: [] for b in names}
    cpu: dict[str, float] = {b: 0.0 for b in names}
    for b in order:
        c0 = time.process_time()
        seconds[b] += timed(dev, 1, one_pass(b))
        cpu[b] += time.process_time() - c0
    rows = [{"backend": b, "images_per_s": need * len(seconds[b]) / sum(seconds[b]),
             "runs": [need / s for s in seconds[b]], "busy_cores": cpu[b] / sum(seconds[b])} for b in names]
    ratio = rows[1]["images_per_s"] / rows[0]["images_per_s"]

    roi = decoders["nvimgcodec"]._roi
    mixed = decoders["nvimgcodec"]
    area, region = [], []
    windows = []
    for p, ids in batches:
        images, rois, boxes = roi.windows(p, ids, keys, lambda sizes, ids=ids: mixed.boxes(sizes, ids, 0, 7))
        windows.append((images, rois))
        for b, im, (_, w, h) in zip(boxes, images, [image_header(x.numpy()) for x in p]):
            area.append(b.h * b.w / (h * w))
            region.append(int(im.shape[0]) * int(im.shape[1]) / (h * w))

    def padded() -> None:
        for images, rois in windows:
            mixed._resample(roi.stack(images), rois, args.crop, args.crop)

    def grouped() -> None:
        for images, rois in windows:
            for stack, group_rois, _ in roi.stacked(images, rois):
                mixed._resample(stack, group_rois, args.crop, args.crop)

    def per_window() -> None:
        for images, rois in windows:
            for im, r in zip(images, rois):
                mixed._resample(im.permute(2, 0, 1)[None], [r], args.crop, args.crop)

    resample: dict[str, List[float]] = {}
    shapes = [[(int(im.shape[0]), int(im.shape[1])) for im in images] for images, _ in windows]
    grouping = [stack_groups(batch) for batch in shapes]
    groups = [len(g) for g in grouping]

    def padded_pixels(batch: List[Any], members: List[int]) -> int:  # a stack's: its tallest, widest, edge included
        return (max(batch[k][0] for k in members) + 1) * (max(batch[k][1] for k in members) + 1) * len(members)

    own = sum((h + 1) * (w + 1) for batch in shapes for h, w in batch)
    padding = {"one padded stack": sum(padded_pixels(b, list(range(len(b)))) for b in shapes) / own,
               "stacks of like windows": sum(padded_pixels(b, g) for b, gs in zip(shapes, grouping) for g in gs) / own}
    ways = (("one roi_align per stack of like windows", grouped), ("one roi_align over a padded stack", padded),
            ("one roi_align per window", per_window))
    for _, run in ways:  # warm-up
        run()
    for name, run in (*ways, *ways[::-1]):
        resample.setdefault(name, []).extend(timed(dev, 1, run))

    def checks() -> None:  # the host's work before any decoder: formats, caps, the sidecar's JPEG structure rules
        for p, ids in batches:
            for x, i in zip(p, ids):
                mixed._check(x, i, "")

    vouched_arrays = [hs for _, _, hs in raw]

    def vouched_checks() -> None:  # the same, each batch with its headers as it carries them (formats and caps)
        for (p, ids), hs in zip(batches, vouched_arrays):
            mixed.heads(p, ids, keys, hs)

    check_s: List[float] = []
    vouched_s: List[float] = []
    checks()  # warm-up
    vouched_checks()
    for _ in range(args.repeats):
        for run, secs in ((checks, check_s), (vouched_checks, vouched_s)):
            t0 = time.perf_counter()
            run()
            secs.append(time.perf_counter() - t0)

    sizes = [[(h, w) for _, w, h in map(image_header, (x.numpy() for x in p))] for p, _ in batches]

    def draws() -> None:  # each sample's window and flip (the device path's draws, a batch at a time)
        for (_, ids), hw in zip(batches, sizes):
            mixed.boxes(hw, ids, 0, 7)

    draw_s = [timed(torch.device("cpu"), 1, draws)[0] for _ in range(args.repeats + 1)][1:]
    sidecar_us = sidecar_read(args.sidecar_jar, files[:need], args.repeats)

    head = header() + [f"- device: {args.device} ({gpu_name(dev)}), torch threads {torch.get_num_threads()}",
                       f"- commit: {git_commit()}",
                       f"- {args.batches} batches of {args.batch} from {data}, RandomResizedCrop {args.crop} + flip, "
                       f"uint8 NHWC; each backend {args.repeats} passes, ABBA, after one warm-up pass"]
    lines = ["# decode(device='mixed') backends on the same batches", "", *head, "",
             "| backend | images/s | of torchvision's | busy cores | each pass |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['backend']} | {r['images_per_s']:,.0f} | {r['images_per_s'] / rows[0]['images_per_s']:.2f}x "
                     f"| {r['busy_cores']:.1f} | {', '.join(f'{v:,.0f}' for v in r['runs'])} |")
    lines += ["", f"nvimgcodec / torchvision: **{ratio:.2f}x** images/s; the windows hold "
              f"{statistics.mean(area):.0%} of their images' pixels on average (the regions decoded: "
              f"{statistics.mean(region):.0%})", "",
              f"The windows of a batch fall into {statistics.mean(groups):.1f} stacks of like sizes on average "
              f"(stack_groups, at most {STACK_SLACK}x their pixels each): the stacks hold "
              f"{padding['stacks of like windows']:.2f}x the windows' pixels, one stack padded to the largest window "
              f"{padding['one padded stack']:.2f}x.", "",
              "| nvimgcodec resampling, same decoded windows | ms per batch | each pass, ms per batch |", "|---|---|---|"]
    for name, secs in resample.items():
        per = [1e3 * s / args.batches for s in secs]
        lines.append(f"| {name} | {statistics.mean(per):.1f} | {', '.join(f'{v:.1f}' for v in per)} |")
    check_ms = statistics.mean(1e3 * s / args.batches for s in check_s)
    vouched_ms = statistics.mean(1e3 * s / args.batches for s in vouched_s)
    vouched = sum(int((hs >= 0).sum()) for hs in vouched_arrays)
    lines += ["", f"The host's checks before the decode (formats, caps, the JPEG structure rules; MixedDecode._check): "
              f"{check_ms:.2f} ms per batch of {args.batch}, {1e3 * check_ms / args.batch:.1f} us per image (this "
              "process's CPU, on any device).", "",
              f"The same for rows whose header the sidecar vouches for ({vouched} of {need} JPEGs, MixedDecode.heads "
              f"a batch at a time; headers packed here from jpeg_rules' answer, which equals the sidecar's): "
              f"{vouched_ms:.3f} ms per batch, "
              f"{1e3 * vouched_ms / args.batch:.2f} us per image.", "",
              f"The draws (each sample's window and flip, MixedDecode.boxes, a batch at a time): "
              f"{1e6 * statistics.mean(draw_s) / need:.2f} us per image.", "",
              "The sidecar's read of the same headers (ImageHeader.read in Java over direct buffers, "
              "benchmarks/HeaderRead.java; what it runs per row to vouch for it): " +
              (f"{statistics.median(sidecar_us):.2f} us per image (median of {len(sidecar_us)} rounds: "
               f"{', '.join(f'{v:.2f}' for v in sidecar_us)})." if isinstance(sidecar_us, list) else f"{sidecar_us}.")]
    print("\n".join(lines), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps({"header": head, "rows": rows, "ratio": ratio,
                                         "window_area": statistics.mean(area), "region_area": statistics.mean(region),
                                         "resample_s": resample,
                                         "stacks_per_batch": statistics.mean(groups), "padding": padding,
                                         "check_s": check_s, "check_vouched_s": vouched_s, "draw_s": draw_s,
                                         "sidecar_read_us": sidecar_us,
                                         "vouched_rows": vouched}, indent=1) + "\n")


if __name__ == "__main__":
    main()
