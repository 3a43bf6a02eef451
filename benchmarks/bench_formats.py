"""Formats (issue 14's benchmark; not a test): samples/s through ``unstall.torch.DataLoader`` against each
format's usual Python reader, on the same files in the same run.

Each case writes its files once (with the format's reference writer), then, for each reader, runs 2 epochs of
a shuffled map-style DataLoader (``--workers`` workers, ``--batch-size``): **cold** is the first epoch after the
files were evicted from the page cache (``posix_fadvise DONTNEED``) and, for unstall, of a fresh sidecar (its
cache empty); **warm** is the second epoch (files in the page cache; unstall's memory cache holds every sample).
The ratio is unstall's samples/s over the baseline's. Each reader's setup is reported apart ("setup s"): the
baseline's constructor (pyarrow reads the whole table there, before any epoch) and unstall's registration
(indexing, paid once per dataset: a Parquet index is saved next to the manifest with a disk tier).

Cases (``CASES``: name -> ``Case``; ``--cases`` picks):

- ``parquet``: rows of an image-like binary, a caption and an int label, row groups of 1000 (pyarrow,
  snappy). Baseline: what a pyarrow user does, ``pq.read_table`` once (before the workers fork) and
  ``table.slice(i, 1).to_pylist()[0]`` per sample.
- ``hdf5``: ``images`` (N, 32, 32, 3) uint8 chunked (64, 32, 32, 3) with gzip, and ``labels`` (h5py). Baseline:
  ``h5py.File`` opened in each worker, ``images[i]`` and ``labels[i]`` per sample (h5py's chunk cache as
  configured by default).

    nice .venv/bin/python benchmarks/bench_formats.py [--samples 20000] [--cases parquet,hdf5] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Optional

import numpy as np
import torch.utils.data as tud

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python-shim" / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import unstall  # noqa: E402
import unstall.torch as ut  # noqa: E402
from _pagecache import evict  # noqa: E402
from _report import header, write_out  # noqa: E402


@dataclass(frozen=True)
class Case:
    """One format: how to write N samples under a directory, how unstall registers them, the usual reader."""

    write: Callable[[Path, int], List[Path]]  # returns the files written (evicted before each cold epoch)
    root: Callable[[Path], Path]
    format: str
    options: dict[str, Any]
    baseline_name: str
    baseline: Callable[[Path], tud.Dataset]


# -- parquet ---------------------------------------------------------------------------------------
def write_parquet(work: Path, n: int) -> List[Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    path = work / "pq" / "train.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({
        "pixels": pa.array([rng.integers(0, 256, 1024, dtype=np.uint8).tobytes() for _ in range(n)], pa.binary()),
        "caption": pa.array([f"a photo of sample {i}" for i in range(n)]),
        "label": pa.array(rng.integers(0, 100, n), pa.int64()),
    })
    pq.write_table(table, path, row_group_size=1000, compression="snappy")
    return [path]


class PyarrowRows(tud.Dataset):
    """The pyarrow user's map-style dataset: the table read once, a row per sample."""

    def __init__(self, root: Path) -> None:
        import pyarrow.parquet as pq

        self.table = pq.read_table(root)

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, i: int) -> Any:
        row = self.table.slice(i, 1).to_pylist()[0]
        return row, row.pop("label")


# -- hdf5 ------------------------------------------------------------------------------------------
def write_hdf5(work: Path, n: int) -> List[Path]:
    import h5py

    rng = np.random.default_rng(0)
    path = work / "h5" / "train.h5"
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), chunks=(64, 32, 32, 3),
                         compression="gzip")
        f.create_dataset("labels", data=rng.integers(0, 100, n, dtype=np.int64))
    return [path]


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


CASES: dict[str, Case] = {
    "parquet": Case(write_parquet, lambda w: w / "pq", "parquet", {"label": "label"}, "pyarrow", PyarrowRows),
    "hdf5": Case(write_hdf5, lambda w: w / "h5" / "train.h5", "hdf5", {"dataset": "images", "label": "labels"},
                 "h5py", H5pyRows),
}


# -- the loop --------------------------------------------------------------------------------------
def keep(batch: List[Any]) -> List[Any]:
    return batch


def epochs(ds: tud.Dataset, loader_cls: Callable[..., Any], args: argparse.Namespace, expected: int) -> List[float]:
    """samples/s of a cold then a warm epoch."""
    loader = loader_cls(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                        persistent_workers=True, collate_fn=keep)
    rates = []
    for _ in range(2):
        start = time.perf_counter()
        n = sum(len(b) for b in loader)
        rates.append(n / (time.perf_counter() - start))
        if n != expected:
            raise SystemExit(f"bench_formats: an epoch yielded {n} samples, expected {expected}")
    return rates


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    lines = [*header(), "", "| format | reader | setup s | cold samples/s | warm samples/s | unstall / reader, cold |"
             " warm |", "|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-formats-") as tmp:
        work = Path(tmp)
        for name in args.cases.split(","):
            case = CASES[name]
            files = case.write(work, args.samples)
            evict(files)
            start = time.perf_counter()
            baseline = case.baseline(case.root(work))
            setup = time.perf_counter() - start
            base = epochs(baseline, tud.DataLoader, args, args.samples)
            evict(files)
            with unstall.Sidecar(home=work / f"home-{name}", cache_capacity="1GiB", memory_budget="2GiB") as sc:
                start = time.perf_counter()
                ds = ut.Dataset(f"bench-{name}", root=case.root(work), format=case.format, options=case.options,
                                sidecar=sc)
                indexing = time.perf_counter() - start
                evict(files)
                ours = epochs(ds, ut.DataLoader, args, args.samples)
            rows = [
                f"| {name} | {case.baseline_name} | {setup:.1f} | {base[0]:,.0f} | {base[1]:,.0f} | | |",
                f"| {name} | unstall | {indexing:.1f} | {ours[0]:,.0f} | {ours[1]:,.0f} | {ours[0] / base[0]:.2f} | "
                f"{ours[1] / base[1]:.2f} |",
            ]
            print("\n".join(rows), flush=True)
            lines += rows
    write_out(args.out, lines)


if __name__ == "__main__":
    main()
