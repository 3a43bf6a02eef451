#!/usr/bin/env python
"""Benchmark: samples/s of each format read through unstall vs the format's usual Python reader, same files,
same run, cold (page cache dropped for the files) and warm (the next epochs).

    python benchmarks/bench_formats.py --out formats.md      # under ~/.cache/unstall/bench/formats

For each case of ``CASES`` (add one: a ``Case`` with a writer, the registration, and the baseline loader):
- unstall: ``unstall.torch.DataLoader(Dataset(name, root, format, options), batch_size, shuffle=True,
  num_workers=2)``; cold = its first epoch after the files' pages were dropped (the sidecar reads storage),
  warm = the median of the next epochs (served from the sidecar's memory cache); and a cold epoch in file
  order (``shuffle=False``, a second registration), where a batch's neighbours coalesce into large requests;
- baseline: the format's usual reader in a torch DataLoader with the same batch size and workers; cold = its first
  epoch after dropping the files' pages (for CSV, parsing the whole file first, as users do, counts here), warm =
  the median of the next epochs (page cache, or memory for CSV);
and the ratios unstall/baseline. Every loop only touches each sample (collate keeps the list). Not a test: numbers
depend on the machine and its load (printed with the table).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, List

import numpy as np
import torch.utils.data as tud

import unstall
from unstall.torch import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _pagecache import evict  # noqa: E402
from _report import header, write_out  # noqa: E402


@dataclass
class Case:
    """One format: ``write(dir) -> root`` makes the files (reference writer), ``format``/``options`` register them,
    ``baseline(root) -> (dataset, shuffle)`` is the usual reader's torch dataset (map-style or iterable), and
    ``prepare(root)`` what that reader does once before iterating (timed into its cold epoch)."""

    write: Callable[[Path], Path]
    format: str
    options: dict[str, Any]
    baseline: Callable[[Path, Any], tuple[Any, bool]]
    reader: str  # the baseline, in the table
    prepare: Callable[[Path], Any] = lambda root: None


# ---- webdataset: 4 shards of ~20 KB payloads with a .cls label ----

def write_tars(d: Path) -> Path:
    import webdataset as wds

    rng = np.random.default_rng(1)
    for s in range(4):
        with wds.TarWriter(str(d / f"shard-{s:05d}.tar")) as w:
            for i in range(600):
                w.write({"__key__": f"s{s}-{i:05d}", "jpg": rng.integers(0, 256, 20_000, dtype=np.uint8).tobytes(),
                         "cls": str(i % 10).encode()})
    return d


def wds_baseline(root: Path, _: Any) -> tuple[Any, bool]:
    import webdataset as wds

    shards = sorted(str(p) for p in root.glob("*.tar"))
    return wds.WebDataset(shards, shardshuffle=False).to_tuple("jpg", "cls"), False  # shards split by worker


# ---- npy: float32 rows of 3x32x32 (12 KB) and int64 labels ----

def write_npy(d: Path) -> Path:
    rng = np.random.default_rng(2)
    np.save(d / "x.npy", rng.standard_normal((6000, 3, 32, 32)).astype(np.float32))
    np.save(d / "labels.npy", rng.integers(0, 10, 6000))
    return d


class NpyRows(tud.Dataset):
    """numpy's usual map-style dataset: the arrays memory-mapped, a row copied out per sample."""

    def __init__(self, root: Path) -> None:
        self.x = np.load(root / "x.npy", mmap_mode="r")
        self.y = np.load(root / "labels.npy", mmap_mode="r")

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Any:
        return np.array(self.x[i]), int(self.y[i])


# ---- csv: 200k rows of 6 typed columns (pyarrow reads the file, then rows are served from memory) ----

def write_csv(d: Path) -> Path:
    import csv

    rng = np.random.default_rng(3)
    with open(d / "table.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "a", "b", "c", "name", "y"])
        for i in range(200_000):
            w.writerow([i, rng.integers(0, 1000), f"{rng.random():.6f}", bool(i % 3), f"row {i}, text", i % 7])
    return d


def read_table(root: Path) -> List[dict[str, Any]]:
    import pyarrow.csv as pacsv

    return pacsv.read_csv(root / "table.csv").to_pylist()


class Rows(tud.Dataset):
    def __init__(self, rows: List[dict[str, Any]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> Any:
        row = dict(self.rows[i])
        return row, row.pop("y")


# ---- parquet: 20000 rows (a 1 KiB binary, a caption, an int64 label), row groups of 1000, snappy ----

ROWS = 20000


def write_parquet(d: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    table = pa.table({
        "pixels": pa.array([rng.integers(0, 256, 1024, dtype=np.uint8).tobytes() for _ in range(ROWS)], pa.binary()),
        "caption": pa.array([f"a photo of sample {i}" for i in range(ROWS)]),
        "label": pa.array(rng.integers(0, 100, ROWS), pa.int64()),
    })
    pq.write_table(table, d / "train.parquet", row_group_size=1000, compression="snappy")
    return d


class PyarrowRows(tud.Dataset):
    """The pyarrow user's map-style dataset: the table read once (``prepare``), a row per sample."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, i: int) -> Any:
        row = self.table.slice(i, 1).to_pylist()[0]
        return row, row.pop("label")


# ---- hdf5: images (20000, 32, 32, 3) uint8 chunked (64, 32, 32, 3) with gzip, and labels ----

def write_hdf5(d: Path) -> Path:
    import h5py

    rng = np.random.default_rng(0)
    with h5py.File(d / "train.h5", "w") as f:
        f.create_dataset("images", data=rng.integers(0, 256, (ROWS, 32, 32, 3), dtype=np.uint8),
                         chunks=(64, 32, 32, 3), compression="gzip")
        f.create_dataset("labels", data=rng.integers(0, 100, ROWS, dtype=np.int64))
    return d


class H5pyRows(tud.Dataset):
    """The h5py user's map-style dataset: the file opened lazily in each worker, ``dset[i]`` per sample."""

    def __init__(self, path: Path) -> None:
        import h5py

        self.path = path
        with h5py.File(path) as f:
            self.n = f["images"].shape[0]
        self.file: Any = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import h5py

        if self.file is None:
            self.file = h5py.File(self.path)
        return self.file["images"][i], int(self.file["labels"][i])


def read_parquet(root: Path) -> Any:
    import pyarrow.parquet as pq

    return pq.read_table(root / "train.parquet")


CASES: dict[str, Case] = {
    "webdataset": Case(write_tars, "webdataset", {"payload": "jpg", "label": "cls"}, wds_baseline,
                       "webdataset.WebDataset(shards).to_tuple"),
    "npy": Case(write_npy, "npy", {"label": "labels.npy"}, lambda root, _: (NpyRows(root), True),
                "np.load(mmap_mode='r'), a row copied per sample"),
    "csv": Case(write_csv, "csv", {"label": "y"}, lambda root, rows: (Rows(rows), True),
                "pyarrow.csv.read_csv(file).to_pylist(), rows from memory", read_table),
    "parquet": Case(write_parquet, "parquet", {"label": "label"}, lambda root, table: (PyarrowRows(table), True),
                    "pyarrow.parquet.read_table(file), table.slice(i, 1).to_pylist() per sample", read_parquet),
    "hdf5": Case(write_hdf5, "hdf5", {"dataset": "images", "label": "labels"},
                 lambda root, _: (H5pyRows(root / "train.h5"), True), "h5py.File per worker, images[i] per sample"),
}


def keep(batch: List[Any]) -> List[Any]:
    return batch


def epoch(loader: Iterable[Any]) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = sum(len(b) for b in loader)
    return n, time.perf_counter() - t0


def files_of(root: Path) -> List[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def run(name: str, case: Case, base: Path, sidecar: unstall.Sidecar, args: argparse.Namespace) -> dict[str, Any]:
    d = base / name
    marker = d / ".complete"
    if not marker.exists():
        d.mkdir(parents=True, exist_ok=True)
        case.write(d)
        marker.touch()
    files = [p for p in files_of(d) if p != marker]
    size = sum(p.stat().st_size for p in files)
    common = dict(batch_size=args.batch_size, num_workers=args.workers, persistent_workers=True, collate_fn=keep)

    evict(files)  # cold: the sidecar indexes and reads from storage
    t0 = time.perf_counter()
    ds = Dataset(f"bench-{name}-{time.time_ns()}", root=str(d), format=case.format, options=case.options,
                 sidecar=sidecar)
    index_s = time.perf_counter() - t0
    loader = DataLoader(ds, shuffle=True, seed=0, **common)
    n, cold = epoch(loader)
    warm = statistics.median(epoch(loader)[1] for _ in range(args.epochs))
    evict(files)  # cold again, in file order: neighbours coalesce into large requests (a new name: nothing learned)
    seq = Dataset(f"bench-{name}-seq-{time.time_ns()}", root=str(d), format=case.format, options=case.options,
                  sidecar=sidecar)
    _, cold_seq = epoch(DataLoader(seq, shuffle=False, **common))

    evict(files)
    t0 = time.perf_counter()
    prepared = case.prepare(d)
    prep_s = time.perf_counter() - t0
    dataset, shuffle = case.baseline(d, prepared)
    base_loader = tud.DataLoader(dataset, shuffle=shuffle, **common)
    bn, bcold = epoch(base_loader)
    bwarm = statistics.median(epoch(base_loader)[1] for _ in range(args.epochs))
    assert n == bn == len(ds), (name, n, bn, len(ds))
    return {"case": name, "reader": case.reader, "samples": n, "mb": size / 1e6, "index_s": index_s,
            "cold": n / cold, "cold_seq": n / cold_seq, "warm": n / warm,
            "bcold": n / (bcold + prep_s), "bwarm": n / bwarm}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="also write the markdown here")
    p.add_argument("--dir", type=Path, default=Path.home() / ".cache" / "unstall" / "bench" / "formats")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of " + ", ".join(CASES))
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3, help="warm epochs (the median is reported)")
    args = p.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    rows = []
    with unstall.Sidecar(home=args.dir / "home", cache_capacity="1GiB", memory_budget="2GiB", start=True) as sc:
        for name in args.cases.split(","):
            rows.append(run(name, CASES[name], args.dir, sc, args))
            print(rows[-1], file=sys.stderr)
    load1 = os.getloadavg()
    lines = [*header(), f"- load average (1 min) at start / end: {load0[0]:.1f} / {load1[0]:.1f}",
             f"- batch size {args.batch_size}, {args.workers} DataLoader workers, warm = median of {args.epochs} epochs",
             "",
             "| format | samples | MB | index s | unstall cold/s (shuffled; in order) | baseline cold/s | ratio "
             "(shuffled; in order) | unstall warm/s | baseline warm/s | ratio | baseline |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['samples']} | {r['mb']:.0f} | {r['index_s']:.1f} | {r['cold']:.0f}; "
                     f"{r['cold_seq']:.0f} | {r['bcold']:.0f} | {r['cold'] / r['bcold']:.2f}; "
                     f"{r['cold_seq'] / r['bcold']:.2f} | {r['warm']:.0f} | {r['bwarm']:.0f} | "
                     f"{r['warm'] / r['bwarm']:.2f} | {r['reader']} |")
    print("\n".join(lines))
    write_out(args.out, lines)


if __name__ == "__main__":
    main()
