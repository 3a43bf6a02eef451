"""Validates ``unstall analyze`` against known answers (docs/BENCHMARKS.md holds the latest run).

    ~/.cache/unstall/venv-py311/bin/python benchmarks/bench_analyze.py [--config w0|w2|tf|p2|cpu1|all]

For each configuration: a TFRecord dataset of equal-size samples, storage throttled to a known
bandwidth (the sidecar's ``--storage-bandwidth``) or not, prep slowed by a known per-sample cost (a
sleep, or CPU burnt, in the transform; in ``tf``, in a ``tf.data`` map), a training step of a known length
(a sleep). The job is a PyTorch DataLoader loop, or (``tf``) a loop over a ``tf.data.Dataset`` built on
``unstall.tf.dataset``. Then:

1. ``unstall analyze`` on the job: fetch/prep stall fractions, predicted throughput at 30% and 70%
   of the dataset cached, and (``--validate-workers``, configurations with ``validate``) the predicted
   cold-cache throughput with other worker counts against reruns of the job with them;
2. the same configurations actually run: the job with the cache holding 30% and 70% of the dataset
   (``real`` mode after a warm pass), and the stall fractions by removing one cost at a time (cold
   with storage unthrottled: no fetch cost; and also prep cost 0: neither);
3. a table of both side by side, with the relative error.

``bench_analyze.py job`` is the training job itself (configured by ``JOB_*`` variables).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "python-shim" / "src"))
sys.path.insert(0, str(REPO / "tests" / "python"))


# ------------------------------------------------------------------------------------------------
# The job: an unchanged-looking training loop


def _cost() -> None:
    """The prep cost of one sample: a sleep (``JOB_PREP=sleep``, no CPU) or CPU burnt (``cpu``)."""
    cost = float(os.environ.get("JOB_PREP_MS", "0")) / 1000
    if not cost:
        return
    if os.environ.get("JOB_PREP", "sleep") == "cpu":
        end = time.thread_time() + cost
        while time.thread_time() < end:
            pass
    else:
        time.sleep(cost)


def _prep(payload: bytes) -> int:
    _cost()
    return len(payload)


def _keep(batch):
    return batch


def job() -> None:
    step = float(os.environ.get("JOB_STEP_MS", "0")) / 1000
    batch = int(os.environ.get("JOB_BATCH", "8"))
    if os.environ.get("JOB_KIND") == "tf":
        import tensorflow as tf
        import unstall.tf

        def prep(payloads, labels):
            for _ in range(int(tf.shape(payloads)[0])):
                _cost()
            return tf.strings.length(payloads), labels

        unstall.default_sidecar().register_dataset("bench", os.environ["JOB_DATA"], format="tfrecord")
        loader = unstall.tf.dataset("bench", None, batch_size=batch, seed=0)
        loader = loader.map(lambda p, lab: tf.py_function(prep, [p, lab], [tf.int32, tf.int64])).prefetch(2)
    else:
        from unstall.torch import DataLoader, Dataset

        ds = Dataset("bench", root=os.environ["JOB_DATA"], format="tfrecord", transform=_prep)
        loader = DataLoader(ds, batch_size=batch, shuffle=True, seed=0,
                            num_workers=int(os.environ.get("JOB_WORKERS", "0")), collate_fn=_keep)
    for _epoch in range(2):
        for _batch in loader:
            time.sleep(step)  # the trainer's step


# ------------------------------------------------------------------------------------------------
# The benchmark

CONFIGS = {
    # storage-bound cold, prep stall when cached, no workers
    "w0": dict(workers=0, batch=8, sample=32 << 10, samples=768, step_ms=30, prep_ms=5, bandwidth=2 << 20),
    # two workers: prep-bound when cached (8*12/2 = 48 ms > 20 ms step), storage-bound when cold
    "w2": dict(workers=2, batch=8, sample=32 << 10, samples=768, step_ms=20, prep_ms=12, bandwidth=2 << 20),
    # w0's costs in a tf.data job: prep in a map, a prefetch beside the trainer
    "tf": dict(kind="tf", batch=8, sample=32 << 10, samples=768, step_ms=30, prep_ms=5, bandwidth=2 << 20),
    # the worker-count what-if, prep-bound (storage not throttled): prep sleeps (needs no core), 12 ms/sample
    "p2": dict(workers=2, batch=8, sample=32 << 10, samples=768, step_ms=20, prep_ms=12, bandwidth=None,
               validate=(0, 1, 4)),
    # ... and prep that burns CPU, 6 ms/sample: more workers than free cores cannot help
    "cpu1": dict(workers=1, batch=8, sample=32 << 10, samples=768, step_ms=10, prep_ms=6, prep="cpu", bandwidth=None,
                 validate=(2, 3)),
}
STEPS, WARMUP = 40, 30  # 30 warm-up steps drain the throttle's burst (and warm the JIT)
FRACTIONS = (0.3, 0.7)


def _rel(pred: float, meas: float) -> str:
    return f"{100 * (pred - meas) / meas:+.1f}%" if meas else "n/a"


def bench(name: str, cfg: dict, work: Path) -> list[tuple[str, float, float]]:
    from datagen import make_tfrecord_shards
    from unstall.analyze.runner import RunOptions, run_mode

    data = work / f"data-{name}"
    make_tfrecord_shards(data, shards=4, per_shard=cfg["samples"] // 4, size=cfg["sample"], seed=3)
    dataset_bytes = cfg["samples"] * cfg["sample"]
    env = {"JOB_DATA": str(data), "JOB_PREP_MS": str(cfg["prep_ms"]), "JOB_STEP_MS": str(cfg["step_ms"]),
           "JOB_WORKERS": str(cfg.get("workers", 0)), "JOB_BATCH": str(cfg["batch"]), "JOB_KIND": cfg.get("kind", "torch"),
           "JOB_PREP": cfg.get("prep", "sleep"),
           "PYTHONPATH": os.pathsep.join([str(REPO / "python-shim" / "src"), os.environ.get("PYTHONPATH", "")])}
    job_cmd = [sys.executable, str(Path(__file__).resolve()), "job"]
    out = work / f"analyze-{name}"
    cli = [sys.executable, "-m", "unstall", "analyze", "--steps", str(STEPS), "--warmup", str(WARMUP), "--out", str(out)]
    if cfg["bandwidth"]:
        cli += ["--storage-bandwidth", str(cfg["bandwidth"])]
    if cfg.get("validate"):
        cli += ["--validate-workers", ",".join(map(str, cfg["validate"]))]
    cli += ["--", *job_cmd]
    print(f"\n[{name}] {cfg}\n[{name}] $ " + " ".join(cli[1:]), flush=True)
    t0 = time.monotonic()
    subprocess.run(cli, env={**os.environ, **env}, check=True)
    print(f"[{name}] analyze took {time.monotonic() - t0:.0f} s", flush=True)
    (sec,) = json.loads((out / "analyze.json").read_text())["sections"]
    from unstall.analyze.model import Analysis

    analysis = Analysis(**sec["analysis"])
    rows = [(f"samples/s with {v['workers']} workers (cold)", v["predicted"], v["measured"])
            for v in sec["validation"] if v["error"] is None]

    def measure(label: str, mode: str, cache_fraction: float, bandwidth, extra_env=None) -> float:
        opts = RunOptions(steps=STEPS, warmup=WARMUP, out_dir=work / f"measure-{name}",
                          storage_bandwidth=str(bandwidth) if bandwidth else None, env={**env, **(extra_env or {})})
        (doc,) = run_mode(job_cmd, mode, opts, cache_capacity=int(cache_fraction * dataset_bytes),
                          warm=cache_fraction > 0, label=f"{label}")["sections"]
        side = doc.get("sidecar") or {}
        hits, misses = side.get("hits", 0), side.get("misses", 0)
        rate = STEPS * cfg["batch"] / (doc["elapsed_ns"] / 1e9)
        print(f"[{name}] measured {label}: {rate:.1f} samples/s, cache hits {hits}/{hits + misses}", flush=True)
        return doc["elapsed_ns"] / 1e9

    if cfg["bandwidth"]:
        t_cold = analysis.t2_s
        t_nofetch = measure("cold-unthrottled", "real", 0.0, None)
        t_none = measure("cold-unthrottled-noprep", "real", 0.0, None, {"JOB_PREP_MS": "0"})
        rows.append(("fetch stall fraction", analysis.fetch_stall_fraction, max(0.0, t_cold - t_nofetch) / t_cold))
        rows.append(("prep stall fraction", analysis.prep_stall_fraction, max(0.0, t_nofetch - t_none) / t_cold))
        for f in FRACTIONS:
            t = measure(f"cache-{int(100 * f)}pct", "real", f, cfg["bandwidth"])
            rows.append((f"samples/s at {int(100 * f)}% cached", analysis.predict(f), STEPS * cfg["batch"] / t))
    g, q = cfg["step_ms"] / 1000, cfg["batch"] * cfg["prep_ms"] / 1000
    s = cfg["batch"] * cfg["sample"] / cfg["bandwidth"] if cfg["bandwidth"] else 0.0
    print(f"[{name}] configured: step {1000 * g:.0f} ms, prep {1000 * q:.0f} ms/batch, storage {1000 * s:.0f} ms/batch; "
          f"analyzer: step {1000 * analysis.step_s:.1f} ms, loader {1000 * analysis.loader_busy_per_batch_s:.1f} ms/batch "
          f"with {analysis.num_workers} workers, storage {1000 * analysis.storage_per_batch_s:.1f} ms/batch "
          f"({analysis.storage_model})")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", nargs="?", default="bench", choices=["bench", "job"])
    ap.add_argument("--config", default="all", help=f"one of {', '.join(CONFIGS)}, a comma-separated list, or all")
    ap.add_argument("--work", type=Path, default=None)
    args = ap.parse_args()
    if args.what == "job":
        job()
        return 0
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-analyze-"))
    table = []
    names = list(CONFIGS) if args.config == "all" else args.config.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        ap.error(f"unknown --config {', '.join(unknown)}; choose from {', '.join(CONFIGS)} or all")
    for name in names:
        for what, pred, meas in bench(name, CONFIGS[name], work):
            table.append((name, what, pred, meas))
    print("\n| config | quantity | unstall analyze | measured | error |\n|---|---|---|---|---|")
    for name, what, pred, meas in table:
        fmt = (lambda x: f"{100 * x:.1f}%") if "fraction" in what else (lambda x: f"{x:.1f}")
        err = f"{100 * (pred - meas):+.1f} pts" if "fraction" in what else _rel(pred, meas)
        print(f"| {name} | {what} | {fmt(pred)} | {fmt(meas)} | {err} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
