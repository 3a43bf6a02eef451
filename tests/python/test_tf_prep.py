"""unstall.tf with real TensorFlow (CPU): tf.data.Dataset over a coordinated prep group, member processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from test_prep_support import BATCH, N_SAMPLES, SHIM, SIZE, PrepEnv, start_env, wait_all

NUM_BATCHES = -(-N_SAMPLES // BATCH)

pytest.importorskip("tensorflow", reason="TensorFlow is an optional extra (pip install tensorflow-cpu)")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrepEnv]:
    yield from start_env(tmp_path_factory.mktemp("prep-tf"))


def _complete_and_identical(results: list[dict], epoch: str) -> None:
    for r in results:
        ids = sorted(i for b in r["epochs"][epoch] for i in b["ids"])
        assert ids == list(range(N_SAMPLES)), f"member {r['pid']}: every sample exactly once"
    for r in results[1:]:
        assert r["epochs"][epoch] == results[0]["epochs"][epoch], "identical batches across members"


def test_three_tf_jobs_share_one_group_with_model_fit(env: PrepEnv, tmp_path: Path) -> None:
    outs = [tmp_path / f"tf{i}.json" for i in range(3)]
    procs = [env.member(o, "tf", "21", "3", "2", "60", "0", "NHWC") for o in outs]
    logs = wait_all(procs)
    assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(logs)[-4000:]
    results = [json.loads(o.read_text()) for o in outs]
    assert len({r["info"]["group"] for r in results}) == 1
    _complete_and_identical(results, "0")
    assert results[0]["epochs"]["0"][0]["shape"] == [BATCH, SIZE, SIZE, 3]
    assert results[0]["element_spec"][0] == (
        f"TensorSpec(shape=(None, {SIZE}, {SIZE}, 3), dtype=tf.float32, name=None)")
    for r in results:  # epoch 1 went through model.fit
        assert len(r["fit_loss"]) == 1 and r["fit_loss"][0] > 0
    s = env.group_stats(results[0]["info"]["group"])
    assert s["batches_prepared_per_epoch"] == {"0": NUM_BATCHES, "1": NUM_BATCHES}, "prepared once per epoch"
    assert s["batches_served"] == 3 * 2 * NUM_BATCHES
    assert 0 < s["staging_peak_bytes"] <= s["staging_limit_bytes"]


def test_a_torch_job_and_a_tf_job_share_one_group(env: PrepEnv, tmp_path: Path) -> None:
    outs = [tmp_path / "torch.json", tmp_path / "tf.json"]
    procs = [env.member(outs[0], "torch", "22", "2", "2", "60", "0"),
             env.member(outs[1], "tf", "22", "2", "2", "60", "0", "NCHW", "flight")]  # one maps, one receives
    logs = wait_all(procs)
    assert [p.returncode for p in procs] == [0, 0], "\n".join(logs)[-4000:]
    torch_r, tf_r = (json.loads(o.read_text()) for o in outs)
    assert torch_r["info"]["group"] == tf_r["info"]["group"]
    _complete_and_identical([torch_r, tf_r], "0")  # same ids, same tensor bytes in torch and in TF
    s = env.group_stats(tf_r["info"]["group"])
    assert s["batches_prepared_per_epoch"] == {"0": NUM_BATCHES, "1": NUM_BATCHES}
    assert s["batches_served"] == 2 * 2 * NUM_BATCHES


SPEC_SCRIPT = r'''
import json, sys
import tensorflow as tf
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
import unstall, unstall.tf
from unstall import prep
client = unstall.FlightClient(sys.argv[1], sys.argv[2])
out = {}
pipe = prep.Pipeline((prep.decode(), prep.random_resized_crop(16), prep.hflip(), prep.normalize()), layout="NHWC")
ds = unstall.tf.dataset("imgs", pipe, batch_size=8, seed=4, drop_last=True, client=client)
out["spec"] = [str(s) for s in ds.element_spec]
out["prefetched"] = [int(x.shape[0]) for x, y in ds.prefetch(tf.data.AUTOTUNE)]
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
dist = strategy.experimental_distribute_dataset(ds)
per_replica = []
for x, y in dist:
    per_replica.append([int(v.shape[0]) for v in strategy.experimental_local_results(x)])
out["per_replica"] = per_replica
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((16, 16, 3)), tf.keras.layers.Conv2D(2, 3),
                                 tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(3)])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
hist = model.fit(ds, epochs=2, verbose=0)
out["fit_epochs"] = len(hist.history["loss"])
out["epochs_read"] = unstall.tf.membership(ds).info["start_epoch"]
raw = unstall.tf.dataset("imgs", None, batch_size=8, seed=4, client=client)
out["raw_spec"] = [str(s) for s in raw.element_spec]
decoded = raw.unbatch().map(lambda b, y: (tf.image.resize(tf.io.decode_image(b, channels=3, expand_animations=False), [16, 16]), y))
out["raw_decoded"] = [list(x.shape) for x, y in decoded.take(3)]
out["raw_count"] = sum(1 for _ in raw.unbatch())
try:
    unstall.tf.dataset("imgs", {"ops": [{"op": "decode"}, {"op": "center_crop", "size": 0}]}, batch_size=8, client=client)
except unstall.InvalidRequestError as e:
    out["error"] = str(e)
print("RESULT " + json.dumps(out))
'''


def _run_tf_script(env: PrepEnv, script: str) -> dict:
    """Runs a TensorFlow script against the sidecar in a process of its own (CPU only); its RESULT line's JSON."""
    env_vars = dict(os.environ, PYTHONPATH=str(SHIM), TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    p = subprocess.run([sys.executable, "-c", script, env.location, env.sidecar.token], env=env_vars,
                       capture_output=True, text=True, timeout=240)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and line, (p.stdout + p.stderr)[-4000:]
    return json.loads(line[0][7:])


def test_tf_dataset_element_spec_prefetch_strategy_and_raw(env: PrepEnv) -> None:
    out = _run_tf_script(env, SPEC_SCRIPT)
    assert out["spec"] == ["TensorSpec(shape=(8, 16, 16, 3), dtype=tf.float32, name=None)",
                           "TensorSpec(shape=(8,), dtype=tf.int64, name=None)"]
    assert out["prefetched"] == [8] * (N_SAMPLES // 8)  # drop_last: only full batches
    assert out["per_replica"] == [[4, 4]] * (N_SAMPLES // 8), "each replica gets half of every global batch"
    assert out["fit_epochs"] == 2
    assert out["raw_spec"] == ["TensorSpec(shape=(None,), dtype=tf.string, name=None)",
                               "TensorSpec(shape=(None,), dtype=tf.int64, name=None)"]
    assert out["raw_decoded"] == [[16, 16, 3]] * 3
    assert out["raw_count"] == N_SAMPLES
    assert "prep op #1 'center_crop'" in out["error"] and '"size"' in out["error"]


DEVICE_SCRIPT = r'''
import json, sys
import numpy as np
import tensorflow as tf
import unstall, unstall.tf
from unstall import prep
client = unstall.FlightClient(sys.argv[1], sys.argv[2])
pipe = prep.Pipeline((prep.decode(), prep.random_resized_crop(16), prep.hflip()), layout="NHWC", dtype="uint8")
def read(**kw):
    ds = unstall.tf.dataset("imgs", pipe, batch_size=8, seed=9, with_ids=True, client=client, **kw)
    out = [(x.numpy(), y.numpy(), i.numpy(), x.device) for x, y, i in ds]
    unstall.tf.membership(ds).leave()
    return ds, out
host_ds, host = read()
dev_ds, dev = read(device="/cpu:0", device_prefetch=3)
same = len(host) == len(dev) and all(
    np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[2]) for a, b in zip(host, dev))
try:
    unstall.tf.dataset("imgs", pipe, batch_size=8, seed=9, client=client, device="/cpu:0", device_prefetch=0)
    bad = None
except ValueError as e:
    bad = str(e)
print("RESULT " + json.dumps({"batches": len(dev), "same": same, "devices": sorted({d for *_, d in dev}),
                              "ids": sorted(int(v) for *_, i, _ in dev for v in i), "spec": str(dev_ds.element_spec[0]),
                              "bad": bad}))
'''


def test_tf_dataset_on_a_device_yields_the_host_batches(env: PrepEnv) -> None:
    """device=: the batches prefetched to a TensorFlow device are the host batches, every sample once."""
    out = _run_tf_script(env, DEVICE_SCRIPT)
    assert out["batches"] == NUM_BATCHES and out["same"], out
    assert out["ids"] == list(range(N_SAMPLES))
    assert all(d.endswith("CPU:0") for d in out["devices"]), out["devices"]
    assert out["spec"] == "TensorSpec(shape=(None, 16, 16, 3), dtype=tf.uint8, name=None)"
    assert "device_prefetch" in out["bad"] and "0" in out["bad"]
