"""examples/train_imagefolder.py, the README's main job (``scripts/demo.sh`` runs it after the set-up), as a user
runs it: it generates its photo folder, starts the embedded sidecar with a cache of half the dataset, and trains;
each epoch's row reports every sample once, epoch 0 all from storage, later epochs the cached part from memory."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "train_imagefolder.py"
CLASSES, PER_CLASS, EPOCHS = 10, 3, 2


def _mib(text: str) -> float:
    value, unit = text.split()
    assert unit == "MiB", text
    return float(value)


def test_the_demo_trains_through_a_started_sidecar_and_later_epochs_hit_its_cache(
    sidecar_jar: Path, tmp_path: Path
) -> None:
    data = tmp_path / "photos"
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNSTALL_")}
    env.update(UNSTALL_SIDECAR_JAR=str(sidecar_jar), UNSTALL_HOME=str(tmp_path / "home"))
    run = subprocess.run([sys.executable, str(SCRIPT), "--data", str(data), "--per-class", str(PER_CLASS),
                          "--epochs", str(EPOCHS), "--batch-size", "8", "--num-workers", "1", "--image-size", "32"],
                         env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                         timeout=300)  # a bound on a hang, not on the speed
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert len(list(data.glob("*/*.jpg"))) == CLASSES * PER_CLASS  # generated, photo-like JPEGs
    lines = run.stdout.splitlines()
    assert lines[0].startswith("started sidecar at "), run.stdout  # its own, not one already running
    assert f"{CLASSES * PER_CLASS} images in {CLASSES} classes" in lines[1]
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["epoch"])
    rows = [line.split() for line in lines[header + 1:header + 1 + EPOCHS]]
    assert [int(r[0]) for r in rows] == list(range(EPOCHS))
    for r in rows:
        assert math.isfinite(float(r[1])) and float(r[1]) > 0
        hits, misses = int(r[4]), int(r[5])
        assert hits + misses == CLASSES * PER_CLASS  # every sample once per epoch
    first, later = rows[0], rows[1:]
    assert int(first[4]) == 0 and _mib(" ".join(first[8:10])) == 0.0  # a cold cache: all from storage
    for r in later:  # the cache of half the dataset never evicts: its samples hit, the rest come from storage
        assert int(r[4]) > 0 and int(r[5]) > 0
        assert _mib(" ".join(r[6:8])) < _mib(" ".join(first[6:8]))
