"""Coordinated prep benchmark (not a test): k concurrent hyper-parameter-search jobs over one dataset.

For k = 1, 2, 4 it runs, one after the other:
  * unstall: k processes join ONE prep group (unstall.prep.PrepLoader); the sidecar decodes and augments
    each batch once;
  * torch: k independent torch DataLoaders (torchvision ImageFolder + transforms, num_workers=2);
  * tf.data: k independent tf.data pipelines (decode_jpeg + crop + resize + flip + normalize, AUTOTUNE);
and prints aggregate images/s (all jobs' images over the wall time from the common start to the last
job's end) and CPU seconds per epoch (all processes involved: jobs, their workers, and the sidecar).
unstall runs per configuration (`--unstall auto:float32,flight:uint8` by default: shared memory with
normalized float32, and Flight, as remote members would read, with uint8). The ks run `--repeats` times,
interleaved, and every ratio is taken within a repeat (the machine's speed drifts by 20% over minutes on a
shared VM), then the median and the range are printed. It also measures tjbench's single-thread decode rate on
the same images just before each k=1 unstall run, the sidecar's single-job decode+augment rate per core
(samples / CPU seconds of the prep threads) as a ratio to it, and prints a table of issue 13's bars.

Each unstall row also shows the CPU the sidecar's JIT compiler threads used during the run (they keep compiling
for minutes on a short benchmark; a training job pays that once) and how many cores of the machine were idle
between GO and the last job's result (0: the run was CPU-bound). A configuration may pin the sidecar and its jobs
to different CPUs (`flight:uint8@0/1`: sidecar on CPU 0, jobs on CPU 1), as remote members would run on their own
host; `--epochs E` has each job read E epochs per run (one join, as in training).

    python benchmarks/bench_prep.py [--images 640] [--data ~/.cache/unstall/bench-prep] [--ks 1,2,4]
                                    [--repeats 3] [--unstall auto:float32,flight:uint8] [--systems unstall,torch,tf]

Needs the sidecar jar (mvn -pl flight-server,sidecar -am package), torch, torchvision, tensorflow-cpu,
and tjbench (apt-get install libjpeg-turbo-progs) for the decode reference.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, NamedTuple, NoReturn, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "python-shim" / "src"))
sys.path.insert(0, str(HERE))

from _cpu import machine_busy, proc_stat, thread_cpu  # noqa: E402

BATCH = 64
SIZE = 224
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


# ---------------------------------------------------------------------------------------------
# Data: photo-like JPEGs, 500x375, ~110 KB (smooth colour fields, blurred shapes, texture, noise)


def photo(rng: Any, w: int = 500, h: int = 375, quality: int = 93) -> bytes:
    import numpy as np
    from PIL import Image, ImageDraw, ImageFilter

    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.zeros((h, w, 3), np.float32)
    for c in range(3):
        for _ in range(4):
            fx, fy, ph = rng.uniform(0.002, 0.02), rng.uniform(0.002, 0.02), rng.uniform(0, 6.28)
            img[..., c] += rng.uniform(20, 60) * np.sin(xx * fx * 6.28 + yy * fy * 6.28 + ph)
        img[..., c] += rng.uniform(60, 190)
    pil = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    d = ImageDraw.Draw(pil)
    for _ in range(25):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        d.ellipse([x0, y0, x0 + int(rng.integers(10, 160)), y0 + int(rng.integers(10, 160))],
                  fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
    a = np.asarray(pil.filter(ImageFilter.GaussianBlur(1.5))).astype(np.float32)
    tex = rng.normal(0, 1, (h // 4 + 1, w // 4 + 1, 3)).astype(np.float32)
    a += np.kron(tex, np.ones((4, 4, 1), np.float32))[:h, :w] * 16 + rng.normal(0, 11.0, a.shape)
    out = io.BytesIO()
    Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=quality)
    return out.getvalue()


def make_dataset(root: Path, n: int) -> Path:
    import numpy as np

    marker = root / f".complete-{n}"
    if marker.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(2026)
    for i in range(n):
        d = root / f"class{i % 10}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"img{i:05d}.jpg").write_bytes(photo(rng))
    marker.write_text("ok")
    return root


# ---------------------------------------------------------------------------------------------
# Jobs (each its own process): READY after setup, wait for GO on stdin, run one epoch, print RESULT


def _cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def read_every_byte(images: Any) -> int:
    """Reads every byte of a batch tensor, as the copy to the GPU would: a sum of its bytes as 64-bit words,
    whatever its dtype. (torch's own ``uint8`` sum widens every element on its own and runs at ~0.3 GB/s here,
    120x slower than this; it made the uint8 rows measure the stand-in, not the data path:
    benchmarks/results/2026-11-26-prep-second-pass.md.)"""
    import torch

    flat = images.contiguous().view(-1).view(torch.uint8)
    whole = flat.numel() // 8 * 8
    return int(flat[:whole].view(torch.int64).sum()) + int(flat[whole:].sum())


def await_go() -> None:
    """A job's side of run_jobs: set up, say READY, and wait for GO on stdin."""
    print("READY", flush=True)
    sys.stdin.readline()


def job_unstall(data: Path, location: str, k: int, seed: int, dtype: str, transport: str,
                window: Optional[int], compression: Optional[str] = None,
                python_workers: int = 0, epochs: int = 1) -> dict[str, Any]:
    import torch
    import unstall
    from unstall import prep

    torch.set_num_threads(1)  # the job's own math (the sum) stays on one core, as in the DataLoader job
    client = unstall.FlightClient(location, os.environ["UNSTALL_TOKEN"])
    pipe = prep.imagenet_train(SIZE, dtype=dtype)
    await_go()  # joining is on the clock: the group starts preparing only once all k joined
    t0, c0, n = time.time(), _cpu(), 0
    common = dict(batch_size=BATCH, seed=seed, group_size=k, epochs=epochs, client=client, transport=transport,
                  compression=compression)
    if python_workers:  # torchvision transforms in DataLoader worker processes, shared through the group
        from torchvision import transforms

        tf = transforms.Compose([transforms.RandomResizedCrop(SIZE), transforms.RandomHorizontalFlip(),
                                 transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
        loader: Any = prep.SharedTransformLoader("bench", tf, fingerprint="bench-rrc-flip-norm",
                                                 num_workers=python_workers, **common)
    else:
        loader = prep.PrepLoader("bench", pipe, window=window, **common)
    first = None
    for _ in range(epochs):
        for images, _labels in loader:
            first = first or time.time()
            n += images.shape[0]
            read_every_byte(images)
    return {"start": t0, "end": time.time(), "first": first, "cpu": _cpu() - c0, "images": n,
            "group": loader.membership.group,
            "shm": loader.membership.shm}


def job_torch(data: Path, seed: int) -> dict[str, Any]:
    import torch
    from torchvision import datasets, transforms

    torch.set_num_threads(1)
    tf = transforms.Compose([transforms.RandomResizedCrop(SIZE), transforms.RandomHorizontalFlip(),
                             transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    ds = datasets.ImageFolder(str(data), transform=tf)
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=2,
                                         generator=torch.Generator().manual_seed(seed))
    await_go()
    t0, c0, n = time.time(), _cpu(), 0
    for images, _labels in loader:
        n += images.shape[0]
        read_every_byte(images)
    end = time.time()
    del loader  # joins the workers, so that their CPU time lands in RUSAGE_CHILDREN
    return {"start": t0, "end": end, "cpu": _cpu() - c0, "images": n}


def job_tf(data: Path, seed: int) -> dict[str, Any]:
    import tensorflow as tf

    files = sorted(str(p) for p in data.rglob("*.jpg"))
    classes = sorted({Path(f).parent.name for f in files})
    labels = [classes.index(Path(f).parent.name) for f in files]
    mean = tf.constant(MEAN) * 255.0
    std = tf.constant(STD) * 255.0

    def load(path: Any, label: Any) -> Any:
        raw = tf.io.read_file(path)
        shape = tf.io.extract_jpeg_shape(raw)
        begin, size, _ = tf.image.sample_distorted_bounding_box(  # RandomResizedCrop's sampling
            shape, tf.zeros([0, 0, 4]), min_object_covered=0.0, aspect_ratio_range=(3 / 4, 4 / 3),
            area_range=(0.08, 1.0), max_attempts=10, use_image_if_no_bounding_boxes=True)
        crop = tf.stack([begin[0], begin[1], size[0], size[1]])
        img = tf.io.decode_and_crop_jpeg(raw, crop, channels=3)
        img = tf.image.resize(img, [SIZE, SIZE])
        img = tf.image.random_flip_left_right(img)
        return (img - mean) / std, label

    ds = (tf.data.Dataset.from_tensor_slices((files, labels)).shuffle(len(files), seed=seed)
          .map(load, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH).prefetch(tf.data.AUTOTUNE))
    await_go()
    t0, c0, n = time.time(), _cpu(), 0
    for images, _ in ds:
        n += int(images.shape[0])
        float(tf.reduce_sum(images))
    return {"start": t0, "end": time.time(), "cpu": _cpu() - c0, "images": n}


# ---------------------------------------------------------------------------------------------
# Driver


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def proc_cpu(pid: int) -> float:
    """utime + stime of a live process (the sidecar), from /proc."""
    st = proc_stat(pid)
    if st is None:
        raise SystemExit(f"process {pid} (the sidecar) is gone")
    return st.cpu_s


def jit_cpu(pid: int) -> float:
    """CPU seconds the JVM's JIT compiler threads (C1/C2 CompilerThread) of a live process used so far."""
    return sum(s for name, s in thread_cpu(pid).items() if "CompilerThre" in name)


def utc_stamp() -> str:
    return f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"


def probe_arguments(doc: str, calls: int, rounds: int) -> tuple[argparse.Namespace, Path]:
    """The probes' command line (--calls, --rounds, --data) and their dataset: 128 of this benchmark's images."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--calls", type=int, default=calls)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--data", type=Path, default=Path.home() / ".cache" / "unstall" / "bench-prep")
    args = ap.parse_args()
    return args, make_dataset(args.data.expanduser() / "n128", 128)


def cpu_set(text: str) -> set[int]:
    """"0", "0,2", "0-3" -> a set of CPU numbers."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


@contextlib.contextmanager
def pinned(cpus: Optional[set[int]]) -> Iterator[None]:
    """Runs the block on ``cpus`` only (None: unchanged): processes started inside it inherit them."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


class Config(NamedTuple):
    """One unstall configuration of --unstall: TRANSPORT:DTYPE[:REINDEX_MEMORY[:FORMS]][@SIDECAR_CPUS/JOB_CPUS]."""

    transport: str
    dtype: str
    reindex_memory: Optional[str]
    sidecar_cpus: Optional[set[int]] = None  # pinned: the sidecar on these CPUs, the jobs on job_cpus
    job_cpus: Optional[set[int]] = None
    forms: Optional[str] = None  # "encoded": the decoded form off; "decoded" or None: the sidecar's default (on)

    @staticmethod
    def parse(text: str) -> "Config":
        spec, _, layout = text.partition("@")
        parts = spec.split(":")
        if len(parts) not in (2, 3, 4) or (layout and layout.count("/") != 1) \
                or (len(parts) == 4 and parts[3] not in ("encoded", "decoded")):
            raise SystemExit(f"--unstall {text!r}: expected "
                             "TRANSPORT:DTYPE[:REINDEX_MEMORY[:encoded|decoded]][@SIDECAR_CPUS/JOB_CPUS]")
        cpus = [cpu_set(c) for c in layout.split("/")] if layout else [None, None]
        return Config(parts[0], parts[1], parts[2] if len(parts) >= 3 else None, cpus[0], cpus[1],
                      parts[3] if len(parts) == 4 else None)

    @property
    def kind(self) -> str:
        extra = "" if self.reindex_memory is None else f" reindex-memory {self.reindex_memory}"
        extra += "" if self.forms is None else f" {self.forms} form"
        if self.sidecar_cpus is not None:
            extra += f", sidecar on CPU {sorted(self.sidecar_cpus)}, jobs on {sorted(self.job_cpus or ())}"
        return f"unstall {self.transport} {self.dtype}{extra}"

    @property
    def sidecar_args(self) -> list[str]:
        return [] if self.reindex_memory is None else ["--reindex-memory", self.reindex_memory]

    @property
    def java_options(self) -> list[str]:
        return ["-Dunstall.prep.decoded-form=off"] if self.forms == "encoded" else []


def run_jobs(kind: str, k: int, data: Path, extra: list[str], env: dict[str, str], cpus: Optional[set[int]] = None,
             *, script: Path = Path(__file__), meter: Optional[contextlib.AbstractContextManager[Any]] = None
             ) -> tuple[list[dict[str, Any]], tuple[float, float]]:
    """The k jobs' results, and the whole machine's (busy, idle) CPU seconds from GO until the last job printed
    its result (its interpreter's exit left out). Each job is ``script --job KIND --data DATA --seed I *extra``
    (await_go, then one ``RESULT {json}`` line on stdout); ``meter`` (a CpuMeter) is entered at GO and left with
    the last result, so that it leaves the jobs' set-up out."""
    procs, errs = [], []
    for i in range(k):
        cmd = [sys.executable, str(script), "--job", kind, "--data", str(data), "--seed", str(i), *extra]
        errs.append(tempfile.TemporaryFile("w+"))  # a file, not a pipe: stdout is read line by line below
        with pinned(cpus):
            procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errs[-1],
                                          text=True, env=env))

    def fail(what: str, i: int, line: str = "") -> NoReturn:
        procs[i].kill()
        procs[i].wait()
        errs[i].seek(0)
        raise SystemExit(f"{kind} job {what}: {line}{errs[i].read()[-3000:]}")

    for i, p in enumerate(procs):  # all set up (imports, joins) before the clock starts
        line = p.stdout.readline()
        if line.strip() != "READY":
            fail("failed to start", i, line)
    with meter if meter is not None else contextlib.nullcontext():
        m0 = machine_busy()
        for p in procs:
            p.stdin.write("GO\n")
            p.stdin.flush()
        results = []
        for i, p in enumerate(procs):
            for line in p.stdout:
                if line.startswith("RESULT "):
                    results.append(json.loads(line[7:]))
                    break
            else:
                fail(f"failed ({p.wait()})", i)
        m1 = machine_busy()
    for i, p in enumerate(procs):
        p.stdin.close()
        p.stdout.read()
        if p.wait() != 0:
            fail(f"failed ({p.returncode}) after its result", i)
        errs[i].close()
    return results, (m1[0] - m0[0], m1[1] - m0[1])


def summarize(results: list[dict[str, Any]], machine: tuple[float, float], extra_cpu: float = 0.0,
              epochs: int = 1) -> dict[str, float]:
    """One run of k jobs that read ``epochs`` epochs each: its rates, and its CPU per epoch."""
    images = sum(r["images"] for r in results)
    start = min(r["start"] for r in results)
    wall = max(r["end"] for r in results) - start
    jobs_cpu = sum(r["cpu"] for r in results) / epochs
    row = {"images_per_s": images / wall, "cpu_s_per_epoch": jobs_cpu + extra_cpu / epochs, "jobs_cpu_s": jobs_cpu,
           "wall_s": wall, "images": images, "machine_busy_s": machine[0], "machine_idle_s": machine[1]}
    if all(r.get("first") for r in results):  # until every job had its first batch: joins, the first prep
        row["first_batch_s"] = max(r["first"] for r in results) - start
    return row


def tjbench_rate(data: Path, samples: int = 4, seconds: float = 2) -> Optional[float]:
    """Single-thread libjpeg-turbo decode rate (images per CPU second) on a few of the dataset's images."""
    exe = shutil.which("tjbench")
    if exe is None:
        return None
    rates = []
    scratch = Path(tempfile.mkdtemp(prefix="tjbench-"))  # tjbench writes its decoded images next to the input
    try:
        copies = [Path(shutil.copy(f, scratch / f.name)) for f in sorted(data.rglob("*.jpg"))[:samples]]
        for f in copies:
            c0, t0 = _children_cpu(), time.time()
            p = subprocess.run([exe, str(f), "-benchtime", str(seconds), "-warmup", "1"], capture_output=True, text=True)
            share = (_children_cpu() - c0) / (time.time() - t0)  # of a core: < 1 when others use the machine
            m = re.search(r"Decompress\s+-->\s+Frame rate:\s+([\d.]+)", p.stdout)
            if m:  # tjbench reports frames per wall second; per CPU second is what the sidecar's rate is
                rates.append(float(m.group(1)) / min(1.0, max(share, 1e-3)))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return sum(rates) / len(rates) if rates else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=640)
    ap.add_argument("--data", type=Path, default=Path.home() / ".cache" / "unstall" / "bench-prep")
    ap.add_argument("--ks", default="1,2,4")
    ap.add_argument("--repeats", type=int, default=3,
                    help="run the ks this many times, interleaved (each repeat's ratios against its own k=1 run; "
                         "tjbench just before each k=1 run of unstall); medians and min-max are reported")
    ap.add_argument("--systems", default="unstall,torch,tf")
    ap.add_argument("--warmup", type=int, default=3,
                    help="unstall: runs (of --epochs epochs) at the first k before measuring, then one at each other "
                         "k: the cache fills and the sidecar's JIT compiles most of the path (it goes on compiling "
                         "for minutes; the JIT column shows how much), as it would early in a training job of hours")
    ap.add_argument("--unstall", default="auto:float32,flight:uint8",
                    help="unstall configurations, each "
                         "TRANSPORT:DTYPE[:REINDEX_MEMORY[:FORMS]][@SIDECAR_CPUS/JOB_CPUS] "
                         "(transport auto = shared memory on this host, shm, flight; dtype float32 (normalized), "
                         "uint8, float16, bfloat16; REINDEX_MEMORY: the sidecar's --reindex-memory, 0 to decode without "
                         "restart-indexed copies; FORMS: encoded (the decoded form off) or decoded (the default); "
                         "@0/1: the sidecar pinned to CPU 0 and the jobs to CPU 1)")
    ap.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)  # a job's own
    ap.add_argument("--transport", default="auto", help=argparse.SUPPRESS)
    ap.add_argument("--compression", choices=("lz4", "zstd"), help="unstall over Flight: Arrow IPC body compression")
    ap.add_argument("--python-transforms", type=int, default=0, metavar="W",
                    help="unstall: torchvision transforms in W DataLoader worker processes per job, shared through "
                         "the group (SharedTransformLoader), instead of the sidecar's pipeline")
    ap.add_argument("--threads", type=int, default=0, metavar="N",
                    help="unstall: note the sidecar's N busiest threads (by name) in each configuration's first repeat")
    ap.add_argument("--java-option", action="append", default=[], metavar="OPT",
                    help="unstall: a JVM option for the sidecar (repeatable), e.g. -XX:+PrintCompilation (its log: "
                         "TMPDIR/unstall-bench-PID-*/sidecar.log)")
    ap.add_argument("--epochs", type=int, default=3,
                    help="unstall: epochs each job reads in a measured run (one group membership; the join and the "
                         "first batch are paid once per job, as in training)")
    ap.add_argument("--job")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--location")
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--window", type=int, help="unstall: pin the prep window (default: autotuned)")
    args = ap.parse_args()

    if args.job:
        if args.job == "unstall":
            r = job_unstall(args.data, args.location, args.k, 0, args.dtype, args.transport,  # same seed: one group
                            args.window, args.compression, args.python_transforms, args.epochs)
        elif args.job == "torch":
            r = job_torch(args.data, args.seed)
        else:
            r = job_tf(args.data, args.seed)
        print("RESULT " + json.dumps(r), flush=True)
        return

    import unstall

    data = make_dataset(args.data.expanduser() / f"n{args.images}", args.images)
    files = list(data.rglob("*.jpg"))
    avg_kb = sum(f.stat().st_size for f in files) / len(files) / 1024
    ks = [int(k) for k in args.ks.split(",")]
    systems = args.systems.split(",")
    print(f"# unstall coordinated-prep benchmark, {utc_stamp()}")
    print(f"# {platform.node()}: {os.cpu_count()} cores; {len(files)} JPEGs 500x375, {avg_kb:.0f} KB avg; "
          f"batch {BATCH}; RandomResizedCrop {SIZE} + flip + normalize; unstall configurations {args.unstall}, "
          f"compression {args.compression}, python transforms in {args.python_transforms} workers per job; "
          "every job reads every byte of every batch (a sum of its bytes as 64-bit words)")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=str(REPO / "python-shim" / "src"))
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}  # (system, k) -> one row per repeat
    per_core: dict[str, list[float]] = {}  # unstall system -> per repeat: sidecar per core / tjbench just before
    tjs: list[float] = []

    def tj_now() -> Optional[float]:
        tj = tjbench_rate(data, samples=2, seconds=1)
        if tj is not None:
            tjs.append(tj)
        return tj

    notes: list[str] = []  # printed after the tables
    configs = [Config.parse(c) for c in args.unstall.split(",")] if "unstall" in systems else []
    for cfg in configs:
        transport, dtype, kind = cfg.transport, cfg.dtype, cfg.kind
        home = Path(os.environ.get("TMPDIR", "/tmp")) / f"unstall-bench-{os.getpid()}-{transport}-{dtype}-{cfg.forms}"
        with contextlib.ExitStack() as stack:
            with pinned(cfg.sidecar_cpus):  # the JVM sizes its pools to the CPUs it starts on
                sidecar = stack.enter_context(unstall.Sidecar(
                    home=home, cache_capacity="512MiB", memory_budget="2GiB",
                    java_options=["-XX:MaxDirectMemorySize=3g", *args.java_option, *cfg.java_options],
                    extra_args=cfg.sidecar_args))
            sidecar.register_dataset("bench", data)
            env_u = dict(env, UNSTALL_TOKEN=sidecar.token)
            extra = ["--location", sidecar.flight_location, "--dtype", dtype, "--transport", transport]
            if args.window is not None:
                extra += ["--window", str(args.window)]
            extra += ["--python-transforms", str(args.python_transforms), "--epochs", str(args.epochs)]
            extra += ["--compression", args.compression] if args.compression else []

            def unstall_run(k: int, sidecar: Any = sidecar, extra: list[str] = extra, env_u: dict[str, str] = env_u,
                            cfg: Any = cfg) -> tuple[list[dict[str, Any]], dict[str, float]]:
                """One run of k jobs (--epochs each): their results, and the summary with the sidecar's CPU in it."""
                c0, j0 = proc_cpu(sidecar.pid), jit_cpu(sidecar.pid)
                res, machine = run_jobs("unstall", k, data, extra + ["--k", str(k)], env_u, cfg.job_cpus)
                row = summarize(res, machine, proc_cpu(sidecar.pid) - c0, args.epochs)
                row["jit_s"] = (jit_cpu(sidecar.pid) - j0) / args.epochs
                return res, row

            warm = []
            for k in [ks[0]] * args.warmup + ks[1:]:  # warm-up: the cache, and the JIT's steady state at every k
                w = unstall_run(k)[1]
                warm.append(f"k={k} {w['images_per_s']:.0f} images/s, {w['cpu_s_per_epoch']:.1f} CPU s/epoch "
                            f"(JIT {w['jit_s']:.2f})")
            notes.append(f"{kind}: warm-up runs of {args.epochs} epochs (the first makes the restart-indexed copies): "
                         + "; ".join(warm))
            for rep in range(args.repeats):  # the ks interleaved, so that drift hits every k alike
                for k in ks:
                    tj = tj_now() if k == ks[0] else None
                    t0 = thread_cpu(sidecar.pid) if args.threads and rep == 0 else {}
                    res, row = unstall_run(k)
                    if t0:
                        t1 = thread_cpu(sidecar.pid)
                        top = sorted(((t1[n] - t0.get(n, 0.0), n) for n in t1), reverse=True)[:args.threads]
                        notes.append(f"{kind}, k = {k}: sidecar threads' CPU s in the run: "
                                     + ", ".join(f"{n} {d:.2f}" for d, n in top if d > 0))
                    with sidecar.flight_client() as c:
                        st = json.loads(c.do_action("prep.stats")[0])
                    g = st["groups"][res[0]["group"]]
                    row["prepared"] = g["samples_prepared"]
                    row["prep_ms"] = 1e3 * g["decode_cpu_seconds"] / max(1, g["samples_prepared"])
                    row["decoder"] = st["decode"]["decoder"]
                    if "shm_slots" in g:
                        row["slots"] = g["shm_slots"]
                    sent = g.get("compression", {}).get(args.compression or "", {})
                    if sent.get("raw_bytes_sent"):
                        row["compressed"] = sent["compressed_bytes_sent"] / sent["raw_bytes_sent"]
                    if tj and g["decode_cpu_seconds"]:
                        per_core.setdefault(kind, []).append(g["samples_prepared"] / g["decode_cpu_seconds"] / tj)
                    runs.setdefault((kind, k), []).append(row)
            sizes = [r["compressed"] for k in ks for r in runs[(kind, k)] if "compressed" in r]
            if sizes:
                notes.append(f"{kind}: {args.compression} batches sent at {min(sizes):.3f}-{max(sizes):.3f} of their "
                             "raw bytes")
            for rep in range(args.repeats):
                each = [f"k={k} {runs[(kind, k)][rep]['images_per_s']:.0f} images/s, "
                        f"JIT {runs[(kind, k)][rep]['jit_s']:.2f} s/epoch" for k in ks]
                notes.append(f"{kind}, repeat {rep + 1}: " + "; ".join(each))
            dc = st["decode"]
            rx = dc.get("reindexed", {})
            notes.append(f"{kind}: restart-indexed copies {rx.get('copies', 0)} ({rx.get('bytes', 0) / 1e6:.0f} MB, "
                         f"made {rx.get('made', 0)} in {rx.get('rewrite_cpu_ms', 0) / 1e3:.1f} CPU s, "
                         f"{rx.get('hits', 0)} hits); decodes of only the crop's intervals: "
                         f"{dc.get('samples_spliced', 0)} of {dc.get('samples_native', 0)} native")
            dd = dc.get("decoded", {})
            if dd.get("enabled"):
                plans = g.get("cache_forms", [])
                notes.append(f"{kind}: decoded form {dd.get('images', 0)} images ({dd.get('bytes', 0) / 1e6:.0f} MB, "
                             f"{dd.get('hits', 0)} hits); the last plan: {plans[-1].get('reason') if plans else '-'}")
    for kind in ("torch", "tf"):
        if kind in systems:
            for _ in range(args.repeats):
                for k in ks:
                    runs.setdefault((kind, k), []).append(summarize(*run_jobs(kind, k, data, [], env)))

    def med(xs: list[float]) -> float:
        return float(statistics.median(xs))

    def spread(xs: list[float], fmt: str = "{:.2f}") -> str:
        return "" if len(xs) < 2 else f" ({fmt.format(min(xs))}-{fmt.format(max(xs))})"

    def ratios(kind: str, k: int) -> list[float]:  # per repeat: k's aggregate over k = ks[0]'s of that repeat
        return [a["images_per_s"] / b["images_per_s"] for a, b in zip(runs[(kind, k)], runs[(kind, ks[0])])]

    names = {"torch": "torch DataLoader x k (w=2)", "tf": "tf.data x k (AUTOTUNE)"}
    kinds = [c.kind for c in configs] + [k for k in ("torch", "tf") if k in systems]
    print()
    print(f"Medians of {args.repeats} repeats (min-max in brackets); x of k={ks[0]}: the median of each repeat's ratio.")
    print()
    print(f"| system | k | aggregate images/s | CPU s per epoch (all processes) | of which the jobs' | x of k={ks[0]} | "
          "s to every job's first batch | sidecar prep, CPU ms per image | sidecar JIT, CPU s per epoch | "
          "machine idle, cores |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kind in kinds:
        for k in ks:
            rows = runs.get((kind, k))
            if not rows:
                continue
            ips = [r["images_per_s"] for r in rows]
            cpu = [r["cpu_s_per_epoch"] for r in rows]
            jobs = [r["jobs_cpu_s"] for r in rows]
            x = ratios(kind, k)
            label = names.get(kind, kind.replace("unstall", "unstall coordinated,", 1))
            fb = [r["first_batch_s"] for r in rows if "first_batch_s" in r]
            pm = [r["prep_ms"] for r in rows if "prep_ms" in r]
            jit = [r["jit_s"] for r in rows if "jit_s" in r]
            idle = [r["machine_idle_s"] / (r["machine_idle_s"] + r["machine_busy_s"]) * (os.cpu_count() or 1)
                    for r in rows]
            print(f"| {label} | {k} | {med(ips):.0f}{spread(ips, '{:.0f}')} | {med(cpu):.1f}{spread(cpu, '{:.1f}')} | "
                  f"{med(jobs):.2f}{spread(jobs)} | {med(x):.2f}{spread(x)} | "
                  f"{f'{med(fb):.2f}' + spread(fb) if fb else '-'} | {f'{med(pm):.2f}' + spread(pm) if pm else '-'} | "
                  f"{f'{med(jit):.2f}' + spread(jit) if jit else '-'} | {med(idle):.2f}{spread(idle)} |")
    for (kind, k), rows in runs.items():
        for r in rows[:1]:
            if "slots" in r:
                sl = r["slots"]
                print(f"{kind}, k = {k}: /dev/shm slots created {sl['created']}, reused {sl['reused']}, "
                      f"retired {sl['retired']} for {-(-r['prepared'] // BATCH)} batches (first repeat)")
    print()
    if tjs:
        print(f"tjbench (libjpeg-turbo, 1 thread) decode only, before each k={ks[0]} run: "
              + ", ".join(f"{t:.0f}" for t in tjs) + " images per CPU-second")
    print()
    print("| the issue's bar | measured | aim |")
    print("|---|---|---|")
    for c in configs:
        kind = c.kind
        pc = per_core.get(kind)
        if pc:
            rows = runs[(kind, ks[0])]
            print(f"| sidecar pipeline per core ({kind.removeprefix('unstall ')}, decoder {rows[0]['decoder']}) vs "
                  f"tjbench decode-only just before | {med(pc):.2f}x{spread(pc)} | >= 1.0x |")
    tf1 = runs.get(("tf", 1))
    if configs and tf1 and ks[0] == 1:
        t, d = configs[0].transport, configs[0].dtype
        u1 = med([r["images_per_s"] for r in runs[(configs[0].kind, 1)]])
        f1 = med([r["images_per_s"] for r in tf1])
        print(f"| one unstall job ({t}, {d}) vs one tf.data job (AUTOTUNE), medians | {u1:.0f} / {f1:.0f} = "
              f"{u1 / f1:.2f}x | >= 1.5x |")
    if ks[0] == 1 and ks[-1] > 1:
        for c in configs:
            aim = "3.0x" if c.transport == "flight" else "3.8x"
            x = ratios(c.kind, ks[-1])
            name = c.kind.removeprefix("unstall ")
            print(f"| k = {ks[-1]} vs k = 1 ({name}) | {med(x):.2f}x{spread(x)} | >= {aim} |")
    if notes:
        print()
        for n in notes:
            print(f"* {n}")

if __name__ == "__main__":
    main()
