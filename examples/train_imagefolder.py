#!/usr/bin/env python
"""Train a small CNN on an image folder fed by unstall: the README's main example.

    python examples/train_imagefolder.py     # generates ~/.cache/unstall/examples/photos if absent
    python examples/train_imagefolder.py --data /path/to/imagefolder --epochs 5 --cache-capacity 200MiB

The training loop is a plain PyTorch loop: only the Dataset/DataLoader come from unstall. The
sidecar is attached to if one runs (``$UNSTALL_HOME/sidecar.json``), else the embedded one is started
with a cache of about half the dataset, so the per-epoch cache numbers are interesting: epoch 0 reads
everything from storage, later epochs serve the cached half from memory (MinIO: never evicts).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision import transforms

import unstall
from unstall.torch import DataLoader, Dataset, pil_loader

CLASSES = ["airplane", "beach", "bridge", "desert", "forest", "harbor", "lake", "mountain", "road", "snow"]


def generate_photos(root: Path, per_class: int = 40, size: tuple[int, int] = (500, 375), seed: int = 0) -> None:
    """A small photo-like dataset: per class a palette and a dominant shape, plus gradients and noise."""
    from PIL import Image, ImageDraw, ImageFilter

    rng = np.random.default_rng(seed)
    w, h = size
    total = len(CLASSES) * per_class
    done = 0
    for ci, cls in enumerate(CLASSES):
        (root / cls).mkdir(parents=True, exist_ok=True)
        palette = np.random.default_rng(1000 + ci).uniform(30, 225, size=(3, 3))
        for i in range(per_class):
            sky, ground, accent = palette + rng.normal(0, 12, size=(3, 3))
            horizon = int(h * rng.uniform(0.3, 0.7))
            t = np.linspace(0, 1, h)[:, None, None]
            img = np.where(np.arange(h)[:, None, None] < horizon, sky * (1 - 0.4 * t), ground * (0.6 + 0.4 * t))
            img = np.broadcast_to(img, (h, w, 3)) + rng.normal(0, 10, size=(h, w, 3))
            pil = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")
            draw = ImageDraw.Draw(pil)
            for _ in range(int(rng.integers(2, 6))):
                x, y = int(rng.integers(0, w)), int(rng.integers(0, h))
                r = int(rng.integers(20, 90))
                box = (x - r, y - r, x + r, y + r)
                color = tuple(int(c) for c in np.clip(accent + rng.normal(0, 20, 3), 0, 255))
                [draw.ellipse, draw.rectangle, draw.polygon][ci % 3](
                    box if ci % 3 != 2 else [(x, y - r), (x - r, y + r), (x + r, y + r)], fill=color
                )
            pil = pil.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.5, 1.5))))
            pil.save(root / cls / f"{cls}_{i:04d}.jpg", quality=int(rng.integers(80, 95)))
            done += 1
            if done % 20 == 0 or done == total:
                print(f"\r  generating {root}: {done}/{total} images", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.conv3 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.conv3(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def parse_size(text: str) -> int:
    units = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6, "mib": 1 << 20,
             "g": 1 << 30, "gb": 10**9, "gib": 1 << 30}
    s = text.strip().lower()
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num):].strip()
    if unit not in units or not num:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 20MiB, 500000)")
    return int(float(num) * units[unit])


def mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=Path.home() / ".cache" / "unstall" / "examples" / "photos",
                   help="image folder (generated if absent; default ~/.cache/unstall/examples/photos)")
    p.add_argument("--per-class", type=int, default=40, help="photos per class when --data is generated (40)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--cache-capacity", type=parse_size, default=None,
                   help="cache size for a started sidecar (default: half the dataset)")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=64, help="RandomResizedCrop size")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    if not args.data.exists():
        generate_photos(args.data, per_class=args.per_class, seed=args.seed)
    files = [f for f in args.data.rglob("*") if f.is_file()]
    dataset_bytes = sum(f.stat().st_size for f in files)
    capacity = args.cache_capacity if args.cache_capacity is not None else dataset_bytes // 2
    torch.manual_seed(args.seed)

    with unstall.Sidecar(cache_capacity=capacity) as sidecar:
        how = "started" if sidecar.started else "attached to"
        print(f"{how} sidecar at {sidecar.flight_location} (pid {sidecar.pid})")
        train_tf = transforms.Compose([
            transforms.RandomResizedCrop(args.image_size, scale=(0.35, 1.0), antialias=True),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25]),
        ])
        name = "photos-" + hashlib.sha1(str(args.data.resolve()).encode()).hexdigest()[:8]
        ds = Dataset(name, root=args.data, loader=pil_loader, transform=train_tf, sidecar=sidecar)
        cap = sidecar.stats().cache.capacity_bytes
        print(f"dataset {name!r}: {len(ds)} images in {len(ds.classes)} classes, {mib(ds.info.total_bytes)}; "
              f"cache capacity {mib(cap)} ({100 * cap / max(1, ds.info.total_bytes):.0f}% of the dataset)")
        if not sidecar.started:
            print("note: attached to a running sidecar: --cache-capacity does not apply, and what it cached "
                  "before counts as hits")
        loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers,
                            persistent_workers=args.num_workers > 0, seed=args.seed)
        model = SmallCNN(len(ds.classes))
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        print(f"{'epoch':>5} {'loss':>7} {'acc':>6} {'samples/s':>10} {'hits':>6} {'misses':>7} "
              f"{'storage':>11} {'from cache':>11}")
        for epoch in range(args.epochs):
            epoch_id = loader.epoch  # what the sidecar counts this epoch under
            model.train()
            t0 = time.perf_counter()
            seen, loss_sum, correct = 0, 0.0, 0
            for images, labels in loader:
                opt.zero_grad()
                out = model(images)
                loss = F.cross_entropy(out, labels)
                loss.backward()
                opt.step()
                seen += len(labels)
                loss_sum += loss.item() * len(labels)
                correct += int((out.argmax(1) == labels).sum())
            dt = time.perf_counter() - t0
            st = sidecar.stats().dataset(name).epoch(epoch_id)
            print(f"{epoch:>5} {loss_sum / seen:>7.3f} {correct / seen:>6.1%} {seen / dt:>10.1f} {st.hits:>6} "
                  f"{st.misses:>7} {mib(st.storage_bytes):>11} {mib(st.cache_bytes):>11}")
            if not math.isfinite(loss_sum):
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
