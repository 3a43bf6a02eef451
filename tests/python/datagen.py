"""Test-data generators: image folders of real JPEG/PNG files and TFRecord shards (own writer, with
the masked CRC32C framing TensorFlow uses)."""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from PIL import Image

# -- CRC32C (Castagnoli), table-driven; test data is small ---------------------------------------
_POLY = 0x82F63B78
_TABLE = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ _POLY if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


@dataclass(frozen=True)
class Record:
    shard: str  # file name
    offset: int  # byte offset of the record's length field in the shard
    data: bytes

    @property
    def key(self) -> str:
        return f"{self.shard}@{self.offset}"


def write_tfrecord(path: Path, records: Sequence[bytes]) -> list[Record]:
    """Writes one TFRecord file: u64 length, u32 masked_crc(length), data, u32 masked_crc(data)."""
    out = []
    with open(path, "wb") as f:
        for data in records:
            out.append(Record(path.name, f.tell(), data))
            header = struct.pack("<Q", len(data))
            f.write(header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data)))
    return out


def make_tfrecord_shards(root: Path, shards: int, per_shard: int, size: Optional[int] = None, seed: int = 0) -> list[Record]:
    """``shards`` files ``part-0000i.tfrecord``; record sizes vary unless ``size`` is given. Returns
    the records in dataset order (shards sorted by name, then file order)."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    records: list[Record] = []
    for s in range(shards):
        datas = [
            rng.integers(0, 256, size if size is not None else int(rng.integers(1, 3000)), dtype=np.uint8).tobytes()
            for _ in range(per_shard)
        ]
        records += write_tfrecord(root / f"part-{s:05d}.tfrecord", datas)
    return records


def image_bytes(rng: np.random.Generator, fmt: str, w: int = 32, h: int = 24) -> bytes:
    """A small real image: a gradient plus noise, so JPEGs differ from each other."""
    base = np.linspace(0, 255, w, dtype=np.float32)[None, :, None] * rng.uniform(0.2, 1.0, size=(1, 1, 3))
    img = np.clip(base + rng.normal(0, 40, size=(h, w, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img, "RGB").save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def make_image_folder(
    root: Path, classes: Sequence[str], per_class: int, *, seed: int = 0, equal_size: Optional[int] = None,
    extras: bool = True,
) -> Path:
    """torchvision ImageFolder layout with real JPEG/PNG files, under ``root`` (returned).

    ``equal_size`` pads every file with trailing bytes to exactly that many bytes (decoders ignore
    data after the end of the image), for exact cache arithmetic. ``extras`` adds what ImageFolder
    must handle: an upper-case extension, a nested sub-directory, and a non-image file it skips.
    """
    rng = np.random.default_rng(seed)
    for ci, cls in enumerate(classes):
        d = root / cls
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            fmt, ext = ("PNG", ".png") if (i + ci) % 3 == 0 else ("JPEG", ".jpg")
            if extras and i == 1:
                ext = ext.upper()
            target = d / "nested" / f"img{i:03d}{ext}" if extras and i == 2 else d / f"img{i:03d}{ext}"
            target.parent.mkdir(exist_ok=True)
            data = image_bytes(rng, fmt)
            if equal_size is not None:
                if len(data) > equal_size:
                    raise ValueError(f"an image is {len(data)} bytes, more than equal_size={equal_size}")
                data += bytes(equal_size - len(data))
            target.write_bytes(data)
        if extras:
            (d / "notes.txt").write_text("not an image")
    return root


# -- Parquet and HDF5, written by their reference writers (pyarrow.parquet, h5py) ---------------------
def make_parquet_files(root: Path, files: int, rows: int, row_group_size: int, seed: int = 0) -> list[dict]:
    """``files`` files ``part-i.parquet`` of ``rows`` rows each (snappy, row groups of ``row_group_size``): an
    image-like ``pixels`` binary, a ``caption`` string (some null), an ``embedding`` list of float32 (some empty),
    a float ``score`` and an integer ``label``. Returns the rows in dataset order as ``to_pylist()`` gives them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    out: list[dict] = []
    for f in range(files):
        n0 = f * rows
        table = pa.table({
            "pixels": pa.array([rng.integers(0, 256, int(rng.integers(1, 400)), dtype=np.uint8).tobytes()
                                for _ in range(rows)], pa.binary()),
            "caption": pa.array([None if (n0 + i) % 7 == 3 else f"sample {n0 + i}" for i in range(rows)]),
            "embedding": pa.array([rng.standard_normal((n0 + i) % 5).astype(np.float32).tolist() for i in range(rows)],
                                  pa.list_(pa.float32())),
            "score": pa.array(rng.standard_normal(rows), pa.float64()),
            "label": pa.array(rng.integers(0, 10, rows), pa.int64()),
        })
        pq.write_table(table, root / f"part-{f}.parquet", row_group_size=row_group_size, compression="snappy")
        out.extend(pq.read_table(root / f"part-{f}.parquet").to_pylist())
    return out


def make_hdf5_file(path: Path, rows: int, seed: int = 0) -> None:
    """An HDF5 file as ML datasets store them: ``images`` (rows, 6, 5, 3) uint8, chunked (4, 3, 5, 3) with gzip and
    shuffle (chunks split a row); ``features`` (rows, 7) float32, contiguous; ``labels`` (rows,) int64."""
    import h5py

    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=rng.integers(0, 256, (rows, 6, 5, 3), dtype=np.uint8), chunks=(4, 3, 5, 3),
                         compression="gzip", shuffle=True)
        f.create_dataset("features", data=rng.standard_normal((rows, 7)).astype(np.float32))
        f.create_dataset("labels", data=rng.integers(0, 10, rows, dtype=np.int64))
