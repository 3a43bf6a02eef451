"""Data echoing (``unstall.echo``) on every loader, with a real sidecar and real torch / TensorFlow: each
prepared batch (or sample) handed out exactly ``echo`` times per epoch, in another order than the fresh stream
and with other repeat positions each epoch; exact ``loader.stats()`` counts; a prep group prepares each batch
once however much its members echo; bad option values name the option; the analyzer's echo what-if."""

from __future__ import annotations

import threading
import zlib
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, List, Sequence, Tuple

import pytest

from test_prep_support import BATCH, N_SAMPLES, PIPELINE_NCHW, PrepEnv, start_env

import unstall  # noqa: E402  (after test_prep_support put this checkout's shim first)
from unstall import prep  # noqa: E402
from unstall.analyze import model  # noqa: E402
from unstall.analyze.model import Run  # noqa: E402
from unstall.torch import DataLoader, Dataset  # noqa: E402
from datagen import make_image_folder  # noqa: E402

E = 3
NUM_BATCHES = -(-N_SAMPLES // BATCH)


def ident(data: memoryview) -> int:
    """A sample's identity: the CRC of its bytes (the images are all different)."""
    return zlib.crc32(bytes(data))


def check_batch_echo(fresh: List[Tuple[int, ...]], echoed: List[Tuple[int, ...]], e: int) -> List[int]:
    """Every fresh batch exactly ``e`` times, never twice in a row while another is in the window, not in the
    fresh order repeated; returns the echoed stream as indices into ``fresh`` (its repeat positions)."""
    assert Counter(echoed) == Counter({b: e for b in fresh})
    assert echoed != [b for b in fresh for _ in range(e)] and echoed != fresh * e
    for i in range(len(echoed) - 1):  # back to back only where nothing else is left: the epoch's tail
        assert echoed[i] != echoed[i + 1] or set(echoed[i:]) == {echoed[i]}, f"repeats back to back at {i}"
    pos = {b: i for i, b in enumerate(fresh)}
    return [pos[b] for b in echoed]


def check_example_echo(fresh: Sequence[int], batches: List[Tuple[int, ...]], e: int, size: int) -> None:
    assert Counter(i for b in batches for i in b) == Counter({i: e for i in fresh})
    assert all(len(b) == size for b in batches[:-1]) and 0 < len(batches[-1]) <= size


# -- unstall.torch.DataLoader ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("echo-imgs")
    make_image_folder(root, ["a", "b", "c"], per_class=9, seed=4)  # 27 samples: 7 batches of 4, the last partial
    return root


def _epochs(loader: DataLoader, n: int) -> List[List[Tuple[int, ...]]]:
    return [[tuple(int(v) for v in ids) for ids, _ in loader] for _ in range(n)]


@pytest.mark.parametrize("level", ["batch", "example"])
def test_dataloader_with_two_workers_echoes_each_batch_exactly_e_times(
        sidecar: unstall.Sidecar, images: Path, level: str) -> None:
    ds = Dataset(f"echo-{level}", root=images, sidecar=sidecar, loader=ident)
    plain = DataLoader(ds, batch_size=4, shuffle=True, seed=7, num_workers=2)
    echoed = DataLoader(ds, batch_size=4, shuffle=True, seed=7, num_workers=2, echo=E, echo_level=level)
    fresh, got = _epochs(plain, 2), _epochs(echoed, 2)
    assert len(echoed) == (E * len(plain) if level == "batch" else -(-E * 27 // 4))
    if level == "batch":
        positions = [check_batch_echo(f, g, E) for f, g in zip(fresh, got)]
        assert positions[0] != positions[1], "each epoch reshuffles its repeats"
    else:
        for f, g in zip(fresh, got):
            check_example_echo([i for b in f for i in b], g, E, 4)
        assert got[0] != got[1]
    assert [len(g) for g in got] == [len(echoed)] * 2
    st = echoed.stats()
    assert (st.echo, st.echo_level, st.batches, st.fresh_batches) == (E, level, len(echoed), len(plain))
    assert (st.samples_seen, st.fresh_samples) == (E * 27, 27)
    assert (st.total.batches, st.total.fresh_batches, st.total.samples_seen, st.total.fresh_samples) == (
        2 * len(echoed), 2 * len(plain), 2 * E * 27, 2 * 27)
    p = plain.stats()
    assert (p.echo, p.batches, p.fresh_batches, p.samples_seen, p.fresh_samples) == (1, 7, 7, 27, 27)
    assert _epochs(DataLoader(ds, batch_size=4, shuffle=True, seed=7, echo=E, echo_level=level), 1)[0] == got[0], \
        "the order is a function of (seed, epoch): the same without workers, in another loader"


def test_dataloader_state_is_taken_between_epochs_with_echo(sidecar: unstall.Sidecar, images: Path) -> None:
    loader = DataLoader(Dataset("echo-state", root=images, sidecar=sidecar, loader=ident), batch_size=4, seed=1,
                        shuffle=True, echo=2)
    it = iter(loader)
    next(it)
    with pytest.raises(ValueError, match="echo=2"):
        loader.state_dict()
    for _ in it:
        pass
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["batches_yielded"] == 0
    iter(loader)  # epoch 1 made, nothing handed out yet: still its start
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["batches_yielded"] == 0


@pytest.mark.parametrize("kwargs, option", [({"echo": 0}, "echo"), ({"echo": 1.5}, "echo"),
                                            ({"echo_level": "foo"}, "echo_level")])
def test_bad_echo_options_name_the_option(sidecar: unstall.Sidecar, images: Path, kwargs: dict, option: str) -> None:
    ds = Dataset("echo-bad", root=images, sidecar=sidecar)
    with pytest.raises(ValueError, match=f"^{option} must be"):
        DataLoader(ds, batch_size=4, **kwargs)
    with pytest.raises(ValueError, match=f"^{option} must be"):
        prep.PrepLoader("imgs", PIPELINE_NCHW, batch_size=BATCH, **kwargs)


# -- coordinated prep ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrepEnv]:
    yield from start_env(tmp_path_factory.mktemp("prep-echo"))


def _member(env: PrepEnv, seed: int, out: List[Any], **kwargs: Any) -> None:
    with env.client() as client, prep.PrepLoader("imgs", PIPELINE_NCHW, batch_size=BATCH, seed=seed, epochs=2,
                                                  client=client, with_ids=True, join_timeout=120, **kwargs) as loader:
        epochs = [[tuple(int(i) for i in ids) for _, _, ids in loader] for _ in range(2)]
        out.append((epochs, loader.echo_counts.as_dict(), loader.membership.group, len(loader)))


def test_a_prep_group_of_two_members_each_echo_and_the_sidecar_prepares_once(env: PrepEnv) -> None:
    results: List[Any] = []
    threads = [threading.Thread(target=_member, args=(env, 31, results), kwargs=dict(group_size=2, echo=E))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert len(results) == 2, "both members finished"
    reference: List[Any] = []
    _member(env, 31, reference)  # the same group batches, unechoed (a group of its own: the first one closed)
    fresh = reference[0][0]
    assert len(fresh[0]) == NUM_BATCHES
    for epochs, counts, _group, n in results:
        assert n == E * NUM_BATCHES
        positions = [check_batch_echo(f, g, E) for f, g in zip(fresh, epochs)]
        assert positions[0] != positions[1]
        assert counts["total"] == {"batches": 2 * E * NUM_BATCHES, "samples": 2 * E * N_SAMPLES,
                                   "fresh_batches": 2 * NUM_BATCHES, "fresh_samples": 2 * N_SAMPLES}
    assert results[0][2] == results[1][2], "the echo factor is not part of the group key"
    s = env.group_stats(results[0][2])
    assert s["batches_prepared_per_epoch"] == {"0": NUM_BATCHES, "1": NUM_BATCHES}, "prepared once per epoch"
    assert s["batches_served"] == 2 * 2 * NUM_BATCHES


def test_a_prep_member_echoes_examples(env: PrepEnv) -> None:
    out: List[Any] = []
    _member(env, 32, out, echo=2, echo_level="example")
    epochs, counts, group, n = out[0]
    for batches in epochs:
        check_example_echo(range(N_SAMPLES), batches, 2, BATCH)
        assert len(batches) == n == -(-2 * N_SAMPLES // BATCH)
    assert epochs[0] != epochs[1]
    assert env.group_stats(group)["batches_prepared_per_epoch"] == {"0": NUM_BATCHES, "1": NUM_BATCHES}


def test_tf_dataset_echoes(env: PrepEnv) -> None:
    pytest.importorskip("tensorflow", reason="TensorFlow is an optional extra (pip install tensorflow-cpu)")
    import unstall.tf

    with env.client() as client:
        ds = unstall.tf.dataset("imgs", PIPELINE_NCHW, batch_size=BATCH, seed=33, epochs=1, client=client,
                                with_ids=True, echo=2)
        got = [tuple(int(i) for i in ids.numpy()) for _, _, ids in ds]
        counts = unstall.tf.echo_counts(ds)
        group = unstall.tf.membership(ds).group
    ref: List[Any] = []
    _member(env, 33, ref)
    check_batch_echo(ref[0][0][0], got, 2)
    assert counts.total == {"batches": 2 * NUM_BATCHES, "samples": 2 * N_SAMPLES, "fresh_batches": NUM_BATCHES,
                            "fresh_samples": N_SAMPLES}
    assert env.group_stats(group)["batches_prepared_per_epoch"] == {"0": NUM_BATCHES}
    with pytest.raises(ValueError, match="^echo_level must be"):
        unstall.tf.dataset("imgs", PIPELINE_NCHW, batch_size=BATCH, echo_level="foo")


# -- the analyzer's what-if ------------------------------------------------------------------------


def test_the_echo_what_if_divides_the_upstream_work_per_step() -> None:
    g, q, n, b = 0.010, 0.030, 10, 8  # a data-bound job: 10 ms step, 30 ms of loader work per batch, 1 worker
    runs = {m: Run(mode=m, steps=n, batch_size=b, num_workers=1, elapsed_s=t)
            for m, t in (("synthetic", n * g), ("cached", n * q), ("cold", n * q))}
    a = model.analyze(runs, dataset_bytes=100 * 4096, num_samples=100, storage_Bps=1e12)
    rows = {r["echo"]: r for r in a.echo_curve}
    assert a.echo == 1 and sorted(rows) == [1, 2, 3, 4]
    assert rows[1]["step_s"] == pytest.approx(q, rel=1e-3)
    assert rows[2]["step_s"] == pytest.approx(q / 2, rel=1e-3)
    assert rows[4]["step_s"] == pytest.approx(g, rel=1e-3), "the trainer's own step is the floor"
    assert rows[2]["stall_s"] == pytest.approx(q / 2 - g, rel=1e-3)
    assert rows[2]["fresh_samples_per_s"] == pytest.approx(b / q, rel=1e-3), "as many fresh samples/s as before"
    from unstall.analyze import report

    text = "\n".join(report.echo_lines(a))
    assert "with echo=2 the data stall would drop from 66.7% to 33.3%" in text and "1/2" in text


ECHO_JOB = """
import os, time
from unstall.torch import DataLoader, Dataset

def keep(b):
    return b

if __name__ == "__main__":
    ds = Dataset("job", root=os.environ["JOB_DATA"], format="tfrecord")
    for _ in DataLoader(ds, batch_size=4, shuffle=True, seed=0, collate_fn=keep, echo=2):
        time.sleep(0.005)
"""


def test_unstall_analyze_reports_the_echo_in_use_and_the_what_if(tmp_path: Path, sidecar_jar: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    from datagen import make_tfrecord_shards

    make_tfrecord_shards(tmp_path / "data", shards=2, per_shard=16, size=4096, seed=5)  # 8 batches, 16 echoed
    script = tmp_path / "job.py"
    script.write_text(ECHO_JOB)
    env = {**os.environ, "JOB_DATA": str(tmp_path / "data"), "UNSTALL_SIDECAR_JAR": str(sidecar_jar),
           "UNSTALL_PROGRESS": "0"}
    out = tmp_path / "out"
    # Storage throttled to 100 KiB/s: 16 KiB per batch, far slower than the 5 ms step (data-bound).
    p = subprocess.run([sys.executable, "-m", "unstall", "analyze", "--out", str(out), "--steps", "4", "--warmup", "1",
                        "--max-cache", "1MiB", "--storage-bandwidth", "100KiB", "--", str(script)],
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    sec = json.loads((out / "analyze.json").read_text())["sections"][0]
    assert {m: r["echo"] for m, r in sec["runs"].items()} == {"synthetic": 2, "cached": 2, "cold": 2}
    assert sec["runs"]["cold"]["epoch_batches"] == 16, "len(loader) counts the echoed batches"
    a = sec["analysis"]
    assert a["echo"] == 2 and [r["echo"] for r in a["echo_curve"]] == [1, 2, 3, 4]
    stalls = [r["stall_s"] for r in a["echo_curve"]]
    assert stalls == sorted(stalls, reverse=True), "more echoing, less stall"
    text = (out / "analyze.txt").read_text()
    assert "the job runs with echo=2" in text and "with echo=3 the data stall would drop from" in text
    assert "echo (predicted, cold cache)" in (out / "analyze.html").read_text()
