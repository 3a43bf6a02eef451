"""benchmarks/bench_gpu.py at toy size on the CPU, through a real sidecar: every row printed, the JSON complete.
What the rows measure is not checked against any threshold: a toy run on a shared CPU measures nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_prep_mixed import NEEDS_NVIMGCODEC

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "bench_gpu.py"

TRAINING = ["model", "beside_thread", "beside_process",
            "torch", "unstall", "prep", "prep_device", "prep_mixed", "prep_mixed_proc", "prep_mixed_nv",
            "prep_mixed_whole", "prep_hybrid", "hp_torch", "hp_prep", "hp_mixed", "hp_mixed_solo"]
ALONE = ["torch_alone", "unstall_alone", "prep_alone", "prep_device_alone", "prep_mixed_alone",
         "prep_mixed_proc_alone", "prep_mixed_nv_alone", "prep_mixed_whole_alone", "prep_hybrid_alone"]


@pytest.mark.slow
def test_toy_run_prints_every_row_and_writes_them_as_json(sidecar_jar: Path, tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    env = dict(os.environ, UNSTALL_SIDECAR_JAR=str(sidecar_jar), UNSTALL_HOME=str(tmp_path / "home"))
    run = subprocess.run([sys.executable, str(BENCH), "--toy", "--device", "cpu", "--cache-dir", str(tmp_path / "data"),
                          "--json", str(out)], capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL,
                         timeout=900)  # a bound on a hang, not on the speed
    assert run.returncode == 0, f"bench_gpu.py --toy exited {run.returncode}:\n{run.stderr[-4000:]}"

    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert [r["key"] for r in rows] == TRAINING + ALONE
    for r in rows:
        assert r["images_per_s"] > 0, r
        assert r["input_wall_ms_per_batch"] >= 0, r  # the stall the trainer sees, in every row
        assert f"| {r['row']} | {r['images_per_s']:,.0f} |" in run.stdout, r["row"]
    assert rows[0]["of_model_alone"] == 1.0
    # the training thread's CPU in the steps: every row that trains in this process, none that does not
    assert [r["key"] for r in rows if r["step_cpu_ms_per_batch"] is not None] == [
        key for key in TRAINING if not key.startswith("hp_")]
    assert all(r["step_cpu_ms_per_batch"] > 0 for r in rows if r["step_cpu_ms_per_batch"] is not None)
    assert "| training thread CPU ms per step |" in run.stdout
    assert "| training thread wall ms per batch in next() |" in run.stdout
    assert [r["key"] for r in rows if r["copy_cpu_ms_per_batch"] is not None] == [
        "unstall", "prep_device", "prep_mixed", "prep_mixed_proc", "prep_mixed_nv", "prep_mixed_whole", "prep_hybrid",
        "hp_prep", "hp_mixed", "hp_mixed_solo", "unstall_alone", "prep_device_alone", "prep_mixed_alone",
        "prep_mixed_proc_alone", "prep_mixed_nv_alone",
        "prep_mixed_whole_alone", "prep_hybrid_alone"]
    by_key = {r["key"]: r for r in rows}
    shared, solo = by_key["hp_mixed"]["decodes"], by_key["hp_mixed_solo"]["decodes"]
    steps = doc["settings"]["jobs"] * (doc["settings"]["warmup"] + doc["settings"]["steps"])
    assert shared["received"] > 0 and shared["decoded"] + shared["received"] + shared["fallbacks"] >= steps, shared
    assert solo is None  # device_share=False: every job decodes every batch, nothing to count
    assert "- HP search, 2 jobs: 2 PrepLoaders(device='cpu') in one group, decode(device='mixed'), each batch " \
           "decoded once (device_share): the jobs decoded" in run.stdout
    progress = [line for line in run.stderr.splitlines() if line.startswith("[")]
    assert len(progress) == len(rows), run.stderr[-4000:]
    for head in ("- command: ", "- date: ", "- machine: ", "- GPU: none (device cpu)", "- commit: ",
                 "- decode(device='mixed') rows: backend 'auto', "):
        assert any(line.startswith(head) for line in run.stdout.splitlines()), head
    assert doc["device"] == "cpu" and doc["settings"]["toy"] is True


@pytest.mark.slow
def test_a_row_that_fails_is_a_row_of_the_table_and_the_others_still_run(sidecar_jar: Path, tmp_path: Path) -> None:
    """``--decode-backend nvimgcodec`` on a machine without nvImageCodec (its import blocked here, by a
    ``sitecustomize``): the mixed row says why it failed, the run goes on to the next row, prints the table and exits
    non-zero naming the row."""
    blocker = tmp_path / "no-nvimgcodec"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['nvidia.nvimgcodec'] = None\n")
    out = tmp_path / "gpu.json"
    env = dict(os.environ, UNSTALL_SIDECAR_JAR=str(sidecar_jar), UNSTALL_HOME=str(tmp_path / "home"),
               PYTHONPATH=os.pathsep.join([str(blocker), *filter(None, [os.environ.get("PYTHONPATH")])]))
    run = subprocess.run([sys.executable, str(BENCH), "--toy", "--device", "cpu", "--cache-dir", str(tmp_path / "data"),
                          "--decode-backend", "nvimgcodec", "--rows", "prep_mixed,hp_prep", "--no-loader-alone",
                          "--json", str(out)], capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL,
                         timeout=900)
    assert run.returncode != 0 and "rows failed: prep_mixed" in run.stderr, run.stderr[-4000:]
    rows = {r["key"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["model", "prep_mixed", "hp_prep"]
    assert "needs NVIDIA nvImageCodec" in rows["prep_mixed"]["error"] and rows["prep_mixed"]["images_per_s"] == 0
    assert rows["hp_prep"]["error"] is None and rows["hp_prep"]["images_per_s"] > 0
    assert "| failed: ImportError: decode(device='mixed', backend='nvimgcodec') needs NVIDIA nvImageCodec" in run.stdout


@pytest.mark.slow
def test_decode_share_bench_toy_run_counts_one_decode_per_batch_when_shared(sidecar_jar: Path, tmp_path: Path) -> None:
    """benchmarks/bench_decode_share.py at toy size on the CPU: both modes run (ABBA), the shared one's jobs took
    batches from each other's decodes and the ratio is printed. No threshold on the rates."""
    out = tmp_path / "share.json"
    env = dict(os.environ, UNSTALL_SIDECAR_JAR=str(sidecar_jar), UNSTALL_HOME=str(tmp_path / "home"))
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_decode_share.py"), "--toy", "--device", "cpu",
                          "--cache-dir", str(tmp_path / "data"), "--json", str(out)], capture_output=True, text=True,
                         env=env, stdin=subprocess.DEVNULL, timeout=900)  # a bound on a hang, not on the speed
    assert run.returncode == 0, run.stderr[-4000:]
    doc = json.loads(out.read_text())
    share, solo = doc["rows"]
    assert (share["mode"], solo["mode"]) == ("share", "solo") and len(share["runs"]) == len(solo["runs"]) == 2
    assert share["decodes"]["received"] > 0 and not share["solo_counted"] and solo["solo_counted"]
    assert share["images_per_s"] > 0 and solo["images_per_s"] > 0
    assert f"device_share / without: **{doc['ratio']:.2f}x** images/s" in run.stdout


@pytest.mark.slow
def test_hybrid_bench_toy_run_reports_each_mode_and_the_split(sidecar_jar: Path, tmp_path: Path) -> None:
    """benchmarks/bench_hybrid.py at toy size on the CPU, the sidecar and the job each on a core: each mode runs twice
    in rotation, and the hybrid rows report the sidecar's share of each batch from the group's stats. No threshold on
    the rates."""
    out = tmp_path / "hybrid.json"
    env = dict(os.environ, UNSTALL_SIDECAR_JAR=str(sidecar_jar), UNSTALL_HOME=str(tmp_path / "home"))
    cpus = ["--sidecar-cpus", "1", "--trainer-cpus", "1"] if (os.cpu_count() or 1) >= 2 else []
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_hybrid.py"), "--toy", "--device", "cpu",
                          *cpus, "--cache-dir", str(tmp_path / "data"), "--json", str(out)], capture_output=True,
                         text=True, env=env, stdin=subprocess.DEVNULL, timeout=900)  # a bound on a hang, not the speed
    assert run.returncode == 0, run.stderr[-4000:]
    rows = {r["mode"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["sidecar", "device", "hybrid"] and all(len(r["runs"]) == 2 for r in rows.values())
    assert all(r["images_per_s"] > 0 for r in rows.values())
    assert rows["sidecar"]["hybrid"] == rows["device"]["hybrid"] == [] and len(rows["hybrid"]["hybrid"]) == 2
    for split in rows["hybrid"]["hybrid"]:
        assert 0 <= split["cpu_rows"] <= split["batch_size"] == 8 and split["auto"] is True
        assert split["samples_prepared"] + split["samples_encoded"] > 0
    assert "hybrid / the faster of the two: **" in run.stdout


@NEEDS_NVIMGCODEC
def test_mixed_backends_bench_runs_its_variants_in_one_rotation(tmp_path: Path) -> None:
    """benchmarks/bench_mixed_backends.py at toy size on the CPU with ``--variants``: a row per decoder (the two
    backends, then nvImageCodec with roi=False and with hw_decoder_load), each timed as often, with its busy cores; a
    variant it does not know is refused by name. No threshold on the rates."""
    out = tmp_path / "mixed.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_mixed_backends.py"), "--images", "8", "--size", "64x48",
           "--batch", "4", "--batches", "2", "--crop", "32", "--repeats", "2", "--cache-dir", str(tmp_path / "data")]
    run = subprocess.run([*cmd, "--variants", "whole,hw50", "--json", str(out)], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL, timeout=600)  # a bound on a hang, not on the speed
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [r["backend"] for r in rows] == ["torchvision", "nvimgcodec", "nvimgcodec whole", "nvimgcodec hw50"]
    assert set(result["resample_s"]) == {"one roi_align per stack of like windows", "one roi_align over a padded stack",
                                         "one roi_align per window"}
    assert all(len(v) == 2 for v in result["resample_s"].values()) and 1 <= result["stacks_per_batch"] <= 4
    assert len(result["check_s"]) == 2 and all(s > 0 for s in result["check_s"])
    assert all(len(r["runs"]) == 2 and r["images_per_s"] > 0 and r["busy_cores"] > 0 for r in rows)
    bad = subprocess.run([*cmd, "--variants", "hw150"], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                         timeout=120)
    assert bad.returncode == 2 and "--variants: unknown variant 'hw150' (whole, hw0..hw100)" in bad.stderr
