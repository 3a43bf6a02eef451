"""The analyzer's side: runs the training command once per mode, each time against a fresh sidecar it
starts and hands to the command through ``UNSTALL_SIDECAR``/``UNSTALL_TOKEN``/``UNSTALL_CONTROL_PORT``
(which ``Sidecar()`` and ``default_sidecar()`` attach to before anything else), and collects the
report the shim writes. Every way a run can go wrong becomes an :class:`AnalyzeFailure` whose message
says what happened; no result is made up from a run that did not finish."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from . import ENV_MODE, ENV_REPORT, ENV_STEPS, ENV_WARM, ENV_WARMUP
from .. import progress
from ..errors import SidecarError
from ..sidecar import Sidecar

__all__ = ["AnalyzeFailure", "RunOptions", "run_mode", "default_max_cache"]


class AnalyzeFailure(Exception):
    """A run that produced no result; the message is for the user."""


def default_max_cache() -> int:
    """Half of physical memory: the largest dataset the ``cached`` run may hold."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):
        return 8 << 30


@dataclass
class RunOptions:
    steps: int = 50
    warmup: int = 2
    out_dir: Path = Path("unstall-analyze")
    storage_bandwidth: Optional[str] = None
    max_cache: int = field(default_factory=default_max_cache)
    jar: Optional[str] = None
    java: Optional[str] = None
    sidecar_args: Sequence[str] = ()
    timeout_s: float = 1800.0
    verbose: bool = False
    env: Dict[str, str] = field(default_factory=dict)


def _tail(path: Path, n: int = 20) -> str:
    try:
        with open(path, "rb") as f:
            lines = deque(f.read().decode("utf-8", errors="replace").splitlines(), maxlen=n)
    except OSError:
        return "(no output)"
    return "\n".join("    " + ln for ln in lines) or "    (no output)"


def run_mode(cmd: Sequence[str], mode: str, opts: RunOptions, *, cache_capacity: Optional[int] = None,
             warm: bool = False, label: Optional[str] = None) -> Dict[str, Any]:
    """Runs ``cmd`` once in ``mode`` and returns the shim's ``ok`` report (plus ``exit_status`` and ``log``):
    one section per loader the command iterated, at least one of them analysed."""
    label = label or mode
    out = Path(opts.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = out / f"run-{label}.json"
    log_path = out / f"run-{label}.log"
    progress_path = report.with_name(report.name + ".progress")
    for p in (report, progress_path):
        p.unlink(missing_ok=True)
    if cache_capacity is None:
        cache_capacity = opts.max_cache if mode == "cached" else 0
    extra = list(opts.sidecar_args)
    if opts.storage_bandwidth:
        extra += ["--storage-bandwidth", str(opts.storage_bandwidth)]
    home = Path(tempfile.mkdtemp(prefix=f"unstall-analyze-{label}-"))
    try:
        budget = (int(cache_capacity) + (1 << 30)) * 8 // 7  # the prefetch window defaults to 1/8 of it
        try:
            sidecar = Sidecar(home=home, start=True, cache_capacity=int(cache_capacity), memory_budget=budget,
                              jar=opts.jar, java=opts.java, extra_args=extra,
                              java_options=[f"-XX:MaxDirectMemorySize={budget // 2**20 + 256}m"])
        except SidecarError as e:
            raise AnalyzeFailure(f"cannot start a sidecar for the {label} run: {e}") from None
        with sidecar:
            env = dict(os.environ)
            env.update(opts.env)
            env.update({
                "UNSTALL_SIDECAR": sidecar.flight_location, "UNSTALL_TOKEN": sidecar.token,
                "UNSTALL_CONTROL_PORT": str(sidecar.control_port), "UNSTALL_HOME": str(home),
                ENV_MODE: mode, ENV_STEPS: str(opts.steps), ENV_WARMUP: str(opts.warmup),
                ENV_REPORT: str(report.resolve()), ENV_WARM: "1" if warm else "0",
                "UNSTALL_PROGRESS": "0", "UNSTALL_EPOCH_LOG": "0",
            })
            code, elapsed = _run_child(cmd, env, log_path, progress_path, opts, label)
            seen = {d.name for d in sidecar.list_datasets()}
    finally:
        shutil.rmtree(home, ignore_errors=True)
        progress_path.unlink(missing_ok=True)
    doc: Optional[Dict[str, Any]] = None
    if report.is_file():
        try:
            doc = json.loads(report.read_text())
        except ValueError:
            doc = None
    if doc is not None and doc.get("status") == "error":
        raise AnalyzeFailure(f"the {label} run stopped: {doc.get('error')}")
    sections = (doc or {}).get("sections") or []
    if doc is not None and any(s.get("status") == "ok" for s in sections):
        doc["exit_status"], doc["log"], doc["wall_s"] = code, str(log_path), elapsed
        return doc
    if code is None:
        raise AnalyzeFailure(f"the {label} run did not finish within {opts.timeout_s:.0f} s and was stopped; "
                             f"its output is in {log_path}:\n{_tail(log_path)}")
    if code != 0:
        raise AnalyzeFailure(
            f"the command failed with exit status {code} in the {label} run, before {opts.warmup} + {opts.steps} "
            f"steps of a loader were timed; last lines of its output ({log_path}):\n{_tail(log_path)}")
    if sections:
        raise AnalyzeFailure(f"the {label} run stopped: " + "; ".join(str(s.get("error")) for s in sections))
    what = ("it registered " + ", ".join(sorted(seen)) + " but never iterated an unstall.torch.DataLoader or a "
            "tf.data.Dataset over unstall.tf.dataset" if seen
            else "it never used the unstall shim (no dataset was registered with the sidecar)")
    raise AnalyzeFailure(
        f"the command exited with status 0 in the {label} run without reaching a timed step: {what}. "
        "unstall analyze needs the training loop to iterate an unstall.torch.DataLoader or an unstall.tf.dataset "
        "(see docs/ANALYZE.md); its output is in " + str(log_path))


def _run_child(cmd: Sequence[str], env: Dict[str, str], log_path: Path, progress_path: Path,
               opts: RunOptions, label: str) -> tuple[Optional[int], float]:
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(list(cmd), env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            raise AnalyzeFailure(f"cannot run {cmd[0]!r}: {e.strerror}") from None
        total = opts.warmup + opts.steps
        with progress.bar(total=total, desc=f"analyze: {label:>9}", unit="step") as bar:
            phase = "starting"
            while True:
                try:
                    code: Optional[int] = proc.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if time.monotonic() - t0 > opts.timeout_s:
                    _kill(proc)
                    code = None
                    break
                try:
                    p, done, tot = progress_path.read_text().split()
                except (OSError, ValueError):
                    continue
                if p != phase:
                    phase = p
                    bar.set_postfix_str("warming the cache" if p == "warm" else "")
                if p == "warm":
                    bar.set_description_str(f"analyze: {label:>9} (warm {int(done)}/{int(tot)})")
                elif bar.n < int(done):
                    bar.set_description_str(f"analyze: {label:>9}")
                    bar.update(int(done) - bar.n)
    if opts.verbose:
        print(log_path.read_text(errors="replace"))
    return code, time.monotonic() - t0


def _kill(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue
