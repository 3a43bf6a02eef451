"""LocalClient and the torch layer's sessions against the fake local socket (tests/fake_local.py; no JVM)."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import socket
from collections import Counter
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

import unstall
from unstall import protocol
from unstall.local import LocalClient
from unstall.torch import DataLoader, Dataset, EpochIndex, decode_image, tensor_loader
from fake_local import TOKEN, FakeLocalSidecar
from shim_batches import keep


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeLocalSidecar]:
    f = FakeLocalSidecar(tmp_path)
    yield f
    f.close()


def _fetches(fake: FakeLocalSidecar) -> list[tuple[int, int, int, list[int]]]:
    """(pid, session, epoch, ids) of every FETCH since the last call."""
    return [(pid, r.session, r.epoch, r.ids.tolist()) for pid, r in fake.take_requests() if r.kind == protocol.LOCAL_FETCH]


# -- LocalClient -------------------------------------------------------------------------------


def test_fetch_reads_cache_and_stage_segments_in_place(fake: FakeLocalSidecar) -> None:
    with LocalClient(fake.socket_path, TOKEN) as c:
        s = c.open_session("imgs", "test")
        ids = [0, 1, 2, 3, 0, 9]
        b = c.fetch(s, ids, epoch=4)
        assert isinstance(b, protocol.SampleBatch) and b.transport == "shm" and len(b) == 6
        assert [bytes(p) for p in b.payloads] == [fake.payloads[i] for i in ids]
        assert all(isinstance(p, memoryview) and p.readonly for p in b.payloads)
        assert b.ids.tolist() == ids and b.label_list() == [0, 1, 2, 3, 0, None]
        assert b.keys == [f"c{i % 4}/{i}.jpg" for i in ids] and b.nbytes == sum(len(fake.payloads[i]) for i in ids)
        cache = c._cache_maps[str(fake.shm / "cache-0")]
        stages = sorted(p.name for p in fake.shm.glob("stage-*"))
        assert stages == ["stage-0"]
        again = c.fetch(s, [2, 5], epoch=4)  # the sidecar unlinks stage-0 now; the old views stay readable
        assert not (fake.shm / "stage-0").exists()
        assert [bytes(p) for p in b.payloads] == [fake.payloads[i] for i in ids]
        assert [bytes(p) for p in again.payloads] == [fake.payloads[2], fake.payloads[5]]
        assert c._cache_maps[str(fake.shm / "cache-0")] is cache  # the arena is mapped once
        assert c.plan(s, list(range(40)), 5) == 40
        c.close_session(s)
        with pytest.raises(unstall.DatasetNotFoundError, match=f"unknown session {s}"):
            c.fetch(s, [0])


def test_errors_carry_the_sidecars_message_and_the_connection_survives(fake: FakeLocalSidecar) -> None:
    with LocalClient(fake.socket_path, TOKEN) as c:
        with pytest.raises(unstall.DatasetNotFoundError, match="unknown dataset 'nope'") as err:
            c.open_session("nope", "x")
        assert isinstance(err.value, KeyError) and err.value.code == "NOT_FOUND"
        s = c.open_session("imgs", "x")
        with pytest.raises(unstall.InvalidRequestError, match="sample id 40 is out of range for dataset 'imgs'"):
            c.fetch(s, [1, 40], dataset="imgs")
        fake.unavailable = True
        with pytest.raises(unstall.SidecarUnavailableError, match="shutting down"):
            c.fetch(s, [1])
        fake.unavailable = False
        assert bytes(c.fetch(s, [39]).payloads[0]) == fake.payloads[39]
        fake.lie = True
        with pytest.raises(unstall.ProtocolMismatchError, match="refusing to feed"):
            c.fetch(s, [1, 2, 3])
    with pytest.raises(unstall.AuthenticationError, match="wrong token"):
        LocalClient(fake.socket_path, "0" * 64).connect()
    with pytest.raises(unstall.SidecarUnavailableError, match="nowhere.sock"):
        LocalClient(fake.shm / "nowhere.sock", TOKEN).connect()


def test_a_close_asked_for_mid_exchange_waits_for_the_exchange(fake: FakeLocalSidecar,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A garbage collection on the thread that is reading an answer can run a loader's finalizer, which closes its
    session: the re-entrant lock lets it in, and a CLOSE sent then would take the FETCH's answer as its own."""
    import unstall.local as local_mod

    with LocalClient(fake.socket_path, TOKEN) as c:
        reading, closing = c.open_session("imgs", "reading"), c.open_session("imgs", "collected")
        fake.take_requests()
        real_recv = local_mod.recv_frame
        collected = []

        def recv_after_a_collection(sock: socket.socket) -> bytearray:
            if not collected:  # the first answer's read: a collection runs the finalizer here
                collected.append(True)
                c.close_session(closing)
            return real_recv(sock)

        monkeypatch.setattr(local_mod, "recv_frame", recv_after_a_collection)
        assert bytes(c.fetch(reading, [5]).payloads[0]) == fake.payloads[5]  # a staged payload: valid until the
        assert [(r.kind, r.session) for _, r in fake.take_requests()] == [(protocol.LOCAL_FETCH, reading)]  # next
        assert closing in fake.sessions  # request, so the CLOSE waits for that
        assert bytes(c.fetch(reading, [7]).payloads[0]) == fake.payloads[7]  # the connection is in step
        assert [(r.kind, r.session) for _, r in fake.take_requests()] == \
            [(protocol.LOCAL_CLOSE, closing), (protocol.LOCAL_FETCH, reading)]
        assert closing not in fake.sessions and reading in fake.sessions


def test_a_lost_connection_is_unavailable_then_reconnects(fake: FakeLocalSidecar) -> None:
    c = LocalClient(fake.socket_path, TOKEN).connect()
    first = c.connection_id
    s = c.default_session("imgs")
    c._sock.shutdown(socket.SHUT_RDWR)  # type: ignore[union-attr]
    with pytest.raises(unstall.SidecarUnavailableError, match="lost the sidecar's local socket"):
        c.fetch(s, [0])
    s2 = c.default_session("imgs")  # a new connection, a new default session
    assert c.connection_id != first and c.connection_id is not None and s2 != s
    assert bytes(c.fetch(s2, [3]).payloads[0]) == fake.payloads[3]
    c.close()


def test_pickling_drops_the_connection(fake: FakeLocalSidecar) -> None:
    c = LocalClient(fake.socket_path, TOKEN).connect()
    clone = pickle.loads(pickle.dumps(c))
    assert clone.connection_id is None and clone._cache_maps == {}
    assert TOKEN not in repr(c) and TOKEN not in repr(clone)
    s = clone.default_session("imgs")
    assert bytes(clone.fetch(s, [4]).payloads[0]) == fake.payloads[4]
    c.close()
    clone.close()


def _child_fetch(client: LocalClient, session: int, q) -> None:
    b = client.fetch(session, [1, 2])
    q.put((os.getpid(), [bytes(p) for p in b.payloads], client.generation))


def test_a_forked_child_opens_its_own_connection(fake: FakeLocalSidecar) -> None:
    c = LocalClient(fake.socket_path, TOKEN)
    s = c.open_session("imgs", "parent")
    fake.take_requests()
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_fetch, args=(c, s, q))
    p.start()
    pid, payloads, _ = q.get(timeout=30)
    p.join(30)
    assert p.exitcode == 0 and payloads == [fake.payloads[1], fake.payloads[2]]
    reqs = fake.take_requests()
    assert [(rpid, r.kind) for rpid, r in reqs] == [(pid, protocol.LOCAL_HELLO), (pid, protocol.LOCAL_FETCH)]
    assert reqs[1][1].session == s  # the parent's session, used by id on the child's connection
    assert bytes(c.fetch(s, [5]).payloads[0]) == fake.payloads[5]  # the parent's connection is intact
    c.close()


# -- the torch layer over the local socket ---------------------------------------------------------


def test_dataset_picks_the_local_socket_and_passes_views(fake: FakeLocalSidecar, monkeypatch) -> None:
    seen = []

    def loader(view):
        seen.append((type(view), view.readonly))
        return bytes(view)

    ds = Dataset("imgs", sidecar=fake, loader=loader)
    assert ds.transport == "shm" and "shm" in repr(ds)
    assert ds[3] == (fake.payloads[3], 3) and seen == [(memoryview, True)]
    plain = Dataset("imgs", sidecar=fake)
    assert plain[4] == (fake.payloads[4], "c0/4.jpg")  # no label: the key
    assert isinstance(plain[1][0], bytes)
    batch = plain.fetch([0, 1], epoch=2)  # Arrow, as over Flight
    assert batch.column("payload").to_pylist() == fake.payloads[:2] and batch.column("id").to_pylist() == [0, 1]
    assert all(d._client._conn is None for d in (ds, plain))  # never a Flight connection
    monkeypatch.setenv("UNSTALL_TRANSPORT", "flight")
    assert Dataset("imgs", sidecar=fake).transport == "flight"
    assert Dataset("imgs", sidecar=fake, transport="auto").transport == "shm"  # the argument wins
    monkeypatch.setenv("UNSTALL_TRANSPORT", "carrier-pigeon")
    with pytest.raises(ValueError, match="UNSTALL_TRANSPORT must be 'auto', 'shm' or 'flight'"):
        Dataset("imgs", sidecar=fake)


def test_shm_when_unavailable_says_why(fake: FakeLocalSidecar, monkeypatch) -> None:
    monkeypatch.setattr(fake, "local_client", lambda: None)
    with pytest.raises(unstall.SidecarUnavailableError, match="transport 'shm' is not available: .*no local socket"):
        Dataset("imgs", sidecar=fake, transport="shm")
    monkeypatch.setattr(fake, "local_client", lambda: LocalClient(fake.shm / "gone.sock", TOKEN))
    with pytest.raises(unstall.SidecarUnavailableError, match="not available: cannot connect .*gone.sock"):
        Dataset("imgs", sidecar=fake, transport="shm")
    assert Dataset("imgs", sidecar=fake).transport == "flight"  # auto falls back


def test_getitems_groups_by_epoch_and_session(fake: FakeLocalSidecar) -> None:
    ds = Dataset("imgs", sidecar=fake, loader=len)
    s = ds.open_session("mine")
    fake.take_requests()
    items = ds.__getitems__([EpochIndex(1, 5, s), 7, EpochIndex(1, 6, s), EpochIndex(2, 0)])
    assert [x for x, _ in items] == [15, 17, 16, 10]
    reqs = fake.take_requests()
    opens = [r.doc["name"] for _, r in reqs if r.kind == protocol.LOCAL_OPEN]
    assert opens == [f"pid {os.getpid()} default"]  # session 0: the dataset's own, opened once
    default = next(sid for sid, v in fake.sessions.items() if v[1] == opens[0])
    fetches = sorted((r.epoch, r.session, r.ids.tolist()) for _, r in reqs if r.kind == protocol.LOCAL_FETCH)
    assert fetches == [(0, default, [7]), (1, s, [5, 6]), (2, default, [0])]


def sample_len(view) -> int:
    return len(view)


def samples(batch):
    return [x for x, _ in batch]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_each_loader_opens_its_session_lazily_and_its_workers_use_it(fake: FakeLocalSidecar, num_workers: int) -> None:
    # (lambdas and the default fork start method: tests/python/test_local_transport.py, in a process without gRPC)
    ds = Dataset("imgs", sidecar=fake, loader=sample_len)
    loader = DataLoader(ds, batch_size=8, shuffle=True, seed=2, num_workers=num_workers, clairvoyant=True,
                        collate_fn=samples)
    assert loader.session is None
    fake.take_requests()
    for _epoch in range(2):
        assert sorted(x for b in loader for x in b) == sorted(10 + i for i in range(40))
    s = loader.session
    assert s is not None and fake.sessions[s][1] == f"pid {os.getpid()} DataLoader#{loader._number}"
    reqs = fake.take_requests()
    main = [r for pid, r in reqs if pid == os.getpid()]
    assert [r.kind for r in main][:2] == [protocol.LOCAL_OPEN, protocol.LOCAL_PLAN]
    plans = [(r.session, r.epoch, sorted(r.ids.tolist())) for r in main if r.kind == protocol.LOCAL_PLAN]
    assert plans == [(s, 0, list(range(40))), (s, 1, list(range(40)))]
    fetches = [(pid, r.session, r.epoch) for pid, r in reqs if r.kind == protocol.LOCAL_FETCH]
    assert len(fetches) == 10 and {f[1] for f in fetches} == {s} and sorted({f[2] for f in fetches}) == [0, 1]
    pids = {f[0] for f in fetches}
    assert (pids == {os.getpid()}) if num_workers == 0 else (os.getpid() not in pids)
    assert loader.stats().transport == "shm"
    del loader, reqs, main
    import gc

    gc.collect()
    assert s not in fake.sessions  # closed with the loader


def test_spawned_workers_use_the_loaders_session(fake: FakeLocalSidecar) -> None:
    ds = Dataset("imgs", sidecar=fake)
    loader = DataLoader(ds, batch_size=20, num_workers=1, multiprocessing_context="spawn", collate_fn=keep)
    assert sorted(x for b in loader for x, _ in b) == sorted(fake.payloads)
    fetches = _fetches(fake)
    assert len(fetches) == 2 and {f[1] for f in fetches} == {loader.session} and os.getpid() not in {f[0] for f in fetches}


def test_loaders_take_any_buffer() -> None:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.full((4, 6, 3), 200, np.uint8)).save(buf, format="PNG")
    view = memoryview(buf.getvalue()).toreadonly()
    img = decode_image(view)
    assert img.shape == (3, 4, 6) and int(img[0, 0, 0]) == 200
    t = tensor_loader(view)
    assert bytes(t.numpy()) == buf.getvalue()
    t[0] = 0  # owns its memory: writable, the source untouched
    assert view[0] == buf.getvalue()[0]
    assert tensor_loader(memoryview(b"")).numel() == 0
    assert unstall.torch.pil_loader(view).size == (6, 4)
    assert Counter(decode_image(bytes(view)).flatten().tolist()) == Counter(img.flatten().tolist())
