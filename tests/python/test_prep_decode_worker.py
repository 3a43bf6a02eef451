"""``PrepLoader(..., decode_workers=1)``: ``decode(device="mixed")`` in a process of its own, through a real sidecar
on the CPU (the same code runs on CUDA, where the images come back through CUDA IPC): the same batches bit for bit
as the decode on the prefetcher's thread, plain and hybrid; a refusal in the same words; a worker that dies is
followed by the decode in the loader's own process, nothing lost; the option checked by name."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_prep_mixed import _epochs, env  # noqa: F401  (the module's sidecar and JPEGs)
from test_prep_support import REPO, PrepEnv

from unstall import prep  # noqa: E402
from unstall.prep.decode_worker import DecodeWorker  # noqa: E402


def _same(a: list[list[tuple[int, np.ndarray, int]]], b: list[list[tuple[int, np.ndarray, int]]]) -> None:
    for ea, eb in zip(a, b, strict=True):
        assert [(i, label) for i, _, label in ea] == [(i, label) for i, _, label in eb]
        for (i, x, _), (_, y, _) in zip(ea, eb):
            np.testing.assert_array_equal(x, y, err_msg=f"sample {i}")


@pytest.mark.parametrize("cpu_load", [0, 0.5])
def test_a_worker_process_gives_the_threads_batches_bit_for_bit(env: tuple[PrepEnv, list[Path]],  # noqa: F811
                                                                 cpu_load: float,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    e, paths = env
    pipe = prep.Pipeline((prep.decode(device="mixed", cpu_load=cpu_load or None), prep.random_resized_crop(48),
                          prep.hflip(), prep.normalize()), layout="NHWC", dtype="bfloat16")
    here = _epochs(e, pipe, "cpu", memory_format=torch.channels_last)
    calls: list[int] = []
    real = DecodeWorker.__call__

    def counted(self: DecodeWorker, *args: Any) -> Any:
        calls.append(os.getpid())
        return real(self, *args)

    monkeypatch.setattr(DecodeWorker, "__call__", counted)
    there = _epochs(e, pipe, "cpu", memory_format=torch.channels_last, decode_workers=1)
    _same(here, there)
    assert len(calls) == 2 * ((len(paths) + 3) // 4)  # every batch of both epochs went through the worker


def test_a_refusal_comes_back_in_the_decodes_words(env: tuple[PrepEnv, list[Path]], tmp_path: Path) -> None:  # noqa: F811
    e, _ = env
    bad = tmp_path / "bad"
    (bad / "c0").mkdir(parents=True)
    (bad / "c0" / "a.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg at all")
    e.sidecar.register_dataset("bad-worker", bad)
    words = []
    for workers in (0, 1):
        with e.client() as client, prep.PrepLoader("bad-worker", prep.imagenet_train(48, decode_device="mixed"),
                                                    batch_size=1, device="cpu", client=client, epochs=1,
                                                    decode_workers=workers) as loader:
            with pytest.raises(ValueError, match=r"sample 0 .*a\.jpg") as raised:
                next(iter(loader))
            words.append(str(raised.value))
    assert words[0] == words[1]


def test_a_worker_that_dies_leaves_the_decode_to_the_loader_nothing_lost(env: tuple[PrepEnv, list[Path]]  # noqa: F811
                                                                         ) -> None:
    e, paths = env
    pipe = prep.imagenet_train(48, dtype="uint8", layout="NHWC", decode_device="mixed")
    expected = _epochs(e, pipe, "cpu", epochs=1)
    seen: list[tuple[int, Any]] = []
    with e.client() as client, prep.PrepLoader("jpegs", pipe, batch_size=4, seed=7, shuffle=True, epochs=1,
                                                client=client, with_ids=True, copy=True, device="cpu",
                                                device_prefetch=1, decode_workers=1) as loader:
        batches = iter(loader)
        first = next(batches)
        seen += list(zip(first[2].tolist(), first[0].numpy()))
        worker = loader._decode_worker.process
        assert worker is not None
        os.kill(worker.pid, signal.SIGKILL)
        with pytest.warns(RuntimeWarning, match=r"the decode worker \(pid \d+\) ended.*decoding in this process"):
            for images, _, ids in batches:
                seen += list(zip(ids.tolist(), images.numpy()))
    assert [i for i, _ in seen] == [i for i, _, _ in expected[0]] and len(seen) == len(paths)
    for (i, a), (_, b, _) in zip(seen, expected[0]):
        np.testing.assert_array_equal(a, b, err_msg=f"sample {i}")


def test_the_option_is_checked_by_name(env: tuple[PrepEnv, list[Path]]) -> None:  # noqa: F811
    e, _ = env
    with pytest.raises(ValueError, match=r"decode_workers must be 0 .* or 1 .*got 2"):
        prep.PrepLoader("jpegs", prep.imagenet_train(48, decode_device="mixed"), batch_size=4, device="cpu",
                        decode_workers=2, sidecar=e.sidecar)
    with pytest.raises(ValueError, match=r"decode_workers applies to decode\(device='mixed'\)"):
        prep.PrepLoader("jpegs", prep.imagenet_train(48), batch_size=4, device="cpu", decode_workers=1,
                        sidecar=e.sidecar)


def test_a_trainer_script_without_a_main_guard_is_not_run_again_by_the_worker(
        env: tuple[PrepEnv, list[Path]], tmp_path: Path) -> None:  # noqa: F811
    """The worker is a new interpreter running ``unstall.prep.decode_worker``, not the trainer's script again (which
    multiprocessing's spawn would do): a script with no ``if __name__ == "__main__":`` guard runs once."""
    import subprocess
    import sys

    e, _ = env
    runs = tmp_path / "runs.txt"
    script = tmp_path / "train.py"
    script.write_text(f"""
import unstall
from unstall import prep
with open({str(runs)!r}, "a") as f:
    f.write("run\\n")
client = unstall.FlightClient({e.location!r}, {e.sidecar.token!r})
with prep.PrepLoader("jpegs", prep.imagenet_train(48, dtype="uint8", decode_device="mixed"), batch_size=4,
                     device="cpu", epochs=1, client=client, decode_workers=1) as loader:
    images, labels = next(iter(loader))
    assert tuple(images.shape) == (4, 3, 48, 48), images.shape
    assert loader._decode_worker.process.batches >= 1
print("ok")
""")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                         timeout=300, env=dict(os.environ, PYTHONPATH=str(REPO / "python-shim" / "src")))
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]
    assert runs.read_text() == "run\n"
