"""``unstall analyze`` beyond one PyTorch DataLoader: a tf.data job, a command with two DataLoaders (one
section each, with the worker-count what-if checked against reruns), and the HTML report rendered in a
real headless Chromium."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Tuple

import numpy as np
import pytest

from datagen import make_tfrecord_shards

SIZE = 4096

TWO_LOADERS = """
import os, time
from unstall.torch import DataLoader, Dataset

def keep(b):
    return b

if __name__ == "__main__":
    train = DataLoader(Dataset("train", root=os.environ["JOB_DATA"], format="tfrecord"), batch_size=4, shuffle=True,
                       seed=0, collate_fn=keep)
    val = DataLoader(Dataset("val", root=os.environ["JOB_VAL"], format="tfrecord"), batch_size=2, collate_fn=keep)
    for epoch in range(3):
        for _ in train:
            time.sleep(0.005)
        for _ in val:
            pass
"""

TF_JOB = """
import os, time
import tensorflow as tf
import unstall, unstall.tf

def prep(payloads, labels):
    time.sleep(0.002 * int(tf.shape(payloads)[0]))  # the job's per-sample prep, in tf.data's threads
    return tf.strings.length(payloads), labels

if __name__ == "__main__":
    unstall.default_sidecar().register_dataset("tfjob", os.environ["JOB_DATA"], format="tfrecord")
    ds = unstall.tf.dataset("tfjob", None, batch_size=4, seed=0)
    ds = ds.map(lambda p, l: tf.py_function(prep, [p, l], [tf.int32, tf.int64])).prefetch(2)
    for epoch in range(2):
        for x, y in ds:
            time.sleep(0.005)
"""


def _analyze(work: Path, job: str, sidecar_jar: Path, *args: str) -> Tuple[subprocess.CompletedProcess, Path]:
    make_tfrecord_shards(work / "data", shards=2, per_shard=16, size=SIZE, seed=5)  # 32 samples
    make_tfrecord_shards(work / "val", shards=1, per_shard=12, size=SIZE, seed=6)  # 12 samples
    script = work / "job.py"
    script.write_text(job)
    env = {**os.environ, "JOB_DATA": str(work / "data"), "JOB_VAL": str(work / "val"),
           "UNSTALL_SIDECAR_JAR": str(sidecar_jar), "UNSTALL_PROGRESS": "0"}
    out = work / "out"
    p = subprocess.run([sys.executable, "-m", "unstall", "analyze", "--out", str(out), "--steps", "4", "--warmup", "1",
                        "--max-cache", "1MiB", *args, "--", str(script)],
                       env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    return p, out


@pytest.fixture(scope="module")
def two_loaders(tmp_path_factory: pytest.TempPathFactory, sidecar_jar: Path) -> Tuple[subprocess.CompletedProcess, Path]:
    return _analyze(tmp_path_factory.mktemp("two-loaders"), TWO_LOADERS, sidecar_jar, "--validate-workers", "1")


def _stall_split_is_complete(sec: Dict[str, Any]) -> None:
    a = sec["analysis"]
    assert a["compute_fraction"] + a["prep_stall_fraction"] + a["fetch_stall_fraction"] == pytest.approx(1)
    r = sec["runs"]
    assert r["synthetic"]["work"]["fetch_samples"] == 0  # copies of the first batch: nothing fetched in the window
    assert r["cached"]["sidecar"]["misses"] == 0 and r["cached"]["sidecar"]["hits"] > 0
    assert r["cold"]["sidecar"]["hits"] == 0 and r["cold"]["sidecar"]["storage_bytes"] == r["cold"]["sidecar"]["misses"] * SIZE


def test_two_dataloaders_get_a_section_each(two_loaders) -> None:
    p, out = two_loaders
    doc = json.loads((out / "analyze.json").read_text())
    secs = doc["sections"]
    assert [(s["index"], s["status"], s["kind"], s["dataset"]["name"]) for s in secs] == [
        (0, "ok", "torch.DataLoader", "train"), (1, "ok", "torch.DataLoader", "val")]
    assert [s["dataset"]["num_samples"] for s in secs] == [32, 12]
    assert [s["runs"]["cold"]["batch_size"] for s in secs] == [4, 2]
    for s in secs:
        _stall_split_is_complete(s)
    text = (out / "analyze.txt").read_text()
    assert "loader 0: torch.DataLoader over dataset 'train'" in text and "loader 1: torch.DataLoader over dataset 'val'" in text
    assert (out / "analyze.png").is_file() and (out / "analyze-1.png").is_file()


def test_the_worker_count_what_if_is_checked_by_rerunning(two_loaders) -> None:
    p, out = two_loaders
    for s in json.loads((out / "analyze.json").read_text())["sections"]:
        assert s["runs"]["cold-w1"]["num_workers"] == 1 and s["runs"]["cold"]["num_workers"] == 0
        (row,) = s["validation"]
        rerun = s["runs"]["cold-w1"]
        assert row["workers"] == 1 and row["error"] is None
        assert row["measured"] == pytest.approx(rerun["steps"] * rerun["batch_size"] / (rerun["elapsed_ns"] / 1e9))
        assert row["relative_error"] == pytest.approx((row["predicted"] - row["measured"]) / row["measured"])
    assert "worker-count what-if checked by rerunning the command" in p.stdout


def test_the_html_report_renders_in_chromium(two_loaders, chromium: str, tmp_path: Path) -> None:
    from PIL import Image

    _, out = two_loaders
    page = (out / "analyze.html").read_text()
    # self-contained: no script, no stylesheet, image or font to fetch; links only within the page
    assert "<script" not in page and "<link" not in page and "@import" not in page
    assert re.findall(r"""(?:src|href)\s*=\s*["'](?!#|data:)|url\((?!#)""", page) == []
    title = page[page.index("<title>") + 7:page.index("</title>")]
    url = (out / "analyze.html").resolve().as_uri()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,2400"]
    shot = tmp_path / "shot.png"
    subprocess.run([chromium, *flags, f"--screenshot={shot}", url], capture_output=True, timeout=120, check=True)
    dom = subprocess.run([chromium, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert f"<title>{title}</title>" in dom and title.startswith("unstall analyze: ")
    assert dom.count("<svg") == 2 and "loader 1: torch.DataLoader over dataset 'val'" in dom
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float64)
    assert pixels.shape == (2400, 1200)
    assert pixels.var() > 0 and len(np.unique(pixels)) > 16  # text, tables and plots: not a blank page


def test_a_loader_that_cannot_be_analysed_says_why_and_the_others_are_analysed(tmp_path: Path,
                                                                              sidecar_jar: Path) -> None:
    p, out = _analyze(tmp_path, TWO_LOADERS, sidecar_jar, "--steps", "6")  # val: 6 batches of 2 < 1 + 6
    secs = json.loads((out / "analyze.json").read_text())["sections"]
    assert [(s["dataset"]["name"], s["status"]) for s in secs] == [("train", "ok"), ("val", "error")]
    assert secs[1]["error"].startswith("synthetic run: 1 warm-up + 6 timed steps = 7 batches, but an epoch of this "
                                       "torch.DataLoader has only 6 (12 samples, batch size 2); use --steps 5 or fewer")
    assert "loader 1: torch.DataLoader over dataset 'val'\n  not analysed: synthetic run:" in p.stdout
    assert "not analysed" in (out / "analyze.html").read_text()


@pytest.mark.skipif(not os.environ.get("CI") and importlib.util.find_spec("tensorflow") is None,
                    reason="TensorFlow is an optional extra (pip install tensorflow-cpu); CI has it")
def test_a_tf_data_job_reports_fetch_and_prep_stall(tmp_path: Path, sidecar_jar: Path) -> None:
    p, out = _analyze(tmp_path, TF_JOB, sidecar_jar, "--storage-bandwidth", "256KiB")
    (sec,) = json.loads((out / "analyze.json").read_text())["sections"]
    assert (sec["status"], sec["kind"], sec["dataset"]["name"]) == ("ok", "tf.data.Dataset", "tfjob")
    assert sec["runs"]["cold"]["batch_size"] == 4 and sec["runs"]["cold"]["num_workers"] == 1  # prefetch: beside the trainer
    assert sec["runs"]["cold"]["work"]["fetch_samples"] > 0
    _stall_split_is_complete(sec)
    a = sec["analysis"]
    # 62.5 ms of storage and 8 ms of prep per batch against a 5 ms step: both stalls are there
    assert a["fetch_stall_fraction"] > 0 and a["prep_stall_fraction"] > 0
    assert "loader 0: tf.data.Dataset over dataset 'tfjob'" in p.stdout and "fetch stall" in p.stdout
