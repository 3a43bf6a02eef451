"""``DecodeShare`` between real processes (spawned, as the jobs of a search are separate processes): each batch is
decoded by one member and handed to the others through shared memory (the CPU path; on a GPU the handles are CUDA
IPC handles, the CUDA case below), a member never uses a batch whose ids are not its own, and a claimant that dies
or leaves costs the others a decode, never a batch."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

torch = pytest.importorskip("torch")

from unstall.prep.decode_share import DecodeShare, share_scope  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))
from waits import wait_until  # noqa: E402

CTX = mp.get_context("spawn")
BATCHES = 6


def _image(index: int) -> Any:
    """What decoding batch ``index`` gives, in a channels_last layout (strides survive the hand-over)."""
    t = torch.arange(2 * 3 * 5 * 4, dtype=torch.float32).view(2, 3, 5, 4) + 1000 * index
    return t.contiguous(memory_format=torch.channels_last)


def _member(rank: int, scope: bytes, device: str, barrier: Any, out: Any, peers: bool, epochs: int) -> None:
    share = DecodeShare(torch.device(device), ring=BATCHES, peers=peers)
    got, stats = [], []
    for epoch in range(epochs):
        for i in range(BATCHES):
            t = share.batch(scope, epoch, i, [10 * i + j for j in range(2)], lambda i=i: _image(i).to(device))
            got.append((t.cpu().tolist(), t.stride()))
        barrier.wait(timeout=120)  # every member read the epoch before any drops its offers
        stats.append(share.stats.as_dict())
    share.close()
    out.put((rank, got, stats))


def _run_members(k: int, device: str, peers: bool = True, epochs: int = 1
                 ) -> list[tuple[int, list[Any], list[dict[str, int]]]]:
    scope = share_scope("test", os.getpid(), device, peers)
    barrier, out = CTX.Barrier(k), CTX.Queue()
    procs = [CTX.Process(target=_member, args=(r, scope, device, barrier, out, peers, epochs)) for r in range(k)]
    for p in procs:
        p.start()
    results = [out.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


def _check_one_decode_each(results: list[tuple[int, list[Any], list[dict[str, int]]]], k: int) -> None:
    for _, got, _ in results:
        for n, (values, stride) in enumerate(got):
            assert values == _image(n % BATCHES).tolist()
            assert stride == _image(n % BATCHES).stride()
    stats = [s[0] for _, _, s in results]
    assert sum(s["decoded"] for s in stats) == BATCHES  # one decode of each batch for the k jobs
    assert sum(s["received"] for s in stats) == (k - 1) * BATCHES
    assert sum(s["served"] for s in stats) == (k - 1) * BATCHES
    assert all(s["fallbacks"] == 0 and s["mismatches"] == 0 for s in stats)


def test_three_processes_decode_each_batch_once_between_them() -> None:
    _check_one_decode_each(_run_members(3, "cpu"), 3)


def test_members_that_do_not_expect_each_other_share_from_their_first_contact() -> None:
    """Without ``peers`` (no ``group_size``) a member keeps no copies until another asks it for a batch or it asks
    another: the first epoch's batches may be decoded by both, the next epoch's once between them."""
    results = _run_members(2, "cpu", peers=False, epochs=2)
    for _, got, _ in results:
        for n, (values, _) in enumerate(got):
            assert values == _image(n % BATCHES).tolist()
    first = [s[0] for _, _, s in results]
    # every batch decoded at least once; the first contact costs one more decode, unless the asker reached the
    # claimant while it still decoded that batch (the claimant then keeps a copy of it for the asker)
    assert sum(s["decoded"] + s["fallbacks"] for s in first) >= BATCHES, first
    assert sum(s["received"] for s in first) + sum(s["fallbacks"] for s in first) >= 1, first  # the two met
    second = [{k: s[1][k] - s[0][k] for k in s[1]} for _, _, s in results]
    assert sum(s["decoded"] for s in second) == BATCHES and sum(s["received"] for s in second) == BATCHES, second
    assert all(s["fallbacks"] == 0 for s in second), second


def test_a_member_alone_keeps_no_copies() -> None:
    share = DecodeShare(torch.device("cpu"), ring=3)
    scope = share_scope("test-lone", os.getpid())
    for i in range(3):
        share.batch(scope, 0, i, [i], lambda i=i: _image(i))
    assert len(share._offers) == 3 and all(o.tensor is None for o in share._offers)
    share.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA IPC handles between processes)")
def test_three_processes_share_each_cuda_batch_through_ipc_handles() -> None:
    _check_one_decode_each(_run_members(3, "cuda"), 3)


def _claim_and_hang(scope: bytes, claimed: Any, ids: list[int]) -> None:
    share = DecodeShare(torch.device("cpu"))

    def decode() -> Any:
        claimed.set()
        CTX.Event().wait()  # never set: this member dies holding its claim
        return _image(0)

    share.batch(scope, 0, 0, ids, decode)


def _claim_and_hold(scope: bytes, offered: Any, done: Any, ids: list[int]) -> None:
    share = DecodeShare(torch.device("cpu"), peers=True)
    share.batch(scope, 0, 0, ids, lambda: _image(0))
    offered.set()
    done.wait(timeout=120)
    share.close()


def test_a_claimant_that_dies_costs_the_others_a_decode_not_a_batch() -> None:
    scope = share_scope("test-dies", os.getpid())
    claimed = CTX.Event()
    p = CTX.Process(target=_claim_and_hang, args=(scope, claimed, [1, 2]))
    p.start()
    try:
        assert claimed.wait(timeout=120)
        p.kill()  # dead while it holds batch 0: its socket goes with it
        p.join(timeout=60)
        share = DecodeShare(torch.device("cpu"))
        t = share.batch(scope, 0, 0, [1, 2], lambda: _image(0))
        share.close()
    finally:
        p.kill()
    assert t.tolist() == _image(0).tolist()
    assert share.stats.decoded + share.stats.fallbacks == 1 and share.stats.received == 0


@contextlib.contextmanager
def _offered_by_another(scope: bytes, ids: list[int]) -> Iterator[None]:
    """Another process decoded batch 0 of epoch 0 (samples ``ids``) and keeps it on offer inside the block."""
    offered, done = CTX.Event(), CTX.Event()
    p = CTX.Process(target=_claim_and_hold, args=(scope, offered, done, ids))
    p.start()
    try:
        assert offered.wait(timeout=120)
        yield
    finally:
        done.set()
        p.join(timeout=60)


def test_a_batch_with_other_samples_is_never_used() -> None:
    scope = share_scope("test-mismatch", os.getpid())
    mine = torch.full((2, 3), 7.0)
    with _offered_by_another(scope, [1, 2]):
        share = DecodeShare(torch.device("cpu"))
        t = share.batch(scope, 0, 0, [3, 4], lambda: mine.clone())  # same batch index, other ids
        share.close()
    assert t.tolist() == mine.tolist()
    assert share.stats.mismatches == 1 and share.stats.fallbacks == 1 and share.stats.received == 0


def test_a_member_alone_decodes_everything_and_drops_old_offers() -> None:
    share = DecodeShare(torch.device("cpu"), ring=2, peers=True)
    scope = share_scope("test-alone", os.getpid())
    for i in range(5):
        assert share.batch(scope, 1, i, [i], lambda i=i: _image(i)).tolist() == _image(i).tolist()
    assert len(share._offers) == 2
    share.close()
    assert share.stats.as_dict() == {"decoded": 5, "served": 0, "received": 0, "fallbacks": 0, "mismatches": 0}
    with pytest.raises(ValueError, match="ring must hold at least 1 batch"):
        DecodeShare(torch.device("cpu"), ring=0)


def test_close_drops_a_full_ring_without_blocking_on_its_wake_ups() -> None:
    """Each dropped offer wakes the server; hundreds of them at close (the server stopping) once filled the wake
    socket's buffer and blocked close() for good."""
    share = DecodeShare(torch.device("cpu"), ring=400, peers=True)
    scope = share_scope("test-close", os.getpid())
    for i in range(400):
        share.batch(scope, 0, i, [i], lambda: torch.zeros(1))
    share.close()  # returns: the pytest timeout of the suite is the bound
    assert share.stats.decoded == 400 and not share._offers


def test_a_handle_that_cannot_be_mapped_turns_sharing_off_for_this_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the handle cannot be opened (CUDA IPC refused across containers, say), the job decodes the batch itself,
    says why once, and from then on decodes its own batches without asking."""
    scope = share_scope("test-broken", os.getpid())
    with _offered_by_another(scope, [1, 2]):
        share = DecodeShare(torch.device("cpu"))

        def refuse(meta: Any, fds: list[int]) -> Any:
            for fd in fds:
                os.close(fd)
            raise RuntimeError("CUDA error: invalid device context")

        monkeypatch.setattr(share, "_rebuild", refuse)
        mine = torch.full((2, 3), 7.0)
        assert share.batch(scope, 0, 0, [1, 2], lambda: mine.clone()).tolist() == mine.tolist()
        assert share.broken == "RuntimeError: CUDA error: invalid device context"
        assert share.batch(scope, 0, 0, [1, 2], lambda: mine.clone()).tolist() == mine.tolist()
        share.close()
    assert share.stats.fallbacks == 1 and share.stats.received == 0 and share.stats.decoded == 0


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA cannot import an IPC handle of its own process)"))])
def test_a_batch_claimed_by_this_process_is_decoded_here_on_a_gpu_and_handed_over_on_the_cpu(device: str) -> None:
    """Two loaders (or two threads of one) of this process on the same batch. On a GPU the second never imports the
    first's handle (CUDA does not import a process's own IPC memory, and the refusal surfaced at a later kernel
    launch): it decodes the batch itself. On the CPU the shared-memory fd maps in the same process: handed over.
    The same pixels either way."""
    scope = share_scope("test-same-process", os.getpid())
    first, second = DecodeShare(torch.device(device), peers=True), DecodeShare(torch.device(device), peers=True)
    try:
        a = first.batch(scope, 0, 0, [1, 2], lambda: _image(0).to(device))
        b = second.batch(scope, 0, 0, [1, 2], lambda: _image(0).to(device))
        assert b.tolist() == a.tolist() and b.data_ptr() != a.data_ptr() and second.broken is None
        handed = device == "cpu"
        assert (second.stats.received, second.stats.fallbacks) == ((1, 0) if handed else (0, 1))
        if handed:  # the claimant's server thread counts the hand-over after sending it
            wait_until(lambda: first.stats.served == 1, "the claimant counted its hand-over", timeout=30)
        assert first.stats.served == (1 if handed else 0)
        assert first.stats.decoded == 1
    finally:
        first.close()
        second.close()
