"""A fault never ends training: a real sidecar killed (SIGKILL) or hung (SIGSTOP) at random points of a
real torch DataLoader's epochs, and every sample delivered exactly once per epoch (bytes and labels
checked against the files); one sidecar per home however many processes start together."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
from contextlib import suppress
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

import unstall
from unstall.protocol import batch_to_numpy
from unstall.recovery import Deadlines
from unstall.torch import DataLoader, Dataset
from waits import send_signal, wait_until
from fault_trials import count_epoch, keep, lost_and_duplicated, make_dataset, serve_standalone, state_pid

EPOCHS = 3
BATCH = 10
N = 200
FAST = Deadlines(call=5.0, index=60.0, health_interval=0.3, health=1.5, recovery=120.0)


class Outages(logging.Handler):
    """Counts the shim's one warning line per outage."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def outages() -> Iterator[Outages]:
    handler = Outages()
    logger = logging.getLogger("unstall")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def _fault_points(seed: int, count: int) -> set[int]:
    """``count`` distinct random batch numbers of the EPOCHS epochs (global numbering)."""
    per_epoch = N // BATCH
    return set(random.Random(seed).sample(range(1, EPOCHS * per_epoch - 1), count))


def _assert_every_epoch_whole(epochs: list, files: dict, seed: int) -> None:
    for e, (seen, wrong) in enumerate(epochs):
        lost, duplicated = lost_and_duplicated(seen, files)
        assert (lost, duplicated, wrong) == (0, 0, 0), (
            f"epoch {e} (seed {seed}): {lost} samples lost, {duplicated} duplicated, {wrong} not matching a file")
        assert sum(seen.values()) == N


def _epochs_signalling_the_sidecar(start_sidecar, tmp_path: Path, sig: signal.Signals, count: int,
                                   clairvoyant: bool) -> tuple[unstall.Sidecar, list[int]]:
    """EPOCHS epochs of a 2-worker shuffled DataLoader over an embedded sidecar (MinIO cache smaller than
    the dataset, disk tier), sending ``sig`` to the sidecar at ``count`` random batches; asserts every
    epoch delivered every sample exactly once. Returns the sidecar and the pids signalled."""
    files = make_dataset(tmp_path / "data", N)
    sidecar = start_sidecar("200KiB", extra_args=["--disk-cache-dir", str(tmp_path / "disk")], deadlines=FAST)
    ds = Dataset("faults", root=tmp_path / "data", loader=bytes, sidecar=sidecar)
    assert ds.transport == "shm"
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, seed=3, num_workers=2, clairvoyant=clairvoyant,
                        collate_fn=keep)
    seed = int(os.environ.get("UNSTALL_FAULT_SEED") or random.randrange(1 << 30))
    points = _fault_points(seed, count)
    signalled: list[int] = []
    step = 0

    def maybe_signal(_: int) -> None:
        nonlocal step
        if step in points:
            # a fresh outage each time: the previous one is over once the datasets are registered again
            wait_until(lambda: sidecar.restarts == len(signalled) and sidecar.healthy(), "the previous outage to end")
            signalled.append(sidecar.pid)
            send_signal(sidecar.pid, sig)
        step += 1

    epochs = [count_epoch(loader, files, maybe_signal) for _ in range(EPOCHS)]
    _assert_every_epoch_whole(epochs, files, seed)
    assert len(signalled) == count and sidecar.pid not in signalled
    wait_until(lambda: sidecar.restarts >= count, "the last restart")
    assert sidecar.restarts == count, f"{sidecar.restarts} restarts for {count} faults (seed {seed})"
    assert sidecar.describe("faults").num_samples == N  # registered again on each new sidecar
    return sidecar, signalled


@pytest.mark.slow
def test_sigkill_at_random_points_every_sample_exactly_once(start_sidecar, tmp_path: Path, outages: Outages) -> None:
    sidecar, killed = _epochs_signalling_the_sidecar(start_sidecar, tmp_path, signal.SIGKILL, 6, clairvoyant=True)
    warned = [line for line in outages.lines if "was killed by signal 9" in line]
    assert len(warned) == len(killed), outages.lines  # one line per outage
    assert all(str(sidecar.home) in line and sidecar.token not in line for line in outages.lines)


@pytest.mark.slow
def test_sigstop_embedded_sidecar_is_replaced_never_two_on_one_home(start_sidecar, tmp_path: Path,
                                                                     outages: Outages) -> None:
    sidecar, stopped = _epochs_signalling_the_sidecar(start_sidecar, tmp_path, signal.SIGSTOP, 5, clairvoyant=False)
    for pid in stopped:  # resumed after the deadline: the hung one was killed, not left to serve beside
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    assert state_pid(sidecar.home) == sidecar.pid and not any(unstall.sidecar._pid_alive(p) for p in stopped)
    assert len([line for line in outages.lines if "does not answer within" in line]) == len(stopped)


@pytest.mark.slow
def test_sigstop_attached_sidecar_is_waited_for_and_resumed(sidecar_jar: Path, tmp_path: Path,
                                                             outages: Outages) -> None:
    """A sidecar this process did not start (a service): it is never killed; the shim reconnects with
    backoff, and the epoch goes on from the same sidecar once it is resumed (SIGCONT)."""
    files = make_dataset(tmp_path / "data", N)
    home = tmp_path / "home"
    service = serve_standalone(sidecar_jar, home, ["--cache-capacity", "200KiB",
                                                   "--disk-cache-dir", str(tmp_path / "disk")])
    try:
        pid = wait_until(lambda: state_pid(home), "the standalone sidecar's state file")
        with unstall.Sidecar(home=home, start=False, deadlines=FAST) as sidecar:
            assert not sidecar.started and sidecar.pid == service.pid == pid
            ds = Dataset("resumed", root=tmp_path / "data", loader=bytes, sidecar=sidecar)
            loader = DataLoader(ds, batch_size=BATCH, shuffle=True, seed=5, num_workers=2, collate_fn=keep)
            seed = int(os.environ.get("UNSTALL_FAULT_SEED") or random.randrange(1 << 30))
            points = _fault_points(seed, 5)
            resumers: list[threading.Thread] = []
            step = 0

            def resume_after_the_deadline(warned_before: int) -> None:
                wait_until(lambda: len(outages.lines) > warned_before, "the outage's warning")
                os.kill(pid, signal.SIGCONT)

            def maybe_stop(_: int) -> None:
                nonlocal step
                if step in points:
                    # a fresh outage each time: the previous one is over once the shim reconnected
                    wait_until(lambda: sidecar.restarts == len(resumers) and sidecar.healthy(),
                               "the previous outage to end")
                    os.kill(pid, signal.SIGSTOP)
                    t = threading.Thread(target=resume_after_the_deadline, args=(len(outages.lines),))
                    t.start()
                    resumers.append(t)
                step += 1

            epochs = [count_epoch(loader, files, maybe_stop) for _ in range(EPOCHS)]
            for t in resumers:
                t.join(timeout=60)
            _assert_every_epoch_whole(epochs, files, seed)
            assert len(resumers) == 5 and sidecar.pid == pid == service.pid and service.poll() is None
            assert len([line for line in outages.lines if "reconnecting with backoff" in line]) == 5
    finally:
        with suppress(ProcessLookupError):
            os.kill(service.pid, signal.SIGCONT)
        service.terminate()
        service.wait(timeout=30)


def test_gives_up_after_the_recovery_deadline_naming_home_address_and_log(sidecar_jar: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    make_dataset(root, 20)
    home = tmp_path / "home"
    service = serve_standalone(sidecar_jar, home)
    try:
        wait_until(lambda: state_pid(home), "the standalone sidecar's state file")
        deadlines = Deadlines(call=5.0, index=60.0, health_interval=0.3, health=1.0, recovery=1.0)
        with unstall.Sidecar(home=home, start=False, deadlines=deadlines) as sidecar:
            ds = Dataset("gone", root=root, loader=bytes, sidecar=sidecar)
            assert len(ds.fetch_samples([0, 1]).payloads) == 2
            address = sidecar.flight_location
            service.kill()
            service.wait(timeout=30)
            with pytest.raises(unstall.SidecarUnavailableError) as err:
                ds.fetch_samples([0, 1])
            msg = str(err.value)
            assert "gave up" in msg and str(home) in msg and address in msg and str(home / "sidecar.log") in msg
            assert sidecar.token not in msg
    finally:
        if service.poll() is None:
            service.kill()
            service.wait(timeout=30)


START_ONE = """
import hashlib, json, os, sys, time, unstall
home, jar, out, release = sys.argv[1:5]
s = unstall.Sidecar(home=home, jar=jar, cache_capacity="1MiB")
with open(out, "w") as f:
    json.dump({"pid": s.pid, "started": s.started, "token": hashlib.sha256(s.token.encode()).hexdigest()}, f)
deadline = time.monotonic() + 120
while not os.path.exists(release) and time.monotonic() < deadline:
    time.sleep(0.05)
s.close()
"""


def test_four_processes_starting_together_share_one_sidecar_and_token(sidecar_jar: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    release = tmp_path / "release"
    outs = [tmp_path / f"rank{k}.json" for k in range(4)]
    env = {k: v for k, v in os.environ.items() if k not in ("UNSTALL_SIDECAR", "UNSTALL_TOKEN", "UNSTALL_CONTROL_PORT")}
    procs = [subprocess.Popen([sys.executable, "-c", START_ONE, str(home), str(sidecar_jar), str(out), str(release)],
                              env=env) for out in outs]
    try:
        wait_until(lambda: all(o.exists() and o.stat().st_size > 0 for o in outs), "4 ranks to attach or start",
                   timeout=120)
        ranks = [json.loads(o.read_text()) for o in outs]
    finally:
        release.touch()
        codes = [p.wait(timeout=60) for p in procs]
    assert codes == [0, 0, 0, 0]
    assert len({r["pid"] for r in ranks}) == 1, ranks
    assert sum(r["started"] for r in ranks) == 1, ranks
    token = (home / "token").read_text().strip()
    assert {r["token"] for r in ranks} == {hashlib.sha256(token.encode()).hexdigest()}


class DieOnce:
    """A loader that kills its DataLoader worker (SIGKILL) the first time it runs there."""

    def __init__(self, flag: Path) -> None:
        self.flag = flag

    def __call__(self, payload: memoryview) -> bytes:
        if not self.flag.exists():
            self.flag.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return bytes(payload)


def test_a_dead_worker_is_reraised_and_the_next_epoch_is_whole(sidecar: unstall.Sidecar, tmp_path: Path) -> None:
    files = make_dataset(tmp_path / "data", 60)
    ds = Dataset("workerdeath", root=tmp_path / "data", loader=DieOnce(tmp_path / "died"), sidecar=sidecar)
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, seed=6, num_workers=2, collate_fn=keep)
    with pytest.raises(RuntimeError, match="DataLoader worker .* exited unexpectedly|killed by signal"):
        for _ in loader:
            pass
    seen, wrong = count_epoch(loader, files)
    assert lost_and_duplicated(seen, files) == (0, 0) and wrong == 0 and sum(seen.values()) == 60


def _prep_epochs(sidecar: unstall.Sidecar, root: Path, kill_at: set[int], sig: signal.Signals = signal.SIGKILL,
                 device: Optional[str] = None, pipeline: Any = None) -> tuple[list, list[int], int]:
    """EPOCHS epochs of a prep group member (sidecar-side decode + augmentation, shared memory), sending
    ``sig`` to the sidecar after the batches numbered in ``kill_at``: (epoch, ids, tensor digest) per batch,
    the pids signalled, and how often the member joined a restarted sidecar's group again. ``device``: the
    member's batches go there (``PrepLoader(device=...)``), prefetched, so batches are in flight at each fault.
    ``pipeline``: another than the sidecar-side one (a ``decode(device="mixed")`` one: the stored bytes in shared
    memory, decoded by the member)."""
    from unstall import prep
    from test_prep_support import PIPELINE_NCHW, digest

    sidecar.register_dataset("imgs", root)
    loader = prep.PrepLoader("imgs", pipeline or PIPELINE_NCHW, batch_size=4, with_ids=True, copy=True, seed=5,
                             epochs=EPOCHS, sidecar=sidecar, device=device)
    seen: list = []
    killed: list[int] = []
    step = 0
    for epoch in range(EPOCHS):
        for images, _labels, ids in loader:
            seen.append((epoch, ids.tolist(), digest(images.cpu().numpy())))
            if step in kill_at:
                wait_until(lambda: sidecar.restarts == len(killed) and sidecar.healthy(), "the previous outage to end")
                killed.append(sidecar.pid)
                send_signal(sidecar.pid, sig)
            step += 1
    # With batches in flight the loop can end without another call to the sidecar killed last: wait until the
    # supervisor has replaced it, as the checks of the killed pids expect.
    wait_until(lambda: sidecar.restarts == len(killed) and sidecar.healthy(), "the last outage to end")
    rejoins = loader.membership.rejoins
    loader.close()
    return seen, killed, rejoins


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["SIGKILL", "SIGSTOP"])
def test_faults_under_a_prep_group_member_every_batch_exactly_once(start_sidecar, tmp_path: Path,
                                                                     sig: signal.Signals) -> None:
    """The same faults for a coordinated-prep member: after each restart (a hung sidecar is killed first) it
    joins the new sidecar's group at the batch in hand, which is prepared again from the same seed: every epoch
    has every sample exactly once, batch for batch the same tensors as a run without faults."""
    _check_prep_faults(start_sidecar, tmp_path, sig)


@pytest.mark.slow
def test_sigkill_under_a_prep_member_with_batches_in_flight_to_the_device(start_sidecar, tmp_path: Path) -> None:
    """The same with ``device="cpu"``: the member prefetches 2 batches to the device, so the sidecar dies with
    batches read ahead of the loop; the rejoin starts at the batch the prefetcher asked for, and the loop still
    gets every batch exactly once."""
    _check_prep_faults(start_sidecar, tmp_path, signal.SIGKILL, device="cpu")


@pytest.mark.slow
def test_sigkill_under_a_mixed_decode_member_every_batch_exactly_once(start_sidecar, tmp_path: Path) -> None:
    """The same for ``decode(device="mixed")``: the member maps the group's stored bytes from shared memory and
    decodes them in its prefetcher, batches in flight at each fault; every batch exactly once, the same pixels."""
    from unstall import prep
    from test_prep_support import SIZE

    _check_prep_faults(start_sidecar, tmp_path, signal.SIGKILL, device="cpu",
                       pipeline=prep.imagenet_train(SIZE, decode_device="mixed"))


def _check_prep_faults(start_sidecar, tmp_path: Path, sig: signal.Signals, device: Optional[str] = None,
                       pipeline: Any = None) -> None:
    from test_prep_support import make_images

    root = make_images(tmp_path / "imgs", 30, png_every=0 if pipeline is not None else 7)
    reference, _, _ = _prep_epochs(start_sidecar("64MiB", deadlines=FAST), root, set(), device=device,
                                   pipeline=pipeline)
    per_epoch = len(reference) // EPOCHS
    seed = int(os.environ.get("UNSTALL_FAULT_SEED") or random.randrange(1 << 30))
    kill_at = set(random.Random(seed).sample(range(EPOCHS * per_epoch - 1), 5))
    sidecar = start_sidecar("64MiB", extra_args=["--disk-cache-dir", str(tmp_path / "disk")], deadlines=FAST)
    seen, killed, rejoins = _prep_epochs(sidecar, root, kill_at, sig, device=device, pipeline=pipeline)
    for epoch in range(EPOCHS):
        ids = sorted(i for e, batch, _ in seen if e == epoch for i in batch)
        assert ids == list(range(30)), f"epoch {epoch} (seed {seed}): every sample exactly once"
    assert seen == reference, f"the same batches, the same prepared tensors (seed {seed})"
    assert len(killed) == 5 and sidecar.pid not in killed
    assert not any(unstall.sidecar._pid_alive(p) for p in killed), "a hung sidecar is killed, never left beside"
    if device is None:
        assert rejoins == 5, f"one new group per restart (seed {seed})"
    else:
        # Batches in flight: two kills can fall between two of the member's calls to the sidecar (the loop takes
        # prefetched batches in between), and then one rejoin follows both restarts.
        assert 1 <= rejoins <= 5, f"a new group after the restarts, never more than one per restart (seed {seed})"


def test_a_prep_wait_that_timed_out_rejoins_and_its_old_member_leaves(start_sidecar, tmp_path: Path) -> None:
    """A member's wait that timed out (``--wait-timeout``) on a sidecar that is still running is recovered from like a
    fault: the member joins again at the batch in hand, and the member it was leaves the group at once instead of
    holding back what the group frees until ``member_timeout`` drops it."""
    from test_prep_support import PIPELINE_NCHW, make_images

    from unstall import prep

    sidecar = start_sidecar("16MiB", extra_args=["--wait-timeout", "1"])
    sidecar.register_dataset("imgs", make_images(tmp_path / "imgs"))
    # group_size 2: the group waits for a second member, so the first one's wait for batch 0 times out; its rejoin is
    # that second member, and the group starts
    m = prep.join("imgs", PIPELINE_NCHW, batch_size=4, seed=1, group_size=2, join_timeout=600, member_timeout=600,
                  epochs=1, sidecar=sidecar)
    first = m.member
    try:
        images = batch_to_numpy(m.batch(0, 0))[0]
        assert m.rejoins == 1 and m.member != first and len(images) == 4
        s = json.loads(m.client.do_action("prep.stats")[0])["groups"][m.group]
        assert [x["member"] for x in s["members"]] == [m.member], "the member that timed out left at once"
        assert s["left"] == 1 and s["dropped"] == []
    finally:
        m.leave()
