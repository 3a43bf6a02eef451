"""The same-host data plane against a real sidecar: samples come through the sidecar's shared memory over
its local socket, the trainer never uses gRPC (so torch's default fork works, lambdas included), each
DataLoader has its own session, and Flight stays the identical fallback.

The DataLoader runs go through ``local_job.py`` in a fresh interpreter, as a user's script does: this
pytest process has used Flight (other tests), after which forking it would not be safe.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import stat
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
from torchvision.datasets import ImageFolder

import unstall
from batches import keep
from datagen import make_image_folder, make_tfrecord_shards
from unstall.local import LocalClient
from unstall.sidecar import read_state
from unstall.torch import DataLoader, Dataset

HERE = Path(__file__).parent
SIZE = 16384  # every sample is exactly this many bytes: one LRU block, so both policies hold K samples
N = 24  # samples per dataset
K = 12  # cache slots: fewer than the samples, so later epochs have hits and misses


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("local")
    make_image_folder(root / "imagefolder", ["a", "b", "c"], per_class=8, seed=21, equal_size=SIZE, extras=False)
    records = make_tfrecord_shards(root / "tfrecord", shards=3, per_shard=8, size=SIZE, seed=22)
    expected = {
        "imagefolder": Counter(
            (sha(Path(p).read_bytes()), label) for p, label in ImageFolder(str(root / "imagefolder")).samples),
        "tfrecord": Counter((sha(r.data), r.key) for r in records),
    }
    assert all(sum(c.values()) == N for c in expected.values())
    return root, expected


@pytest.fixture(scope="module")
def small_cache_sidecars(start_sidecar):
    """One sidecar per (cache policy, format), its cache smaller than the dataset, shared by the runs."""
    started: dict[tuple[str, str], unstall.Sidecar] = {}

    def get(policy: str, fmt: str) -> unstall.Sidecar:
        if (policy, fmt) not in started:
            started[policy, fmt] = start_sidecar(cache_capacity=K * SIZE, extra_args=["--cache-policy", policy])
        return started[policy, fmt]

    return get


def run_job(sidecar: unstall.Sidecar, tmp_path: Path, **spec: object) -> dict:
    """local_job.py in a fresh interpreter, attached to ``sidecar`` through its state file."""
    out = tmp_path / "job"
    out.mkdir()
    env = dict(os.environ, UNSTALL_HOME=str(sidecar.home), UNSTALL_EPOCH_LOG="0")
    for var in ("UNSTALL_SIDECAR", "UNSTALL_TOKEN", "UNSTALL_CONTROL_PORT", "UNSTALL_TRANSPORT"):
        env.pop(var, None)
    p = subprocess.run([sys.executable, str(HERE / "local_job.py"), json.dumps({**spec, "out": str(out)})],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("num_workers, context", [(0, None), (2, "fork"), (2, "spawn")])
@pytest.mark.parametrize("fmt", ["imagefolder", "tfrecord"])
@pytest.mark.parametrize("policy", ["minio", "lru"])
def test_shared_memory_serves_the_files_bytes(small_cache_sidecars, data, tmp_path: Path, policy: str, fmt: str,
                                              num_workers: int, context) -> None:
    root, expected = data
    sidecar = small_cache_sidecars(policy, fmt)
    name = f"{fmt}-{policy}-w{num_workers}-{context}"
    sidecar.register_dataset(name, root / fmt, format=fmt)
    doc = run_job(sidecar, tmp_path, dataset=name, num_workers=num_workers, context=context, epochs=3,
                  transport="shm", seed=3)
    for epoch, got in enumerate(doc["epochs"]):
        assert Counter(map(tuple, got)) == expected[fmt], f"epoch {epoch}: every sample once, its bytes and target"
    fetched = doc["fetched"]
    assert doc["dataset_transport"] == doc["loader_transport"] == fetched["transport"] == "shm"
    assert not doc["grpc_used"]
    st = sidecar.stats().dataset(name)
    assert (st.epoch(0).samples, st.epoch(0).hits, st.epoch(0).misses) == (N, 0, N)
    later = [st.epoch(1), st.epoch(2)]
    assert all(e.samples == N for e in later)
    assert sum(e.hits for e in later) > 0 and sum(e.misses for e in later) > 0, later
    if policy == "minio":  # the first K admitted stay: K hits per epoch, read in place from the cache arena
        assert all((e.hits, e.misses, e.storage_bytes) == (K, N - K, (N - K) * SIZE) for e in later)
        assert (fetched["from_cache_segments"], fetched["from_stage"]) == (K, N - K)
    else:  # LRU hits are copied to the reply's staging file
        assert (fetched["from_cache_segments"], fetched["from_stage"]) == (0, N)
    assert doc["session_stats"] == {"dataset": name, "name": f"pid {doc['pid']} DataLoader#1", "transport": "shm",
                                    "samples": 4 * N}


def test_lambdas_with_the_default_start_method(start_sidecar, data, tmp_path: Path) -> None:
    root, expected = data
    sidecar = start_sidecar("64MiB")
    sidecar.register_dataset("lambdas", root / "imagefolder")
    doc = run_job(sidecar, tmp_path, dataset="lambdas", num_workers=2, epochs=2, lambdas=True)
    assert [Counter(map(tuple, e)) for e in doc["epochs"]] == [expected["imagefolder"]] * 2
    assert doc["context"] is None and doc["default_start_method"] == "fork" and not doc["grpc_used"]
    assert doc["loader_transport"] == "shm"
    workers = doc["workers"]
    assert len(workers) == 4  # 2 per epoch
    assert all(w["ppid"] == doc["pid"] and w["started_by"] == doc["pid"] for w in workers), "forked by the trainer"


def bounded(fn, timeout: float, what: str) -> None:
    """Runs ``fn`` in a thread and fails the test if it has not returned after ``timeout`` seconds (a request
    the sidecar never answers would otherwise hang the whole suite; stopping the sidecar at the end of the
    session ends the thread)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # re-raised in the test's thread
            errors.append(e)

    t = threading.Thread(target=run, name=what, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        pytest.fail(f"{what} did not finish within {timeout:.0f} s: a request got no reply from the sidecar")
    if errors:
        raise errors[0]


def _two_clairvoyant_loaders(start_sidecar, tmp_path: Path, name: str, size: int, epochs: int,
                             num_workers: int = 0) -> tuple:
    """Two clairvoyant loaders (seeds 1 and 2) on one dataset read ``epochs`` epochs side by side, each epoch
    whole; the sidecar's prefetch window is 96 KiB / 12 samples. Returns (a, b, sidecar, samples)."""
    root = tmp_path / "imgs"
    make_image_folder(root, ["a", "b", "c", "d"], per_class=10, seed=9, equal_size=size)
    stored = sorted(Path(p).read_bytes() for p, _ in ImageFolder(str(root)).samples)
    sidecar = start_sidecar(
        cache_capacity=4 * size,
        extra_args=["--prefetch-window-bytes", str(12 * 8192), "--prefetch-window", "12", "--prefetch-threads", "2"],
    )
    ds = Dataset(name, root=root, sidecar=sidecar, transport="shm")
    a, b = (DataLoader(ds, batch_size=4, shuffle=True, seed=seed, clairvoyant=True, num_workers=num_workers,
                       persistent_workers=num_workers > 0, collate_fn=keep) for seed in (1, 2))

    def side_by_side() -> None:
        for epoch in range(epochs):
            seen_a, seen_b = [], []
            for ba, bb in itertools.zip_longest(a, b):
                seen_a += [x for x, _ in ba]
                seen_b += [x for x, _ in bb]
            assert sorted(seen_a) == stored and sorted(seen_b) == stored, f"epoch {epoch}"

    bounded(side_by_side, 120, f"two clairvoyant loaders on {name!r}")
    return a, b, sidecar, len(stored)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_two_clairvoyant_loaders_each_get_their_own_plan(start_sidecar, tmp_path: Path, num_workers: int) -> None:
    # 4 KiB samples: both plans fit the window together (the window of tests/python/test_prefetch.py)
    a, b, sidecar, n = _two_clairvoyant_loaders(start_sidecar, tmp_path, "twoplans", 4096, 2, num_workers)
    assert None not in (a.session, b.session) and a.session != b.session
    st = sidecar.stats()
    for loader in (a, b):
        s = st.session(loader.session)
        assert (s.dataset, s.transport) == ("twoplans", "shm") and s.name.endswith(f"DataLoader#{loader._number}")
        assert s.total.samples == 2 * n and [s.epoch(e).samples for e in (0, 1)] == [n, n]
        assert s.total.prefetch_hits > 0, f"session {loader.session} was served from its own plan: {s}"


def test_plans_competing_for_the_prefetch_window_never_stall_a_fetch(start_sidecar, tmp_path: Path) -> None:
    # 16 KiB samples: the two plans' staging together exceeds the window, so a prefetch slot whose allocation
    # loses the race is given back and the batch that needs the sample reads it itself (no hang).
    a, b, sidecar, n = _two_clairvoyant_loaders(start_sidecar, tmp_path, "competing", 16384, 3)
    st = sidecar.stats()
    assert [st.session(x.session).total.samples for x in (a, b)] == [3 * n] * 2


@pytest.mark.parametrize("fmt", ["imagefolder", "tfrecord"])
def test_flight_gives_the_same_batches(sidecar: unstall.Sidecar, data, fmt: str) -> None:
    root, _ = data
    shm = Dataset(f"same-{fmt}", root=root / fmt, format=fmt, sidecar=sidecar, transport="shm")
    flight = Dataset(f"same-{fmt}", sidecar=sidecar, transport="flight")
    assert (shm.transport, flight.transport) == ("shm", "flight")
    ids = [5, 0, 23, 5, 7]
    x, y = shm.fetch_samples(ids, epoch=0), flight.fetch_samples(ids, epoch=0)
    assert (x.transport, y.transport) == ("shm", "flight")
    assert x.ids.tolist() == y.ids.tolist() == ids
    assert (x.label_list(), x.keys, x.nbytes) == (y.label_list(), y.keys, y.nbytes)
    assert [bytes(p) for p in x.payloads] == [bytes(p) for p in y.payloads]
    assert shm.fetch(ids).equals(flight.fetch(ids))
    batches = [list(DataLoader(d, batch_size=5, shuffle=True, seed=4, collate_fn=keep)) for d in (shm, flight)]
    assert batches[0] == batches[1] and sum(len(b) for b in batches[0]) == N


def test_discovery_and_fallback(start_sidecar, data, tmp_path: Path, monkeypatch) -> None:
    root, _ = data
    owner = start_sidecar("1MiB")
    state = read_state(owner.state_file)
    assert state is not None and state.local and owner.local_endpoint == state.local
    sock = Path(state.local)
    assert stat.S_ISSOCK(sock.stat().st_mode) and stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
    with unstall.Sidecar(home=owner.home, start=False) as attached:
        assert attached.local_endpoint == state.local
    monkeypatch.setenv("UNSTALL_HOME", str(owner.home))  # by address, and this home's state file names it
    with unstall.Sidecar(owner.flight_location, token=owner.token) as by_address:
        assert by_address.local_endpoint == state.local
    monkeypatch.setenv("UNSTALL_HOME", str(tmp_path / "elsewhere"))  # by address, nothing says it is local
    with unstall.Sidecar(owner.flight_location, token=owner.token) as unknown:
        assert unknown.local_endpoint is None and unknown.local_client() is None
    no_shm = start_sidecar("1MiB", extra_args=["--no-shm"])
    assert read_state(no_shm.state_file).local is None and no_shm.local_endpoint is None
    assert Dataset("plain", root=root / "imagefolder", sidecar=no_shm).transport == "flight"
    with pytest.raises(unstall.SidecarUnavailableError, match="transport 'shm' is not available: .*no local socket"):
        Dataset("plain", sidecar=no_shm, transport="shm")
    with pytest.raises(unstall.AuthenticationError):
        LocalClient(state.local, "0" * 64).connect()
    assert Dataset("still", root=root / "imagefolder", sidecar=owner)[0][1] == 0  # still serving


def test_staging_files_are_unlinked_at_the_next_request(start_sidecar, data) -> None:
    root, expected = data
    sidecar = start_sidecar("0")  # no cache: every row is staged
    ds = Dataset("staged", root=root / "tfrecord", format="tfrecord", sidecar=sidecar, transport="shm")
    first = ds.fetch_samples([0, 1, 2])
    shm_dir = Path(ds._local.shm_dir)
    staged = {p.name for p in shm_dir.glob("stage-*")}
    assert staged and all(p.obj is not None for p in first.payloads)
    second = ds.fetch_samples([3])
    assert not staged & {p.name for p in shm_dir.glob("stage-*")}, "the sidecar unlinks a reply's staging file"
    got = Counter((sha(bytes(p)), k) for b in (first, second) for p, k in zip(b.payloads, b.keys))
    assert got <= expected["tfrecord"] and sum(got.values()) == 4  # the earlier views still read right
