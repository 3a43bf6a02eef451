"""Probe (not a test, not shipped in docs): GPU JPEG decode rates on the bench_gpu images, to size issue 30's
decode stage from measurements. Prints one line per variant: images/s over --seconds of steady state."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torchvision
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.ops import roi_align


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", type=Path, default=Path.home() / ".cache" / "unstall" / "bench-gpu")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--n", type=int, default=2048)
    args = ap.parse_args()
    files = sorted(p for p in args.root.rglob("*.jpg"))[: args.n]
    print(f"probe: torch {torch.__version__} torchvision {torchvision.__version__} {len(files)} files under {args.root}",
          flush=True)
    if not files:
        sys.exit(1)
    datas = [torchvision.io.read_file(str(p)) for p in files]
    print(f"probe: mean bytes {sum(d.numel() for d in datas) / len(datas):.0f}", flush=True)
    dev = torch.device("cuda")
    B = args.batch
    batches = [datas[i:i + B] for i in range(0, len(datas) - B + 1, B)]

    def timed(name, fn, reps=3):
        fn(batches[0])
        torch.cuda.synchronize()
        best = 0.0
        for _ in range(reps):
            t = time.perf_counter()
            n = 0
            for b in batches:
                fn(b)
                n += len(b)
            torch.cuda.synchronize()
            best = max(best, n / (time.perf_counter() - t))
        print(f"probe: {name}: {best:.0f} images/s", flush=True)

    def dec_one_by_one(b):
        return [decode_jpeg(d, device=dev) for d in b]

    def dec_batched(b):
        return decode_jpeg(b, device=dev, mode=ImageReadMode.RGB)

    mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255

    def dec_roi(b):
        imgs = decode_jpeg(b, device=dev, mode=ImageReadMode.RGB)
        h = max(i.shape[1] for i in imgs)
        w = max(i.shape[2] for i in imgs)
        if all(i.shape[1] == h and i.shape[2] == w for i in imgs):
            x = torch.stack(imgs)
        else:
            x = torch.zeros(len(imgs), 3, h, w, dtype=torch.uint8, device=dev)
            for k, i in enumerate(imgs):
                x[k, :, : i.shape[1], : i.shape[2]] = i
        n = len(imgs)
        boxes = torch.zeros(n, 5, device=dev)
        boxes[:, 0] = torch.arange(n, device=dev)
        boxes[:, 3] = w * 0.7
        boxes[:, 4] = h * 0.7
        y = roi_align(x.float(), boxes, output_size=(224, 224), spatial_scale=1.0, sampling_ratio=2, aligned=True)
        return ((y - mean) / std).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)

    def dec_loop_interp(b):
        imgs = decode_jpeg(b, device=dev, mode=ImageReadMode.RGB)
        out = torch.empty(len(imgs), 3, 224, 224, device=dev)
        for k, i in enumerate(imgs):
            c = i[:, : int(i.shape[1] * 0.7), : int(i.shape[2] * 0.7)].unsqueeze(0).float()
            out[k] = torch.nn.functional.interpolate(c, size=(224, 224), mode="bilinear", antialias=True)[0]
        return out

    timed("decode_jpeg one by one", dec_one_by_one, reps=1)
    timed("decode_jpeg batched list", dec_batched)
    timed("batched decode + pad + roi_align + normalize", dec_roi)
    timed("batched decode + per-image interpolate(antialias)", dec_loop_interp, reps=1)
    # CPU reference: one core's torchvision decode (the CPU path's per-core rate is in bench_prep)
    torch.set_num_threads(1)
    t = time.perf_counter()
    for d in datas[:256]:
        decode_jpeg(d)
    print(f"probe: torchvision CPU decode, 1 thread: {256 / (time.perf_counter() - t):.0f} images/s", flush=True)
    print(f"probe: cpus {os.cpu_count()}", flush=True)


if __name__ == "__main__":
    main()
