"""Datasets of the formats decoded by ``unstall.formats``, written by each format's reference writer
(webdataset's ``TarWriter``, ``numpy.save``/``numpy.savez``, Python's ``csv``), with what a user of the
format's own reader gets from them; and the check that 2 epochs of a 2-worker DataLoader yield exactly that.
Shared by test_formats.py (local files) and test_s3.py (the same files in a bucket)."""

from __future__ import annotations

import csv
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable

import numpy as np

import unstall
from unstall.torch import DataLoader, Dataset

from batches import keep


@dataclass
class Case:
    """Files under ``root`` (or the one file ``root``) registered as ``format`` with ``options``; ``expected``:
    each sample as ``canonical`` makes it, with its multiplicity."""

    format: str
    root: Path
    options: dict[str, Any]
    expected: Counter[Hashable]
    canonical: Callable[[Any], Hashable] = field(default=lambda x: x)


def webdataset_shards(root: Path, shards: int = 2, per_shard: int = 7, seed: int = 0) -> list[dict[str, Any]]:
    """Shards written by webdataset's TarWriter: a .jpg-like payload, a .cls label, a .json for some samples, a
    long key (a pax path record) in each shard. Returns the samples as written."""
    import webdataset as wds

    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    samples = []
    for s in range(shards):
        with wds.TarWriter(str(root / f"shard-{s:05d}.tar")) as w:
            for i in range(per_shard):
                key = f"s{s}/{'long-' * 30 if i == 3 else ''}sample{i:04d}"
                sample: dict[str, Any] = {"__key__": key, "jpg": rng.randbytes(rng.randint(0, 3000)),
                                          "cls": str(rng.randint(0, 9)).encode()}
                if i % 2:
                    sample["json"] = f'{{"i": {i}}}'.encode()
                w.write(sample)
                samples.append(sample)
    return samples


def webdataset_case(root: Path, *, payload: bool) -> Case:
    samples = webdataset_shards(root)
    if payload:
        return Case("webdataset", root, {"payload": "jpg;png", "label": "cls"},
                    Counter((s["jpg"], int(s["cls"])) for s in samples), lambda x: (x[0], x[1]))
    return Case("webdataset", root, {}, Counter(_wds_item(s) for s in samples), _wds_item)


def _wds_item(d: dict[str, Any]) -> Hashable:
    return tuple(sorted((k, v) for k, v in d.items() if k != "__url__"))


def npy_case(root: Path) -> Case:
    """Two .npy shards of float32 (rows of 3x4) and a labels.npy beside them, by numpy.save."""
    rng = np.random.default_rng(3)
    root.mkdir(parents=True, exist_ok=True)
    parts = [rng.standard_normal((n, 3, 4)).astype(np.float32) for n in (9, 5)]
    for k, a in enumerate(parts):
        np.save(root / f"x-{k}.npy", a)
    labels = rng.integers(0, 10, size=14, dtype=np.int64)
    np.save(root / "labels.npy", labels)
    rows = np.concatenate(parts)
    return Case("npy", root, {"label": "labels.npy"},
                Counter((_row(r), int(y)) for r, y in zip(rows, labels)), lambda x: (_row(x[0]), x[1]))


def npz_case(root: Path) -> Case:
    """An npz by numpy.savez with x_train (uint8 rows of 5x2, big-endian int16 too) and y_train."""
    rng = np.random.default_rng(4)
    root.mkdir(parents=True, exist_ok=True)
    x = rng.integers(0, 255, size=(11, 5, 2), dtype=np.uint8)
    y = rng.integers(0, 3, size=11).astype(np.int32)
    np.savez(root / "data.npz", x_train=x, y_train=y, other=np.arange(4))
    return Case("npz", root / "data.npz", {"array": "x_train", "label": "y_train"},
                Counter((_row(r), int(t)) for r, t in zip(x, y)), lambda s: (_row(s[0]), s[1]))


def _row(a: np.ndarray) -> Hashable:
    return a.dtype.str, a.shape, a.tobytes()


def csv_case(root: Path) -> Case:
    """A CSV by Python's csv module: quoted delimiters, quotes and line breaks, empty strings, a label column."""
    rng = random.Random(5)
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(23):
        rows.append({"id": i, "name": rng.choice(["plain", "with, comma", 'say "hi"', "two\nlines"]) + str(i),
                     "score": round(rng.uniform(-5, 5), 3), "flag": rng.choice([True, False]),
                     "note": "" if i % 5 == 0 else f"n{i}", "y": rng.choice(["cat", "dog"])})
    with open(root / "table.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow(r)
    expected = Counter(_csv_item((r, r["y"])) for r in rows)  # "" stays "" in a string column, as in Arrow
    return Case("csv", root, {"label": "y"}, expected, _csv_item)


def _csv_item(x: tuple[dict[str, Any], Any]) -> Hashable:
    row, label = x
    return tuple(sorted((k, v) for k, v in row.items() if k != "y")), label


def assert_epochs(case: Case, name: str, sidecar: unstall.Sidecar, root: str, epochs: int = 2,
                  num_workers: int = 2, transport: str | None = None) -> Dataset:
    """Registers the case and checks that each of ``epochs`` shuffled epochs of a ``num_workers`` DataLoader
    yields every expected sample exactly once."""
    ds = Dataset(name, root=root, format=case.format, options=case.options, sidecar=sidecar, transport=transport)
    assert len(ds) == sum(case.expected.values())
    loader = DataLoader(ds, batch_size=4, shuffle=True, seed=11, num_workers=num_workers,
                        persistent_workers=num_workers > 0, collate_fn=keep)
    for _ in range(epochs):
        seen = Counter(case.canonical(item) for batch in loader for item in batch)
        assert seen == case.expected
    return ds
