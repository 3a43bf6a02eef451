"""Checks shared by the format tests, local and on S3: a dataset read through a DataLoader with 2 workers over
2 epochs equals what the format's reference reader (pyarrow, h5py) reads from the same file."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from unstall.torch import DataLoader, Dataset

from batches import keep


def frozen(row: dict[str, Any]) -> str:
    """A row as a hashable, exact value (floats by their repr, bytes as hex)."""
    return json.dumps(row, sort_keys=True, default=lambda b: b.hex())


def epochs_of(ds: Dataset, epochs: int = 2) -> list[list[Any]]:
    """The (sample, target) pairs of each epoch through a DataLoader with 2 workers, shuffled."""
    loader = DataLoader(ds, batch_size=4, shuffle=True, seed=3, num_workers=2, persistent_workers=True,
                        collate_fn=keep)
    return [[item for batch in loader for item in batch] for _ in range(epochs)]


def check_parquet(ds: Dataset, rows: list[dict[str, Any]]) -> None:
    """Every row, with its label split out, exactly once per epoch, equal to what pyarrow reads."""
    assert len(ds) == len(rows)
    assert ds[3] == ({k: v for k, v in rows[3].items() if k != "label"}, rows[3]["label"])
    expected = Counter((frozen({k: v for k, v in r.items() if k != "label"}), r["label"]) for r in rows)
    for seen in epochs_of(ds):
        assert Counter((frozen(row), label) for row, label in seen) == expected


def check_hdf5(ds: Dataset, path: Path, dataset: str) -> None:
    """Every row as h5py reads it (dtype, shape, values), with its label, once per epoch."""
    with h5py.File(path) as f:
        rows = [f[dataset][i] for i in range(f[dataset].shape[0])]
        labels = f["labels"][:].tolist()
    assert len(ds) == len(rows)
    sample, label = ds[5]
    assert sample.dtype == rows[5].dtype and sample.shape == rows[5].shape and sample.flags.writeable
    assert np.array_equal(sample, rows[5]) and label == labels[5]
    expected = Counter((r.tobytes(), r.dtype.str, r.shape, y) for r, y in zip(rows, labels))
    for seen in epochs_of(ds):
        assert Counter((a.tobytes(), a.dtype.str, a.shape, y) for a, y in seen) == expected
