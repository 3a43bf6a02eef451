"""DS-Analyzer's arithmetic on three runs of ``N`` steps of ``B`` samples each:

* ``t1`` synthetic (no data work): the model's ingestion rate ``N*B/t1``;
* ``t3`` fully cached (prep, no storage): the prep rate ``N*B/t3``;
* ``t2`` cold cache (storage and prep): the fetch rate ``N*B/(t2 - t3)``.

Of the cold run's time, ``t1/t2`` is the trainer's own work, ``(t3 - t1)/t2`` the prep stall and
``(t2 - t3)/t2`` the fetch stall.

What-if, per batch, for a cached fraction ``f`` and ``k`` loader workers (DataLoader workers; a
tf.data pipeline's parallelism). ``g = t1/N`` is the trainer's step, ``Q`` the loader's work per batch
without storage (from the cached run), ``s`` the storage time per batch at the storage bandwidth
measured while warming the cache (DS-Analyzer also measures disk bandwidth on its own). The loader
stage is ``L = g + Q`` with ``k = 0`` (the trainer's thread does everything) and ``max(g, Q/k)`` with
workers. Two ways storage can behave:

* **overlapped** (the sidecar prefetches, or the link has slack and bursts):
  ``cycle = max(L, (1 - f) * s)``: storage is a stage of its own, as in DS-Analyzer's ``min`` of rates;
* **blocking** (each read waits its full transfer inside the loader):
  ``k = 0``: ``cycle = g + Q + (1 - f) * s``; ``k >= 1``: ``max(g, (Q + (1 - f) * s)/k, (1 - f) * s)``.

The model that predicts the cold run's own step best is used, and named in the report.

What-if data echoing (``unstall.echo``, factor ``e``; the job ran with ``e0``, 1 unless it echoes already):
each step needs ``1/e`` of a fresh batch, so echoing divides the upstream work per step (``Q``, ``(1 - f) * s``
and the prep CPU floor) by ``e / e0``, and leaves the trainer's step ``g`` as it is; the echo's own work (a
window of references, or for example-level echoing a copy of the rows) is not counted. The data stall per
step is ``cycle - g``; fresh samples per second are ``B / (e * cycle)``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = ["Run", "Analysis", "analyze", "cycle_time", "validate_workers", "PRICES"]

# Defaults for the cost of a configuration (USD per hour): roughly what one vCPU and one GiB of memory
# add to an on-demand cloud VM (c6i vs r6i large, us-east-1, 2026); override with --core-price/--gib-price.
ECHO_GRID = (1, 2, 3, 4)
PRICES = {"core_hour": 0.036, "gib_hour": 0.0034}
STALL_TOLERANCE = 0.05  # a configuration "removes the stall" when its step is within 5% of the trainer's own
CACHE_GRID = [i / 20 for i in range(21)]  # 0%, 5%, ..., 100%


@dataclass(frozen=True)
class Run:
    """One timed run (the ``ok`` report the shim wrote)."""

    mode: str
    steps: int
    batch_size: float
    num_workers: int
    elapsed_s: float
    fetch_s: float = 0.0
    prep_s: float = 0.0
    prep_cpu_s: float = 0.0  # the CPU time of that prep (the threads that ran it)
    fetched_samples: int = 0
    prepped_samples: int = 0
    hits: Optional[int] = None
    misses: Optional[int] = None
    storage_bytes: Optional[int] = None
    echo: int = 1  # the loader's data echoing factor (unstall.echo)

    @classmethod
    def from_report(cls, doc: Mapping[str, Any]) -> "Run":
        work = doc.get("work") or {}
        side = doc.get("sidecar") or {}
        return cls(
            mode=str(doc["mode"]), steps=int(doc["steps"]), batch_size=float(doc["batch_size"]),
            num_workers=int(doc["num_workers"]), elapsed_s=doc["elapsed_ns"] / 1e9,
            fetch_s=work.get("fetch_ns", 0) / 1e9, prep_s=work.get("prep_ns", 0) / 1e9,
            prep_cpu_s=work.get("prep_cpu_ns", 0) / 1e9,
            fetched_samples=int(work.get("fetch_samples", 0)), prepped_samples=int(work.get("prep_samples", 0)),
            hits=side.get("hits"), misses=side.get("misses"), storage_bytes=side.get("storage_bytes"),
            echo=int(doc.get("echo", 1)),
        )

    @property
    def samples(self) -> float:
        return self.steps * self.batch_size

    @property
    def rate(self) -> float:
        """Samples per second."""
        return self.samples / self.elapsed_s

    @property
    def step_s(self) -> float:
        return self.elapsed_s / self.steps

    @property
    def hit_fraction(self) -> Optional[float]:
        if self.hits is None or self.misses is None or self.hits + self.misses == 0:
            return None
        return self.hits / (self.hits + self.misses)


def loader_stage(g: float, q: float, k: int, cpu: float = 0.0) -> float:
    """``k`` workers share a batch's loader work ``q``; its CPU part ``cpu`` (already divided by the cores) is a
    floor no number of workers goes below."""
    return g + q if k <= 0 else max(g, q / k, cpu)


def cycle_time(g: float, q: float, s: float, f: float, k: int, storage: str = "overlapped", cpu: float = 0.0,
               echo: float = 1.0) -> float:
    """Seconds per batch with a cached fraction ``f`` and ``k`` DataLoader workers (see the module doc);
    ``cpu``: a batch's prep CPU seconds over the machine's cores; ``echo``: the upstream work per step divided by it."""
    q, s, cpu = q / echo, s / echo, cpu / echo
    st = (1.0 - f) * s
    if storage == "overlapped":
        return max(loader_stage(g, q, k, cpu), st)
    if k <= 0:
        return g + q + st
    return max(g, (q + st) / k, st, cpu)


@dataclass
class Analysis:
    batch_size: float
    steps: int
    num_workers: int
    dataset_bytes: int
    num_samples: int
    t1_s: float
    t2_s: float
    t3_s: float
    ingestion_rate: float
    prep_rate: float
    fetch_rate: float
    cold_rate: float
    compute_fraction: float
    prep_stall_fraction: float
    fetch_stall_fraction: float
    step_s: float
    loader_busy_per_batch_s: float
    storage_per_batch_s: float
    storage_bandwidth_Bps: Optional[float]
    storage_model: str = "overlapped"
    cache_curve: List[Dict[str, float]] = field(default_factory=list)
    cpu_curve: List[Dict[str, float]] = field(default_factory=list)
    cheapest: Optional[Dict[str, Any]] = None
    prices: Dict[str, float] = field(default_factory=lambda: dict(PRICES))
    cores: Optional[int] = None  # the machine's cores
    prep_cpu_per_batch_s: float = 0.0  # the CPU part of a batch's prep (measured in the cached run)
    echo: int = 1  # the data echoing factor the job ran with
    echo_curve: List[Dict[str, float]] = field(default_factory=list)

    def cycle(self, cache_fraction: float, workers: Optional[int] = None, echo: Optional[int] = None) -> float:
        """Predicted seconds per step; ``echo``: with that data echoing factor instead of the job's own."""
        k = self.num_workers if workers is None else workers
        cpu = self.prep_cpu_per_batch_s / self.cores if self.cores and k > 0 else 0.0
        e = 1.0 if echo is None else echo / self.echo
        return cycle_time(self.step_s, self.loader_busy_per_batch_s, self.storage_per_batch_s, cache_fraction, k,
                          self.storage_model, cpu, e)

    def predict(self, cache_fraction: float, workers: Optional[int] = None) -> float:
        """Predicted samples per second. Workers overlap their waits without limit, but their CPU time shares the
        machine's cores (DS-Analyzer's CPU model): prep that computes stops scaling at the cores, prep that waits
        (I/O, a remote call) does not."""
        return self.batch_size / self.cycle(cache_fraction, workers)

    def echo_row(self, echo: int) -> Dict[str, float]:
        """The echo what-if at the cold cache: data stall per step and fresh samples per second."""
        c = self.cycle(0.0, echo=echo)
        stall = max(0.0, c - self.step_s)
        return {"echo": echo, "step_s": c, "stall_s": stall, "stall_fraction": stall / c if c > 0 else 0.0,
                "samples_per_s": self.batch_size / c, "fresh_samples_per_s": self.batch_size / (echo * c),
                "fresh_fraction": 1.0 / echo}

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def analyze(runs: Mapping[str, Run], dataset_bytes: int, num_samples: int, storage_Bps: Optional[float] = None,
            prices: Optional[Mapping[str, float]] = None, max_workers: Optional[int] = None,
            cores: Optional[int] = None) -> Analysis:
    """The analysis of the ``synthetic``, ``cached`` and ``cold`` runs (same steps, batch size, workers).
    ``storage_Bps`` is the storage bandwidth measured apart (the cache warm pass); without it ``s`` is
    derived from the cold run alone."""
    missing = [m for m in ("synthetic", "cached", "cold") if m not in runs]
    if missing:
        raise ValueError(f"missing runs: {', '.join(missing)}")
    syn, cached, cold = runs["synthetic"], runs["cached"], runs["cold"]
    for r in (cached, cold):
        if (r.steps, r.batch_size, r.num_workers) != (syn.steps, syn.batch_size, syn.num_workers):
            raise ValueError(f"the {r.mode} run has steps/batch/workers {r.steps}/{r.batch_size}/{r.num_workers}, "
                             f"the synthetic run {syn.steps}/{syn.batch_size}/{syn.num_workers}: the command is not deterministic")
    n, b, w = syn.steps, syn.batch_size, syn.num_workers
    t1, t3, t2 = syn.elapsed_s, cached.elapsed_s, cold.elapsed_s
    samples = n * b
    # Noise can put t3 a little under t1, or t2 under t3: no stall of that kind, not a negative one.
    t3c = max(t3, t1)
    t2c = max(t2, t3c)
    g, c3, c2 = t1 / n, t3c / n, t2c / n
    if w <= 0:
        q = c3 - g  # serial: exactly what the cached run added to each step
    elif c3 > g * (1 + STALL_TOLERANCE):
        q = w * c3  # the workers were the bottleneck of the cached run
    else:  # no prep stall: only the loader's own busy time says how much work a batch is
        # (a tf.data job counts fetches only: its prep runs in tf.data's threads, untimed)
        counted = cached.prepped_samples or cached.fetched_samples
        per_sample = (cached.fetch_s + cached.prep_s) / counted if counted else 0.0
        q = per_sample * b
    batch_bytes = dataset_bytes / num_samples * b if num_samples else 0.0
    if storage_Bps:
        s = batch_bytes / storage_Bps
        model = min(("overlapped", "blocking"), key=lambda m: abs(cycle_time(g, q, s, 0.0, w, m) - c2))
    else:  # no separate measurement: the storage time that explains the cold run with blocking reads
        model = "blocking"
        s = c2 - c3 if w <= 0 else max(0.0, min(c2, w * c2 - q))
    a = Analysis(
        batch_size=b, steps=n, num_workers=w, dataset_bytes=dataset_bytes, num_samples=num_samples,
        t1_s=t1, t2_s=t2, t3_s=t3,
        ingestion_rate=samples / t1, prep_rate=samples / t3c,
        fetch_rate=samples / (t2c - t3c) if t2c > t3c else math.inf, cold_rate=samples / t2c,
        compute_fraction=t1 / t2c, prep_stall_fraction=(t3c - t1) / t2c, fetch_stall_fraction=(t2c - t3c) / t2c,
        step_s=g, loader_busy_per_batch_s=q, storage_per_batch_s=s,
        storage_bandwidth_Bps=storage_Bps if storage_Bps else (batch_bytes / s if s > 0 else None),
        storage_model=model, prices=dict(prices or PRICES), cores=cores,
        prep_cpu_per_batch_s=cached.prep_cpu_s / cached.prepped_samples * b if cached.prepped_samples else 0.0,
    )
    a.cache_curve = [{"cache_fraction": f, "cache_bytes": f * dataset_bytes, "samples_per_s": a.predict(f)}
                     for f in CACHE_GRID]
    kmax = max_workers if max_workers is not None else max(16, 2 * w)
    a.cpu_curve = [{"workers": k, "samples_per_s_cold": a.predict(0.0, k), "samples_per_s_cached": a.predict(1.0, k)}
                   for k in range(0, kmax + 1)]
    a.cheapest = _cheapest(a, kmax)
    a.echo = cold.echo
    a.echo_curve = [a.echo_row(e) for e in sorted({*ECHO_GRID, a.echo})]
    return a


def _cheapest(a: Analysis, kmax: int) -> Dict[str, Any]:
    """The cheapest (cache fraction, workers) whose step is within STALL_TOLERANCE of the trainer's own;
    cost = workers * core price + cached GiB * GiB price per hour."""
    target = a.ingestion_rate / (1 + STALL_TOLERANCE)
    gib = a.dataset_bytes / 2**30
    best: Optional[Tuple[float, float, int]] = None
    for k in range(0, kmax + 1):
        for f in CACHE_GRID:
            if a.predict(f, k) >= target:
                cost = k * a.prices["core_hour"] + f * gib * a.prices["gib_hour"]
                if best is None or cost < best[0] - 1e-12:
                    best = (cost, f, k)
                break  # more cache at this k only costs more
    stalled_now = a.cold_rate < target
    if best is None:
        return {"found": False, "stalled_now": stalled_now,
                "message": f"no configuration up to {kmax} workers and 100% cache reaches the ingestion rate"}
    cost, f, k = best
    return {"found": True, "stalled_now": stalled_now, "cache_fraction": f, "cache_bytes": f * a.dataset_bytes,
            "workers": k, "samples_per_s": a.predict(f, k), "cost_per_hour": cost}


def validate_workers(a: Analysis, workers: int, measured: Run) -> Dict[str, Any]:
    """The what-if's cold-cache throughput with ``workers`` against a rerun of the command with them."""
    row: Dict[str, Any] = {"workers": workers, "predicted": a.predict(0.0, workers), "measured": measured.rate}
    if measured.num_workers != workers:  # a tf.data pipeline keeps its own parallelism
        row.update(error=f"the loader ran with parallelism {measured.num_workers}: only an "
                         f"unstall.torch.DataLoader's num_workers can be set from outside")
    elif (measured.steps, measured.batch_size) != (a.steps, a.batch_size):
        row.update(error=f"the rerun timed {measured.steps} steps of {measured.batch_size:g}, "
                         f"the analysis {a.steps} of {a.batch_size:g}")
    else:
        row.update(error=None, relative_error=(row["predicted"] - measured.rate) / measured.rate)
    return row


def summarize_fractions(a: Analysis) -> Sequence[Tuple[str, float]]:
    return (("compute", a.compute_fraction), ("prep stall", a.prep_stall_fraction),
            ("fetch stall", a.fetch_stall_fraction))
