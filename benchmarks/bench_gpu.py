"""GPU training benchmark (not a test): how close each loader keeps a ResNet to the rate of the model alone.

On one machine and in one run, a torchvision ResNet (``--model``, weights=None) trains with SGD in bf16 autocast
on channels_last input, ``--warmup`` steps and then ``--steps`` measured steps per row, fed by:

  * nothing: the model alone, on a synthetic batch already on the device (the rate every row is a fraction of);
  * the same beside ``decode(device="mixed")`` running flat out on raw batches (vouched headers, bf16
    channels_last out, ``--decode-backend``) in a thread of this process (``beside_thread``) or a process of its
    own (``beside_process``): what the device decode costs the model, the GIL's share (a thread only) apart from
    the device's (both);
  * torch: ``torch.utils.data.DataLoader`` over an ImageFolder, torchvision decode + RandomResizedCrop + flip +
    normalize in ``--workers`` worker processes, pin_memory, copied to the device by the training loop;
  * ``unstall.torch.DataLoader(..., device=DEV)``, the same transforms in its workers, the collated batches
    prefetched to the device;
  * ``unstall.prep.PrepLoader`` uint8 host batches, copied and normalized on the device by hand;
  * ``PrepLoader(..., device=DEV)``: the sidecar prepares uint8, the loader puts the batches on the device and
    normalizes them there;
  * the same with ``decode(device="mixed")``: the sidecar serves the stored JPEG bytes, the loader decodes them
    on the device (``--decode-backend``, default auto: torchvision's whole images on CUDA; nvImageCodec, decoding
    each crop window only; nvJPEG either way on CUDA) and crops, flips and normalizes them there; ``prep_mixed_nv``:
    the same with nvImageCodec's region decode whatever ``--decode-backend`` says; ``prep_mixed_proc``: the
    decode in a process of its own (``decode_workers=1``); ``prep_mixed_whole``:
    nvImageCodec decoding whole images (``roi=False``: a hardware decoder's case);
  * the same with ``cpu_load="auto"``: of each batch the sidecar prepares the share it keeps up with, the device
    decodes the rest (the split tuned online);
  * an HP search: ``--jobs`` concurrent training processes on the one device, each with its own
    ``torch.utils.data.DataLoader`` (``--workers // --jobs`` workers each), against the same number of
    PrepLoaders sharing one prep group (group_size = jobs, one seed and pipeline);

then, per loader, the loader alone (the same batches onto the device, no model). Columns: images/s, the fraction
of the model-alone rate, busy cores (the CPU of this process, its workers, the sidecar and the jobs, from
benchmarks/_cpu.py, over the row's wall time), the machine's busy cores, images per busy core, the training
thread's CPU ms and wall ms per batch to get the next batch onto the device (``next()`` plus the copy; the wall ms
is the stall the trainer sees, waiting there), and for the device rows the part of the CPU ms the loader's
``device_stats`` count (the hand-out to the device), and the training thread's CPU ms per step (the model's
launches). Ratios are against the model-alone row of the same run; nothing is asserted.

    python benchmarks/bench_gpu.py [--model resnet18|resnet50] [--batch 256] [--steps 100] [--warmup 20]
        [--workers N] [--jobs 4] [--images 9600] [--size 500x375] [--data DIR] [--device cuda|cpu]
        [--jpeg q75|q93|prog] [--rows ROW,...] [--sidecar-cpus N] [--trainer-cpus N] [--decode-backend auto|nvimgcodec|torchvision]
        [--hw-decoder-load F] [--json PATH] [--toy]

``--toy`` makes everything tiny (48 images of 64x48, batch 8, 2 steps, 64-pixel crops, 2 jobs) so that it runs
end to end on a CPU in seconds of work; tests/python/test_bench_gpu.py runs it so. The data: ``--data DIR`` (an
image folder), else photo-like JPEGs generated once under ``--cache-dir`` (bench_prep's generator, re-encoded as
jpeg_variants' q75 unless ``--jpeg`` says otherwise). Needs torch,
torchvision, and the sidecar (``unstall.Sidecar`` finds the jar and a Java as the shim does). Progress lines, one
per row, go to stderr; the table, with the machine, the date, the commit and the command, to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import io
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "python-shim" / "src"))
sys.path.insert(0, str(HERE))

from _cpu import CpuMeter, machine_busy, self_cpu  # noqa: E402
from _report import header  # noqa: E402
from bench_prep import MEAN, STD, await_go, photo, run_jobs, summarize  # noqa: E402
from jpeg_variants import VARIANTS  # noqa: E402

from unstall.prep.mixed import resolve_backend  # noqa: E402
from unstall.prep.pipeline import DECODE_BACKENDS  # noqa: E402

__all__ = ["main"]

DATASET = "bench-gpu"
HP_KINDS = ("torch", "prep", "mixed", "mixed_solo")  # the HP-search rows' jobs (--job)
HP_ROWS = tuple(f"hp_{kind}" for kind in HP_KINDS)
BESIDE = {"beside_thread": "a thread of this process", "beside_process": "a process of its own"}
"""The model-alone rows with decode(device='mixed') running flat out beside the model: where it runs."""
# The full run (the setting) and --toy; an option given on the command line wins over both.
FULL = dict(model="resnet18", batch=256, steps=100, warmup=20, crop=224, jobs=4, images=9600, size="500x375",
            workers=max(1, (os.cpu_count() or 2) - 1))
TOY = dict(model="resnet18", batch=8, steps=2, warmup=1, crop=64, jobs=2, images=48, size="64x48", workers=2)

Batches = Iterator[Tuple[Any, Any]]  # (images, labels) on the device, ready for the model


# ---------------------------------------------------------------------------------------------
# Data: photo-like JPEGs in 10 class folders, generated in parallel (bench_prep.photo, one seed per image), as
# they come (q93, noisy) or as one of jpeg_variants' smoother re-encodings (q75: ImageNet-like bits per pixel)


def _write_photo(job: Tuple[Path, int, int, int, str]) -> None:
    import numpy as np
    from PIL import Image, ImageFilter

    root, i, w, h, jpeg = job
    path = root / f"class{i % 10}" / f"img{i:05d}.jpg"
    data = photo(np.random.default_rng([2026, i]), w, h)
    if jpeg == "q93":
        path.write_bytes(data)
        return
    options, blur = VARIANTS[jpeg]
    Image.open(io.BytesIO(data)).convert("RGB").filter(ImageFilter.GaussianBlur(blur)).save(path, "JPEG", **options)


def photo_folder(cache: Path, n: int, w: int, h: int, jpeg: str) -> Path:
    """``n`` photo-like JPEGs of ``w`` x ``h`` under ``cache``, made once (a marker says they are complete)."""
    root = cache / f"n{n}-{w}x{h}-{jpeg}"
    marker = root / ".complete"
    if marker.exists():
        return root
    for c in range(min(n, 10)):
        (root / f"class{c}").mkdir(parents=True, exist_ok=True)
    print(f"generating {n} JPEGs of {w}x{h} ({jpeg}) under {root}", file=sys.stderr, flush=True)
    with multiprocessing.get_context("fork").Pool(min(n, os.cpu_count() or 1)) as pool:
        pool.map(_write_photo, [(root, i, w, h, jpeg) for i in range(n)], chunksize=16)
    marker.write_text("ok")
    return root


# ---------------------------------------------------------------------------------------------
# The model and the loaders


def sync(dev: Any) -> None:
    """Waits for the device's queued work (CUDA runs ahead of the host)."""
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def train_step(model_name: str, dev: Any) -> Callable[[Any, Any], None]:
    """One SGD step of a fresh torchvision ResNet on (images, labels), bf16 autocast, channels_last."""
    import torch
    import torchvision

    torch.backends.cudnn.benchmark = True
    model = getattr(torchvision.models, model_name)(weights=None).to(dev, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(images: Any, labels: Any) -> None:
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = loss_fn(model(images), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def synthetic(batch: int, crop: int, dev: Any) -> Batches:
    import torch

    images = torch.randn(batch, 3, crop, crop, device=dev).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (batch,), device=dev)
    while True:
        yield images, labels


def transforms(crop: int) -> Any:
    """What every Python-side loader runs per image: RandomResizedCrop + flip + normalize, on a uint8 tensor."""
    import torch
    from torchvision.transforms import v2

    return v2.Compose([v2.RandomResizedCrop(crop, antialias=True), v2.RandomHorizontalFlip(),
                       v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])


def decode_file(path: str) -> Any:
    """torchvision decode of an image file, as unstall.torch.decode_image does for the sidecar's bytes."""
    from torchvision.io import ImageReadMode, decode_image, read_file

    return decode_image(read_file(path), mode=ImageReadMode.RGB)


def forever(loader: Any) -> Iterator[Any]:
    """Epoch after epoch: a row takes as many batches as it needs, whatever the dataset's size."""
    while True:
        yield from loader


def to_device(batches: Iterator[Any], dev: Any) -> Batches:
    """Normalized float batches, copied to the device by the training loop (pinned: non_blocking)."""
    import torch

    for images, labels in batches:
        yield (images.to(dev, non_blocking=True).contiguous(memory_format=torch.channels_last),
               labels.to(dev, non_blocking=True))


def normalize_by_hand(batches: Iterator[Any], dev: Any) -> Batches:
    """uint8 NCHW host batches onto the device, then to float and normalized there: what a user writes today."""
    import torch

    mean = torch.tensor(MEAN, device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=dev).view(1, 3, 1, 1) * 255
    for images, labels in batches:
        x = images.to(dev).float().sub_(mean).div_(std).contiguous(memory_format=torch.channels_last)
        yield x, labels.to(dev, non_blocking=True)


def on_device(batches: Iterator[Any], dev: Any) -> Batches:
    """Batches the loader already put on the device (normalized there); only the labels may still be on the host."""
    for images, labels in batches:
        yield images, labels.to(dev, non_blocking=True)


def torch_loader(data: Path, crop: int, batch: int, workers: int, seed: int, dev: Any) -> Tuple[Any, Batches]:
    import torch
    from torchvision import datasets

    ds = datasets.ImageFolder(str(data), transform=transforms(crop), loader=decode_file)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                         pin_memory=dev.type == "cuda", persistent_workers=workers > 0,
                                         drop_last=True, generator=torch.Generator().manual_seed(seed))
    return loader, to_device(forever(loader), dev)


def unstall_loader(sidecar: Any, crop: int, batch: int, workers: int, seed: int, dev: Any) -> Tuple[Any, Batches]:
    import unstall.torch as ut

    ds = ut.Dataset(DATASET, sidecar=sidecar, loader=ut.decode_image, transform=transforms(crop))
    loader = ut.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, persistent_workers=workers > 0,
                           drop_last=True, seed=seed, device=dev, device_prefetch=2)
    return loader, on_device(forever(loader), dev)


def prep_loader(crop: int, batch: int, seed: int, k: int, dev: Any, device: bool, mixed: bool = False,
                cpu_load: Any = None, device_share: bool = True, backend: str = "auto", roi: Optional[bool] = None,
                hw_decoder_load: Optional[float] = None, decode_workers: int = 0,
                **where: Any) -> Tuple[Any, Batches]:
    """A PrepLoader in a group of ``k``: host uint8 batches normalized by hand, or (``device``) batches the
    loader puts on the device, normalized there from the sidecar's uint8, or (``mixed``) decoded there from the
    stored JPEG bytes (``decode(device="mixed", cpu_load=, backend=, roi=, hw_decoder_load=)``; ``device_share``: the group's
    members on the device decode each batch once between them). ``where``: ``sidecar=`` or ``client=``."""
    import torch
    from unstall import prep

    if device:
        pipe = prep.imagenet_train(crop, dtype="bfloat16", layout="NHWC", decode_device="mixed" if mixed else None,
                                   decode_backend=backend if mixed else None)
        if mixed and (cpu_load is not None or roi is not None or hw_decoder_load is not None):
            hw = hw_decoder_load if backend != "torchvision" else None
            pipe = prep.Pipeline((prep.decode(device="mixed", cpu_load=cpu_load, backend=backend, roi=roi,
                                              hw_decoder_load=hw),
                                  *pipe.ops[1:]), layout="NHWC", dtype="bfloat16")
        loader = prep.PrepLoader(DATASET, pipe, batch_size=batch, seed=seed, group_size=k, drop_last=True,
                                 device=str(dev), device_prefetch=2, memory_format=torch.channels_last,
                                 device_share=device_share, decode_workers=decode_workers, **where)
        return loader, on_device(forever(loader), dev)
    loader = prep.PrepLoader(DATASET, prep.imagenet_train(crop, dtype="uint8"), batch_size=batch, seed=seed,
                             group_size=k, drop_last=True, **where)
    return loader, normalize_by_hand(forever(loader), dev)


def sidecar_java(args: argparse.Namespace, home: Path) -> Optional[str]:
    """With ``--sidecar-cpus N``: a java that runs under ``taskset -c 0-(N-1)`` (the JVM sizes its pools to it)."""
    if not args.sidecar_cpus:
        return None
    from unstall.sidecar import find_java

    if not 1 <= args.sidecar_cpus <= (os.cpu_count() or 1):
        raise SystemExit(f"--sidecar-cpus {args.sidecar_cpus}: this machine has {os.cpu_count()} cores")
    wrapper = home / "java-taskset"
    wrapper.write_text(f'#!/bin/sh\nexec taskset -c 0-{args.sidecar_cpus - 1} "{find_java()}" "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def pin_trainer(args: argparse.Namespace) -> None:
    """With ``--trainer-cpus N``: this process, and the jobs it starts, on the N cores after the sidecar's."""
    if not args.trainer_cpus:
        return
    first = args.sidecar_cpus or 0
    if args.trainer_cpus < 1 or first + args.trainer_cpus > (os.cpu_count() or 1):
        raise SystemExit(f"--trainer-cpus {args.trainer_cpus} after the sidecar's {first}: this machine has "
                         f"{os.cpu_count()} cores")
    os.sched_setaffinity(0, range(first, first + args.trainer_cpus))


def handed_out(loader: Any) -> Optional[Tuple[int, float]]:
    """(batches copied to the device, the training thread's CPU seconds handing them out) so far, from the
    loader's ``device_stats``; None for a loader that does not put batches on the device."""
    stats = getattr(loader, "device_stats", None)
    return None if stats is None else (stats.batches, stats.handout_cpu_s)


def copy_ms(before: Optional[Tuple[int, float]], after: Optional[Tuple[int, float]]) -> Optional[float]:
    """The training thread's CPU ms per batch for the last hop between two ``handed_out`` readings."""
    if before is None or after is None or after[0] == before[0]:
        return None
    return 1e3 * (after[1] - before[1]) / (after[0] - before[0])


def close(loader: Any, batches: Iterator[Any]) -> None:
    """Stops a row's loader: its workers (torch's shut down with their iterator) or its group membership."""
    batches.close()  # type: ignore[attr-defined]
    if hasattr(loader, "close"):
        loader.close()


# ---------------------------------------------------------------------------------------------
# Measuring a row


@dataclasses.dataclass
class Row:
    key: str  # stable across runs: model, beside_*, torch, unstall, prep, prep_device, prep_mixed, prep_mixed_proc,
    # prep_mixed_nv,
    # prep_mixed_whole, prep_hybrid, hp_torch, hp_prep, hp_mixed, hp_mixed_solo; KEY_alone
    row: str
    images_per_s: float
    busy_cores: float  # CPU seconds of the processes involved / wall seconds
    machine_busy_cores: float
    input_cpu_ms_per_batch: Optional[float]  # the training thread, in next() (and the copy) per batch
    input_wall_ms_per_batch: Optional[float]  # the same, wall time: what the trainer waited
    copy_cpu_ms_per_batch: Optional[float] = None  # the loader's stats
    of_model_alone: Optional[float] = None
    images: int = 0
    wall_s: float = 0.0
    error: Optional[str] = None  # the row failed: what it raised (the run goes on with the next row)
    decodes: Optional[dict[str, int]] = None  # hp_mixed*: the jobs' batches decoded, received from another, fallbacks
    step_cpu_ms_per_batch: Optional[float] = None  # the training thread's CPU in the step (the model's launches)

    @property
    def images_per_busy_core(self) -> Optional[float]:
        return self.images_per_s / self.busy_cores if self.busy_cores > 0 else None


def machine_cores(busy_s: float, idle_s: float) -> float:
    """The machine's busy cores over a span in which all its cores were busy ``busy_s`` and idle ``idle_s``."""
    return busy_s / max(busy_s + idle_s, 1e-9) * (os.cpu_count() or 1)


def run_steps(batches: Batches, step: Optional[Callable[[Any, Any], None]], n: int) -> Tuple[float, float, float]:
    """``n`` steps (or with ``step=None`` just ``n`` batches): the training thread's CPU and wall seconds in
    ``next()``, and its CPU seconds in the steps (the model's launches: near their wall time, the model is bound by
    this thread, and whatever holds the GIL beside it slows it)."""
    cpu = wall = in_step = 0.0
    for _ in range(n):
        c, w = time.thread_time(), time.perf_counter()
        images, labels = next(batches)
        cpu += time.thread_time() - c
        wall += time.perf_counter() - w
        if step is not None:
            c = time.thread_time()
            step(images, labels)
            in_step += time.thread_time() - c
    return cpu, wall, in_step


def measure(key: str, name: str, loader: Any, batches: Batches, step: Optional[Callable[[Any, Any], None]],
            args: argparse.Namespace, dev: Any, pids: Sequence[Optional[int]]) -> Row:
    """``--warmup`` then ``--steps`` steps (batches alone with ``step=None``) in this process, timed."""
    run_steps(batches, step, args.warmup)
    sync(dev)
    with CpuMeter([os.getpid(), *pids]) as cpu:
        m0, h0, t0 = machine_busy(), handed_out(loader), time.perf_counter()
        in_next, in_next_wall, in_step = run_steps(batches, step, args.steps)
        sync(dev)
        wall, m1, h1 = time.perf_counter() - t0, machine_busy(), handed_out(loader)
    images = args.steps * args.batch
    return Row(key, name, images / wall, cpu.seconds / wall, machine_cores(m1[0] - m0[0], m1[1] - m0[1]),
               1e3 * in_next / args.steps, 1e3 * in_next_wall / args.steps, copy_ms(h0, h1), images=images,
               wall_s=wall, step_cpu_ms_per_batch=1e3 * in_step / args.steps if step is not None else None)


def raw_batches(data: Path, batch: int, n: int) -> list[Tuple[list[Any], list[int], Any]]:
    """``n`` batches of ``data``'s first JPEGs as a raw group's member receives them: each row's bytes (tensors over
    one buffer) and the header the sidecar vouches for (packed from ``jpeg_rules``' answer, which is the
    sidecar's)."""
    import numpy as np
    from unstall.prep.jpeg_rules import jpeg_check
    from unstall.prep.mixed import payload_tensors
    from unstall.prep.mixed_parts import image_header
    from unstall.protocol import VouchedHeader

    files = sorted(p for p in data.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))[: batch * n]
    blobs = [p.read_bytes() for p in files]
    flat = np.frombuffer(b"".join(blobs), dtype=np.uint8)
    payloads = payload_tensors(flat, np.concatenate([[0], np.cumsum([len(b) for b in blobs])]))

    def packed(x: Any) -> int:
        kind, w, h = image_header(x)
        c = jpeg_check(x) if kind == "jpeg" else None
        return -1 if c is None or c.problem else VouchedHeader(w, h, c.standard_tables, c.first_scan).packed()

    headers = np.array([packed(x.numpy()) for x in payloads], dtype=np.int64)
    return [(payloads[i:i + batch], list(range(i, i + batch)), headers[i:i + batch])
            for i in range(0, len(payloads) - batch + 1, batch)]


def decode_loop(data: str, batch: int, crop: int, device: str, backend: str, stop: Any, count: Any) -> None:
    """decode(device='mixed') of raw batches, flat out until ``stop`` is set: a PrepLoader's feeding thread's work
    per batch (the host's checks on vouched rows, the draws, the decode, crop, resize, flip, normalize to bf16
    channels_last) on its own CUDA stream, without the sidecar; ``count`` (a multiprocessing Value) gains each
    batch's images."""
    import torch
    from unstall import prep
    from unstall.prep.mixed import MixedDecode

    dev = torch.device(device)
    batches = raw_batches(Path(data), batch, 4)
    if not batches:
        raise SystemExit(f"{data}: fewer JPEGs than one batch of {batch}")
    ops = [dict(o) for o in prep.imagenet_train(crop, dtype="bfloat16", layout="NHWC", decode_device="mixed",
                                                decode_backend=backend).ops]
    mixed = MixedDecode(ops, "bfloat16", "NHWC", dev, memory_format=torch.channels_last)
    stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        while not stop.is_set():
            for payloads, ids, headers in batches:
                mixed(payloads, ids, 0, 7, headers=headers)
                with count.get_lock():
                    count.value += len(ids)


def beside(key: str, args: argparse.Namespace, data: Path, dev: Any, step: Callable[[Any, Any], None],
           pids: Sequence[Optional[int]]) -> Row:
    """The model alone on its synthetic batch while ``decode_loop`` runs in ``BESIDE[key]``: against the model-alone
    row, a fall in a thread that a process does not show is the GIL's, one in both the device's. The row's name
    gives what the decoder made meanwhile."""
    ctx = multiprocessing.get_context("spawn")
    stop, count = ctx.Event(), ctx.Value("q", 0)
    argv = (str(data), args.batch, args.crop, str(dev), args.decode_backend, stop, count)
    worker: Any = (ctx.Process(target=decode_loop, args=argv, daemon=True) if key == "beside_process" else
                   threading.Thread(target=decode_loop, args=argv, daemon=True))
    worker.start()
    try:
        deadline = time.monotonic() + 600  # a bound on a hang (a first CUDA context, a decoder's start)
        while count.value == 0:
            if not worker.is_alive():
                raise RuntimeError("the decode loop ended before its first batch (its error above)")
            if time.monotonic() > deadline:
                raise RuntimeError("the decode loop made no batch in 600 s")
            time.sleep(0.05)
        c0, t0 = count.value, time.perf_counter()
        name = f"{args.model} alone, synthetic batch, beside decode(device='mixed') flat out in {BESIDE[key]}"
        row = measure(key, name, None, synthetic(args.batch, args.crop, dev), step, args, dev,
                      [*pids, getattr(worker, "pid", None)])
        row.row += f" (it made {(count.value - c0) / (time.perf_counter() - t0):,.0f} images/s)"
        return row
    finally:
        stop.set()
        worker.join(timeout=60)


def job(args: argparse.Namespace) -> None:
    """One HP-search job (a process of run_jobs): warm up, await GO, train --steps steps, print RESULT."""
    import torch

    dev = torch.device(args.device)
    step = train_step(args.model, dev)
    workers = max(1, args.workers // args.k)
    if args.job == "torch":
        loader, batches = torch_loader(args.data, args.crop, args.batch, workers, args.seed, dev)
    else:
        import unstall

        client = unstall.FlightClient(args.location, os.environ["UNSTALL_TOKEN"])
        # One seed for all: the group's key, so that the k jobs share every prepared batch.
        mixed = args.job in ("mixed", "mixed_solo")
        loader, batches = prep_loader(args.crop, args.batch, 0, args.k, dev, True, mixed,
                                      device_share=args.job != "mixed_solo", backend=args.decode_backend,
                                      hw_decoder_load=args.hw_decoder_load,
                                      client=client)
    run_steps(batches, step, args.warmup)  # the group forms here: its first batch waits for all k members
    sync(dev)
    await_go()
    t0, c0, h0 = time.time(), self_cpu(), handed_out(loader)
    in_next, in_next_wall, _ = run_steps(batches, step, args.steps)
    sync(dev)
    result = {"start": t0, "end": time.time(), "cpu": self_cpu() - c0, "images": args.steps * args.batch,
              "input_ms": 1e3 * in_next / args.steps, "input_wall_ms": 1e3 * in_next_wall / args.steps,
              "copy_ms": copy_ms(h0, handed_out(loader)),
              "share": loader.share_stats.as_dict() if getattr(loader, "share_stats", None) is not None else None}
    print("RESULT " + json.dumps(result), flush=True)
    close(loader, batches)


def decode_counts(results: Sequence[dict[str, Any]]) -> Optional[dict[str, int]]:
    """The jobs' ``share_stats`` summed (``decoded``, ``received``, ``fallbacks``); None when no job shared."""
    shares = [r["share"] for r in results if r.get("share")]
    return {k: sum(sh[k] for sh in shares) for k in ("decoded", "received", "fallbacks")} if shares else None


def hp_search(name: str, kind: str, args: argparse.Namespace, data: Path, sidecar: Any) -> Row:
    """``--jobs`` training processes at once on the one device (bench_prep.run_jobs), timed from GO."""
    keep = ["--model", "--batch", "--steps", "--warmup", "--crop", "--workers", "--device", "--decode-backend"]
    extra = [a for opt in keep for a in (opt, str(getattr(args, opt[2:].replace("-", "_"))))]
    extra += ["--k", str(args.jobs), "--location", sidecar.flight_location]
    if args.hw_decoder_load is not None:
        extra += ["--hw-decoder-load", str(args.hw_decoder_load)]
    path = os.pathsep.join(filter(None, [str(REPO / "python-shim" / "src"), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, UNSTALL_TOKEN=sidecar.token, PYTHONPATH=path)  # the bundle's site (gpu_node.sh) too
    meter = CpuMeter([os.getpid(), sidecar.pid])
    results, machine = run_jobs(kind, args.jobs, data, extra, env, script=Path(__file__), meter=meter)
    s = summarize(results, machine)
    copies = [r["copy_ms"] for r in results if r.get("copy_ms") is not None]
    decoded = decode_counts(results)
    return Row(f"hp_{kind}", name, s["images_per_s"], meter.seconds / s["wall_s"],
               machine_cores(*machine),
               sum(r["input_ms"] for r in results) / len(results),
               sum(r["input_wall_ms"] for r in results) / len(results),
               sum(copies) / len(copies) if copies else None, images=int(s["images"]), wall_s=s["wall_s"],
               decodes=decoded)


# ---------------------------------------------------------------------------------------------
# Report


def git_commit() -> str:
    if os.environ.get("UNSTALL_BENCH_COMMIT"):  # a copy of the tree without .git (benchmarks/gpu_node.sh)
        return os.environ["UNSTALL_BENCH_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty", "--abbrev=12"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no git)"
    return out.stdout.strip() or "unknown (not a git checkout)"


def gpu_name(dev: Any) -> str:
    import torch

    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        return f"{p.name}, {p.total_memory / 2**30:.0f} GiB"
    return "none (device cpu)"


def fmt(value: Optional[float], digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def table(rows: Sequence[Row]) -> list[str]:
    lines = ["| row | images/s | of the model alone | busy cores | machine busy cores | images/s per busy core | "
             "training thread CPU ms per batch: next() + copy | training thread wall ms per batch in next() | "
             "of which the hand-out to the device (device_stats, CPU ms) | training thread CPU ms per step |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.error is not None:
            lines.append(f"| {r.row} | failed: {r.error} | - | - | - | - | - | - | - | - |")
            continue
        lines.append(f"| {r.row} | {fmt(r.images_per_s)} | {fmt(r.of_model_alone, 2)} | {fmt(r.busy_cores, 1)} | "
                     f"{fmt(r.machine_busy_cores, 1)} | {fmt(r.images_per_busy_core)} | "
                     f"{fmt(r.input_cpu_ms_per_batch, 2)} | {fmt(r.input_wall_ms_per_batch, 2)} | "
                     f"{fmt(r.copy_cpu_ms_per_batch, 2)} | {fmt(r.step_cpu_ms_per_batch, 2)} |")
    shared = [r for r in rows if r.decodes is not None and r.error is None]
    if shared:
        lines.append("")
    for r in shared:
        d = r.decodes or {}
        lines.append(f"- {r.row}: the jobs decoded {d['decoded']:,} batches and took {d['received']:,} from another "
                     f"job's decode ({d['fallbacks']:,} decoded again after a job that claimed them could not hand "
                     "them over)")
    return lines


# ---------------------------------------------------------------------------------------------
# Driver


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--toy", action="store_true", help="tiny everything, so that it runs on a CPU in seconds")
    ap.add_argument("--model", choices=("resnet18", "resnet50"), help="torchvision ResNet, weights=None")
    ap.add_argument("--batch", type=int, help="batch size (full 256, toy 8)")
    ap.add_argument("--steps", type=int, help="measured steps per row (full 100, toy 2)")
    ap.add_argument("--warmup", type=int, help="steps per row before measuring (full 20, toy 1)")
    ap.add_argument("--crop", type=int, help="RandomResizedCrop's size, the model's input (full 224, toy 64)")
    ap.add_argument("--workers", type=int, help="DataLoader workers of the single-job rows, split among the jobs "
                                                "of the HP search (full: CPUs - 1, toy 2)")
    ap.add_argument("--jobs", type=int, help="k, the HP search's concurrent jobs (full 4, toy 2)")
    add_photo_options(ap, "full 9600, toy 48", "full 500x375, toy 64x48")
    ap.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    ap.add_argument("--no-loader-alone", dest="loader_alone", action="store_false",
                    help="leave out the loader-alone rows")
    ap.add_argument("--rows", help="comma-separated rows to run (default all): torch, unstall, prep, prep_device, "
                    f"prep_mixed, prep_mixed_proc, prep_mixed_nv, prep_mixed_whole, prep_hybrid, {', '.join(HP_ROWS)}, "
                    f"{', '.join(BESIDE)}; the model-alone row "
                    "always runs")
    ap.add_argument("--sidecar-cpus", type=int, help="run the sidecar on the first N cores only (taskset -c 0-N-1): "
                    "the CPU a node has left per GPU")
    ap.add_argument("--json", type=Path, help="also write the table and the run's header as JSON")
    ap.add_argument("--data-only", action="store_true",
                    help="make the data (generated once under --cache-dir) and exit: gpu_node.sh runs it while the "
                         "tests run")
    ap.add_argument("--decode-backend", choices=DECODE_BACKENDS, default="auto",
                    help="the device's decoder in the decode(device='mixed') rows (default auto: torchvision on "
                         "CUDA, elsewhere nvImageCodec where it imports, else torchvision)")
    ap.add_argument("--hw-decoder-load", type=float, help="decode(hw_decoder_load=) of the nvImageCodec rows: the share "
                    "of each batch's JPEGs for the GPU's hardware JPEG engine (default: nvImageCodec's choice)")
    ap.add_argument("--trainer-cpus", type=int, help="run this process (the trainer, its decoder's threads, the HP "
                    "search's jobs) on N cores of its own, after the sidecar's (--sidecar-cpus)")
    args = parse_job_args(ap, argv, HP_KINDS, TOY, FULL, ("batch", "steps", "crop", "workers", "jobs", "images"))
    if args.hw_decoder_load is not None and not 0 <= args.hw_decoder_load <= 1:
        ap.error(f"--hw-decoder-load must be in [0, 1], got {args.hw_decoder_load}")
    if args.warmup < 0:
        ap.error(f"--warmup must be at least 0, got {args.warmup}")
    return args


def parse_job_args(ap: argparse.ArgumentParser, argv: Optional[Sequence[str]], kinds: Sequence[str],
                   toy: dict[str, Any], full: dict[str, Any], positive: Sequence[str]) -> argparse.Namespace:
    """Parses a benchmark's arguments with the hidden ones of its jobs (``run_jobs``: ``--job KIND``, ``--seed``,
    ``--k``, ``--location``): the toy or full defaults filled in, the device defaulted to CUDA when there is one,
    ``positive`` options checked."""
    ap.add_argument("--job", choices=tuple(kinds), help=argparse.SUPPRESS)  # one job of the run (run_jobs)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--k", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--location", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for key, value in (toy if args.toy else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    for key in positive:
        if getattr(args, key) < 1:
            ap.error(f"--{key} must be at least 1, got {getattr(args, key)}")
    return args


def add_photo_options(ap: argparse.ArgumentParser, images: str, size: str, images_default: Optional[int] = None,
                      size_default: Optional[str] = None) -> None:
    """The options ``dataset_dir`` reads (``--images``, ``--size``, ``--jpeg``, ``--data``, ``--cache-dir``), for
    every benchmark that runs on this script's generated photos; ``images`` and ``size`` say their defaults."""
    ap.add_argument("--images", type=int, default=images_default, help=f"generated JPEGs ({images})")
    ap.add_argument("--size", default=size_default, help=f"generated JPEGs' WIDTHxHEIGHT ({size})")
    ap.add_argument("--jpeg", choices=("q93", *VARIANTS), default="q75",
                    help="generated JPEGs: q93 as bench_prep makes them (about 110 KB at 500x375), or re-encoded as "
                         "benchmarks/jpeg_variants.py does (q75, the default: blurred, about 29 KB, photographs' bits "
                         "per pixel; prog: progressive q85)")
    ap.add_argument("--data", type=Path, help="an image folder (class subfolders) instead of generated JPEGs")
    ap.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "unstall" / "bench-gpu",
                    help="where generated JPEGs are kept between runs")


def dataset_dir(args: argparse.Namespace) -> Path:
    if args.data is not None:
        if not args.data.is_dir():
            raise SystemExit(f"--data {args.data}: not a directory")
        return args.data
    try:
        w, h = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--size {args.size!r}: expected WIDTHxHEIGHT, e.g. 500x375") from None
    return photo_folder(args.cache_dir.expanduser(), args.images, w, h, args.jpeg)


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    if args.job:
        job(args)
        return
    if args.data_only:  # on every core, before any pinning
        print(dataset_dir(args))
        return

    pin_trainer(args)
    import torch
    import unstall

    dev = torch.device(args.device)
    data = dataset_dir(args)
    files = [p for p in data.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png")]
    data_bytes = sum(p.stat().st_size for p in files)
    if len(files) < args.batch:
        raise SystemExit(f"{data}: {len(files)} images, fewer than one batch of {args.batch}")
    k = args.jobs
    loaders: list[Tuple[str, str, Callable[[], Tuple[Any, Batches]]]] = [
        ("torch", f"torch DataLoader, {args.workers} workers{', pin_memory' if dev.type == 'cuda' else ''}",
         lambda: torch_loader(data, args.crop, args.batch, args.workers, 1, dev)),
        ("unstall", f"unstall.torch.DataLoader(device={str(dev)!r}), {args.workers} workers",
         lambda: unstall_loader(sidecar, args.crop, args.batch, args.workers, 2, dev)),
        ("prep", "PrepLoader uint8, normalized on the device by hand",
         lambda: prep_loader(args.crop, args.batch, 3, 1, dev, False, sidecar=sidecar)),
        ("prep_device", f"PrepLoader(device={str(dev)!r}), bf16 channels_last",
         lambda: prep_loader(args.crop, args.batch, 4, 1, dev, True, sidecar=sidecar)),
        ("prep_mixed", f"PrepLoader(device={str(dev)!r}), bf16 channels_last, decode(device='mixed')",
         lambda: prep_loader(args.crop, args.batch, 5, 1, dev, True, True, backend=args.decode_backend,
                             hw_decoder_load=args.hw_decoder_load, sidecar=sidecar)),
        ("prep_mixed_proc", f"PrepLoader(device={str(dev)!r}, decode_workers=1), bf16 channels_last, "
         "decode(device='mixed') in a process of its own",
         lambda: prep_loader(args.crop, args.batch, 9, 1, dev, True, True, backend=args.decode_backend,
                             hw_decoder_load=args.hw_decoder_load, decode_workers=1, sidecar=sidecar)),
        ("prep_mixed_nv", f"PrepLoader(device={str(dev)!r}), bf16 channels_last, decode(device='mixed', "
         "backend='nvimgcodec'): each crop window decoded",
         lambda: prep_loader(args.crop, args.batch, 7, 1, dev, True, True, backend="nvimgcodec",
                             hw_decoder_load=args.hw_decoder_load, sidecar=sidecar)),
        ("prep_mixed_whole", f"PrepLoader(device={str(dev)!r}), bf16 channels_last, decode(device='mixed', "
         "backend='nvimgcodec', roi=False): whole images decoded",
         lambda: prep_loader(args.crop, args.batch, 8, 1, dev, True, True, backend="nvimgcodec", roi=False,
                             hw_decoder_load=args.hw_decoder_load, sidecar=sidecar)),
        ("prep_hybrid", f"PrepLoader(device={str(dev)!r}), bf16 channels_last, decode(device='mixed', "
         "cpu_load='auto')",
         lambda: prep_loader(args.crop, args.batch, 6, 1, dev, True, True, "auto", backend=args.decode_backend,
                             hw_decoder_load=args.hw_decoder_load, sidecar=sidecar)),
    ]
    chosen = set(args.rows.split(",")) if args.rows else {key for key, _, _ in loaders} | set(HP_ROWS) | set(BESIDE)
    unknown = chosen - {key for key, _, _ in loaders} - set(HP_ROWS) - set(BESIDE)
    if unknown:
        raise SystemExit(f"--rows: unknown rows {sorted(unknown)}; rows: {[key for key, _, _ in loaders]}, "
                         f"{', '.join(HP_ROWS)}, {', '.join(BESIDE)}")
    loaders = [entry for entry in loaders if entry[0] in chosen]
    hp = [kind for kind in HP_KINDS if f"hp_{kind}" in chosen]
    besides = [key for key in BESIDE if key in chosen]
    total = 1 + len(besides) + len(loaders) * (2 if args.loader_alone else 1) + len(hp)
    trained: list[Row] = []  # the table lists the training rows first, the loaders alone last
    alone: list[Row] = []

    def done(row: Row, into: list[Row]) -> None:
        into.append(row)
        n = len(trained) + len(alone)
        result = (f"failed: {row.error}" if row.error else
                  f"{row.images_per_s:,.0f} images/s, {row.busy_cores:.1f} busy cores, {row.wall_s:.1f} s")
        print(f"[{n}/{total}] {row.row}: {result}", file=sys.stderr, flush=True)

    def failed(key: str, name: str, e: BaseException) -> None:
        """A row that raised is a row of the table: the others still run and are reported."""
        traceback.print_exc()
        done(Row(key, name, 0.0, 0.0, 0.0, None, None, error=f"{type(e).__name__}: {e}".splitlines()[0]), trained)

    batch_bytes = args.batch * 3 * args.crop * args.crop
    cache = data_bytes + (64 << 20)
    budget = (cache + (1 << 30) + 32 * batch_bytes) * 8 // 7
    home = Path(tempfile.mkdtemp(prefix="unstall-bench-gpu-"))
    with unstall.Sidecar(home=home, cache_capacity=cache, memory_budget=budget, java=sidecar_java(args, home),
                         java_options=[f"-XX:MaxDirectMemorySize={budget // 2**20 + 256}m"]) as sidecar:
        sidecar.register_dataset(DATASET, data)
        pids = [sidecar.pid]
        step = train_step(args.model, dev)
        model_row = measure("model", f"{args.model} alone, synthetic batch on the device", None,
                        synthetic(args.batch, args.crop, dev), step, args, dev, pids)
        done(model_row, trained)
        for key in besides:
            try:
                done(beside(key, args, data, dev, step, pids), trained)
            except Exception as e:
                failed(key, f"{args.model} alone beside decode(device='mixed') in {BESIDE[key]}", e)
        for key, name, make in loaders:
            try:  # a loader that cannot be built (a decoder missing, say) is a failed row too
                loader, batches = make()
            except Exception as e:
                failed(key, name, e)
                continue
            try:
                done(measure(key, name, loader, batches, step, args, dev, pids), trained)
                if args.loader_alone:  # the same iterator, warm: no second start of workers or group
                    done(measure(f"{key}_alone", f"{name}: the loader alone", loader, batches, None, args, dev, pids),
                         alone)
            except Exception as e:
                failed(key, name, e)
            finally:
                with contextlib.suppress(Exception):
                    close(loader, batches)
        del step  # the jobs need the device's memory: this process's model and its cached blocks go first
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        searches = {"torch": f"HP search, {k} jobs: {k} torch DataLoaders ({max(1, args.workers // k)} workers each)",
                    "prep": f"HP search, {k} jobs: {k} PrepLoaders(device={str(dev)!r}) in one group",
                    "mixed": f"HP search, {k} jobs: {k} PrepLoaders(device={str(dev)!r}) in one group, "
                             "decode(device='mixed'), each batch decoded once (device_share)",
                    "mixed_solo": f"HP search, {k} jobs: {k} PrepLoaders(device={str(dev)!r}) in one group, "
                                  "decode(device='mixed'), each job decoding every batch (device_share=False)"}
        for kind in hp:
            try:
                done(hp_search(searches[kind], kind, args, data, sidecar), trained)
            except (Exception, SystemExit) as e:  # a job that failed to start exits its search
                failed(f"hp_{kind}", searches[kind], e)
    rows = trained + alone
    for r in rows:
        r.of_model_alone = None if r.error else r.images_per_s / model_row.images_per_s

    gpu = gpu_name(dev)
    commit = git_commit()
    try:
        runs = f"{resolve_backend(args.decode_backend, dev.type, args.hw_decoder_load is not None)} runs"
    except ImportError:
        runs = "not installed"
    head = header() + [f"- GPU: {gpu}", f"- commit: {commit}",
                       f"- data: {len(files)} images in {data}, {data_bytes / len(files) / 1024:.0f} KB mean; "
                       f"batch {args.batch}, {args.model}, crop {args.crop}, bf16 autocast, channels_last, SGD; "
                       f"{args.warmup} warm-up + {args.steps} measured steps per row on {dev}"
                       + (f"; the sidecar on {args.sidecar_cpus} of {os.cpu_count()} cores (taskset)"
                          if args.sidecar_cpus else "")
                       + (f"; the trainer on {args.trainer_cpus} cores of its own" if args.trainer_cpus else ""),
                       f"- decode(device='mixed') rows: backend {args.decode_backend!r}, {runs}"
                       + (f", hw_decoder_load {args.hw_decoder_load}" if args.hw_decoder_load is not None else "")]
    lines = [f"# unstall GPU benchmark ({args.model})", "", *head, "", *table(rows)]
    print("\n".join(lines), flush=True)
    if args.json is not None:
        doc = {"header": head, "argv": [sys.executable, *sys.argv], "gpu": gpu, "commit": commit,
               "cpus": os.cpu_count(), "torch": torch.__version__, "device": str(dev),
               "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                            if k not in ("job", "seed", "k", "location")},
               "rows": [dict(dataclasses.asdict(r), images_per_busy_core=r.images_per_busy_core) for r in rows]}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    if any(r.error for r in rows):
        raise SystemExit(f"bench_gpu: rows failed: {', '.join(r.key for r in rows if r.error)}")


if __name__ == "__main__":
    main()
