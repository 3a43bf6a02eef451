"""unstall._alloc: DataLoader workers keep freed heap for the next batch (glibc only)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import torch.utils.data as tud

from unstall import _alloc

glibc = pytest.mark.skipif(_alloc._mallopt() is None, reason="needs glibc's mallopt")

# Allocates a batch of 64 payloads of 110 KB, frees it, allocates it again and prints the minor page faults
# of the second round: with glibc's defaults the freed heap went back to the kernel and faults in again.
_PROBE = """
import resource, sys
sys.path[:0] = {path!r}
if {tuned}:
    from unstall._alloc import tune_allocator
    assert tune_allocator()
src = bytes(110_000)
batch = [bytes(bytearray(src)) for _ in range(64)]
del batch
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
batch = [bytes(bytearray(src)) for _ in range(64)]
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _second_round_faults(tuned: bool) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "UNSTALL_WORKER_MALLOC"}
    out = subprocess.run([sys.executable, "-c", _PROBE.format(path=sys.path, tuned=tuned)], env=env,
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@glibc
def test_kept_heap_is_reused_without_page_faults() -> None:
    default, tuned = _second_round_faults(False), _second_round_faults(True)
    # 64 x 110 KB is about 1700 pages: the default faults most of them in again, the kept heap none
    assert default > 1000
    assert tuned < default // 10


@glibc
@pytest.mark.parametrize("env", [{"UNSTALL_WORKER_MALLOC": "system"}, {"MALLOC_TRIM_THRESHOLD_": "131072"},
                                 {"MALLOC_MMAP_THRESHOLD_": "131072"}])
def test_the_users_choice_wins(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert _alloc.tune_allocator() is False


class _Probe(tud.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> Any:
        return _alloc.tune_worker_allocator()


@glibc
def test_only_dataloader_workers_are_tuned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UNSTALL_WORKER_MALLOC", raising=False)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert [bool(x) for x in tud.DataLoader(_Probe(), batch_size=None, num_workers=1)] == [True, True]
    monkeypatch.setattr(_alloc, "_checked_pid", 0)
    assert _alloc.tune_worker_allocator() is False  # the main process keeps glibc's defaults
