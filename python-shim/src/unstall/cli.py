"""The ``unstall`` command.

    unstall analyze [--steps N] [--warmup W] [--out DIR] [--storage-bandwidth 50MiB] -- python train.py ...
    unstall token issue --dataset NAME [--dataset NAME ...] [--name WHO] [--home DIR]
    unstall token list [--home DIR]
    unstall token revoke ID [--home DIR]
    unstall sidecar start [--home DIR] [--port N] [--cache-capacity SIZE] [--memory-budget SIZE] [--sidecar-arg ARG ...]
    unstall sidecar status [--home DIR] [--json]
    unstall sidecar stop [--home DIR] [--timeout S]
    unstall profile merge PROFILE.json|DIR ... [--out PREFIX]

Runs the training command (which must iterate an ``unstall.torch.DataLoader`` or a ``tf.data.Dataset``
over ``unstall.tf.dataset``) three times: synthetic batches, fully cached, cold cache; prints, for each
loader, the fetch/prep stall split, the rates and the what-if predictions (``--validate-workers 1,2``:
checked against reruns with those worker counts); writes ``DIR/analyze.json``, ``DIR/analyze.txt``,
``DIR/analyze.html`` and ``DIR/analyze.png`` (``analyze-N.png`` for loader N > 0). Exit status 0 when at
least one loader is analysed, 2 when a run failed (nothing but the error is reported then).

``profile merge`` merges the Java agent's per-process I/O profiles of one job (one per rank) and flags what only
the merge can show: ranks reading the same offsets, ranks imbalanced in bytes or stall
(``unstall.profile_merge``). Exit status 2 on bad input.

``token`` is for the owner of a running sidecar (found through ``$UNSTALL_HOME/sidecar.json``): it issues a
tenant token (Flight only, the named datasets only; printed once on stdout, stored only as a hash), lists
them, or revokes one (refused from its next call). Exit status 2 when the sidecar refuses or is not running.

``sidecar`` manages the per-host sidecar of a home (the one ``unstall.Sidecar()`` attaches to through
``$UNSTALL_HOME/sidecar.json``) from the shell: ``start`` launches it detached (it outlives the command) or
reports the one already there, ``status`` prints its pid, addresses, health and datasets (exit 1 when none
runs or it does not answer), ``stop`` sends it SIGTERM and waits until it is gone (exit 1 when none ran).
Exit status 2 when a start or stop fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = ["main", "parse_size"]

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}


def parse_size(text: str) -> int:
    """``4GiB``, ``512MiB``, ``100MB``, ``12345`` -> bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4GiB, 512MiB, 100MB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="unstall", description="unstall: tools for data-stalled training jobs")
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser(
        "analyze", help="measure a training command's fetch and prep stalls and predict what removes them",
        description="Runs COMMAND (which iterates unstall.torch.DataLoaders or tf.data.Datasets over "
                    "unstall.tf.dataset) in three modes: synthetic data, fully cached, cold cache; reports, for each "
                    "loader, the fetch/prep stall split and what-if curves.",
        usage="unstall analyze [options] -- COMMAND [ARGS...]")
    a.add_argument("--steps", type=_positive, default=50, help="timed steps per run (default 50)")
    a.add_argument("--warmup", type=_positive, default=2, help="untimed steps before them (default 2)")
    a.add_argument("--out", type=Path, default=Path("unstall-analyze"), help="output directory (default ./unstall-analyze)")
    a.add_argument("--storage-bandwidth", metavar="SIZE", default=None,
                   help="throttle the sidecar's storage reads to SIZE/s in every run (simulates remote storage)")
    a.add_argument("--max-cache", metavar="SIZE", type=parse_size, default=None,
                   help="cache of the 'cached' run (default half of physical memory); the dataset must fit")
    a.add_argument("--sidecar-arg", action="append", default=[], metavar="ARG", help="extra sidecar option (repeatable)")
    a.add_argument("--jar", default=None, help="sidecar jar (default: found as unstall.Sidecar finds it)")
    a.add_argument("--timeout", type=float, default=1800.0, help="seconds per run before it is stopped (default 1800)")
    a.add_argument("--core-price", type=float, default=None, help="USD per core-hour for the cheapest configuration")
    a.add_argument("--gib-price", type=float, default=None, help="USD per GiB-hour of cache")
    a.add_argument("--max-workers", type=int, default=None, help="largest worker count the what-if considers")
    a.add_argument("--validate-workers", type=_worker_counts, default=None, metavar="K,K,...",
                   help="rerun the command (cold cache) with each of these DataLoader worker counts and report the "
                        "what-if's prediction against the measured throughput")
    a.add_argument("-v", "--verbose", action="store_true", help="print each run's output")
    a.add_argument("cmd", nargs=argparse.REMAINDER, metavar="COMMAND")
    t = sub.add_parser("token", help="issue, list or revoke tenant tokens of the running sidecar (owner only)",
                       description="Tenant tokens let other users read the named datasets over Flight, and nothing "
                                   "else. The sidecar stores only their hashes.")
    tsub = t.add_subparsers(dest="token_command", required=True)
    home_help = "the sidecar's home (default $UNSTALL_HOME or ~/.unstall)"
    ti = tsub.add_parser("issue", help="issue a token; prints it (shown only this once)")
    ti.add_argument("--dataset", action="append", required=True, metavar="NAME", help="a dataset to grant (repeatable)")
    ti.add_argument("--name", default="", help="who the token is for (shown by list)")
    ti.add_argument("--home", type=Path, default=None, help=home_help)
    tl = tsub.add_parser("list", help="the tokens issued and not revoked")
    tl.add_argument("--home", type=Path, default=None, help=home_help)
    tr = tsub.add_parser("revoke", help="revoke a token by its id")
    tr.add_argument("id", metavar="ID")
    tr.add_argument("--home", type=Path, default=None, help=home_help)
    _sidecar_parser(sub, home_help)
    pr = sub.add_parser("profile", help="work with the Java agent's I/O profiles")
    prsub = pr.add_subparsers(dest="profile_command", required=True)
    pm = prsub.add_parser("merge", help="merge the profiles of several processes (ranks) of one job",
                          description="Reads unstall agent profiles (files, or directories of them) and reports "
                                      "per rank, the bytes several ranks read at the same offsets, and imbalance.")
    pm.add_argument("profiles", nargs="+", type=Path, metavar="PROFILE", help="PREFIX.json files or directories")
    pm.add_argument("--out", type=Path, default=Path("unstall-profile-merged"),
                    help="writes OUT.json and OUT.txt (default ./unstall-profile-merged)")
    return p


def _sidecar_parser(sub: Any, home_help: str) -> None:
    s = sub.add_parser("sidecar", help="start, stop or inspect this host's shared sidecar",
                       description="The per-host sidecar of a home, which unstall.Sidecar() and every DataLoader "
                                   "on this host attach to.")
    ssub = s.add_subparsers(dest="sidecar_command", required=True)
    start = ssub.add_parser("start", help="start it detached (or report the one running)",
                            description="Starts the sidecar in the background; it runs until 'unstall sidecar stop'. "
                                        "Its log is HOME/sidecar.log.")
    start.add_argument("--home", type=Path, default=None, help=home_help)
    start.add_argument("--port", type=int, default=None,
                       help="Flight port (default the sidecar's: 8815 or $UNSTALL_FLIGHT_PORT; 0 picks a free one)")
    start.add_argument("--cache-capacity", metavar="SIZE", default=None, help="memory cache (default 1GiB)")
    start.add_argument("--memory-budget", metavar="SIZE", default=None, help="all off-heap memory (default 2GiB)")
    start.add_argument("--sidecar-arg", action="append", default=[], metavar="ARG",
                       help="any other sidecar option, e.g. --sidecar-arg=--disk-cache-dir=/scratch (repeatable)")
    start.add_argument("--java", default=None, help="java 17+ to run it (default: UNSTALL_JAVA, JAVA_HOME, PATH, "
                                                    "then the jre extra)")
    start.add_argument("--java-option", action="append", default=[], metavar="OPT", help="a JVM option (repeatable)")
    start.add_argument("--jar", default=None,
                       help="sidecar jar (default: UNSTALL_SIDECAR_JAR, else the one in the package)")
    start.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for it to listen (default 60)")
    status = ssub.add_parser("status", help="pid, addresses, health and datasets of the running one")
    status.add_argument("--home", type=Path, default=None, help=home_help)
    status.add_argument("--json", action="store_true", help="print one JSON object")
    stop = ssub.add_parser("stop", help="stop it gracefully (SIGTERM, then wait until it is gone)")
    stop.add_argument("--home", type=Path, default=None, help=home_help)
    stop.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for it to exit (default 30)")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "analyze":
        return analyze_main(args)
    if args.command == "token":
        return token_main(args)
    if args.command == "sidecar":
        return sidecar_main(args)
    if args.command == "profile":
        from . import profile_merge

        return profile_merge.main(args.profiles, args.out)
    return 2  # pragma: no cover


def sidecar_main(args: argparse.Namespace) -> int:
    from .errors import SidecarError
    from .sidecar import Sidecar, read_state, stop_sidecar, unstall_home, STATE_FILE_NAME

    # These commands manage the home's own sidecar, never one that UNSTALL_SIDECAR names elsewhere.
    os.environ.pop("UNSTALL_SIDECAR", None)
    home: Path = args.home.expanduser() if args.home is not None else unstall_home()
    cmd = args.sidecar_command
    try:
        if cmd == "stop":
            stopped = stop_sidecar(home, args.timeout)
            if stopped is None:
                print(f"unstall sidecar: none is running for {home}", file=sys.stderr)
                return 1
            print(f"unstall sidecar: stopped pid {stopped.pid} ({stopped.flight})", file=sys.stderr)
            return 0
        if cmd == "start":
            with Sidecar(home=home, port=args.port, detach=True, cache_capacity=args.cache_capacity,
                         memory_budget=args.memory_budget, extra_args=args.sidecar_arg, java=args.java,
                         java_options=args.java_option, jar=args.jar, startup_timeout=args.timeout) as sidecar:
                how = f"started on {sidecar.java}" if sidecar.detached else "already running; options not applied"
                print(f"unstall sidecar: pid {sidecar.pid} {how}")
                print(f"  flight        {sidecar.flight_location}")
                print(f"  local         {sidecar.local_endpoint or '-'}")
                print(f"  token file    {_token_file(home)}")
                print(f"  log           {home / 'sidecar.log'}")
            return 0
        state = read_state(home / STATE_FILE_NAME)
        if state is None or not state.alive:
            print(f"unstall sidecar: none is running for {home} (no live {home / STATE_FILE_NAME})", file=sys.stderr)
            return 1
        doc: Dict[str, Any] = {"home": str(home), "pid": state.pid, "flight": state.flight,
                               "control_port": state.control_port, "local": state.local,
                               "token_file": state.token_file, "log": str(home / "sidecar.log")}
        with contextlib.suppress(OSError):  # the java it runs on (Linux; another user's process: unknown)
            doc["java"] = os.readlink(f"/proc/{state.pid}/exe")
        try:
            with Sidecar(home=home, start=False) as sidecar:
                doc["healthy"] = sidecar.problem() is None
                doc["datasets"] = [{"name": d.name, "format": d.format, "uri": d.uri, "samples": d.num_samples,
                                    "bytes": d.total_bytes} for d in sidecar.list_datasets()]
        except SidecarError as e:
            doc["healthy"], doc["problem"] = False, str(e)
        if args.json:
            print(json.dumps(doc))
        else:
            print(f"unstall sidecar: pid {state.pid}, {'healthy' if doc['healthy'] else 'NOT answering'}")
            for key in ("flight", "control_port", "local", "token_file", "log", "java", "problem"):
                if doc.get(key) is not None:
                    print(f"  {key.replace('_', ' '):<14}{doc[key]}")
            for d in doc.get("datasets", []):
                print(f"  dataset       {d['name']} ({d['format']}, {d['samples']} samples, {d['bytes']} bytes) "
                      f"{d['uri']}")
        return 0 if doc["healthy"] else 1
    except (SidecarError, OSError) as e:
        print(f"unstall sidecar {cmd}: {e}", file=sys.stderr)
        return 2


def _token_file(home: Path) -> str:
    from .sidecar_state import STATE_FILE_NAME, read_state

    state = read_state(home / STATE_FILE_NAME)
    return state.token_file if state is not None else str(home / "token")


def token_main(args: argparse.Namespace) -> int:
    from .errors import SidecarError
    from .sidecar import Sidecar

    try:
        with Sidecar(home=args.home, start=False) as sidecar:
            if args.token_command == "issue":
                issued = sidecar.issue_token(args.dataset, args.name)
                print(issued.token)
                print(f"unstall token: issued {issued.id} for datasets {', '.join(issued.datasets)}; give it with the "
                      f"address {sidecar.flight_location} (UNSTALL_SIDECAR, UNSTALL_TOKEN): it cannot be shown again",
                      file=sys.stderr)
            elif args.token_command == "revoke":
                sidecar.revoke_token(args.id)
                print(f"unstall token: revoked {args.id}", file=sys.stderr)
            else:
                rows = [("ID", "NAME", "DATASETS", "CREATED")]
                rows += [(t.id, t.name or "-", ",".join(t.datasets), t.created) for t in sidecar.list_tokens()]
                widths = [max(len(r[i]) for r in rows) for i in range(3)]
                for r in rows:
                    print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[3])
    except SidecarError as e:
        print(f"unstall token: {e}", file=sys.stderr)
        return 2
    return 0


def _worker_counts(text: str) -> List[int]:
    try:
        ks = [int(k) for k in text.split(",") if k.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of worker counts: {text!r} (e.g. 1,2,4)") from None
    if not ks or min(ks) < 0:
        raise argparse.ArgumentTypeError(f"worker counts must be >= 0, got {text!r}")
    return sorted(set(ks))


def analyze_main(args: argparse.Namespace) -> int:
    from .analyze import ENV_SECTIONS, ENV_WORKERS, model, report
    from .analyze.runner import AnalyzeFailure, RunOptions, default_max_cache, run_mode

    cmd: List[str] = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("unstall analyze: no command given; usage: unstall analyze [options] -- python train.py ...", file=sys.stderr)
        return 2
    if cmd[0].endswith(".py"):
        cmd = [sys.executable, *cmd]
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("analyze*.png"), out / "analyze.json", out / "analyze.txt", out / "analyze.html"]:
        old.unlink(missing_ok=True)  # never leave an older run's results next to this one's
    opts = RunOptions(steps=args.steps, warmup=args.warmup, out_dir=out, storage_bandwidth=args.storage_bandwidth,
                      max_cache=args.max_cache or default_max_cache(), jar=args.jar, sidecar_args=args.sidecar_arg,
                      timeout_s=args.timeout, verbose=args.verbose)
    prices = dict(model.PRICES)
    if args.core_price is not None:
        prices["core_hour"] = args.core_price
    if args.gib_price is not None:
        prices["gib_hour"] = args.gib_price
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    docs: Dict[str, Dict[str, Any]] = {}

    def failed(error: str) -> int:
        report.write_json(out / "analyze.json", {
            "format": report.REPORT_FORMAT, "status": "failed", "error": error, "command": cmd,
            "started": started, "completed_runs": sorted(docs)})
        print(f"unstall analyze: {error}", file=sys.stderr)
        print(f"unstall analyze: no analysis was produced ({out / 'analyze.json'} records the failure)", file=sys.stderr)
        return 2

    try:
        for mode in ("synthetic", "cached", "cold"):
            docs[mode] = run_mode(cmd, mode, opts)
            opts.env[ENV_SECTIONS] = str(len(docs["synthetic"]["sections"]))  # later runs end after as many loaders
        for k in args.validate_workers or ():
            docs[f"cold-w{k}"] = run_mode(cmd, "cold", replace(opts, env={**opts.env, ENV_WORKERS: str(k)}),
                                          label=f"cold-w{k}")
    except AnalyzeFailure as e:
        return failed(str(e))
    sections = [_section(i, docs, prices, args.max_workers) for i in range(len(docs["synthetic"]["sections"]))]
    results = [r for r, _ in sections]
    if not any(r["status"] == "ok" for r in results):
        return failed("; ".join(f"loader {r['index']}: {r['error']}" for r in results))
    title = f"unstall analyze: {shlex.join(cmd)}"
    summary = f"{title}\n\n" + "\n".join(
        sec.text if sec.analysis is not None else f"{sec.heading}\n  not analysed: {sec.error}\n" for _, sec in sections)
    report.write_json(out / "analyze.json", {
        "format": report.REPORT_FORMAT, "status": "ok", "command": cmd, "started": started,
        "storage_bandwidth": args.storage_bandwidth, "sections": results})
    (out / "analyze.txt").write_text(summary)
    pngs = [out / ("analyze.png" if i == 0 else f"analyze-{i}.png") for i in range(len(sections))]
    drawn = [p for p, (_, sec) in zip(pngs, sections)
             if sec.analysis is not None and report.write_png(p, sec.analysis, sec.heading, sec.validation)]
    report.write_html(out / "analyze.html", title, [sec for _, sec in sections])
    print(summary, end="")
    print(f"\n  wrote {out / 'analyze.json'}, {out / 'analyze.txt'}, {out / 'analyze.html'}"
          + (", " + ", ".join(map(str, drawn)) if drawn else " (no pictures: pip install 'unstall[analyze]' for matplotlib)"))
    return 0


def _section(i: int, docs: Mapping[str, Mapping[str, Any]], prices: Mapping[str, float],
             max_workers: Optional[int]) -> Tuple[Dict[str, Any], Any]:
    """Loader ``i``'s part of the report: its analysis from the three runs, and its worker-count what-if
    against the validation runs (``cold-wK``); or why it has none."""
    from .analyze import model, report

    first = docs["synthetic"]["sections"][i]
    kind, ds = first.get("kind", "loader"), first.get("dataset") or {}
    heading = f"loader {i}: {kind} over dataset {ds.get('name')!r}"
    result: Dict[str, Any] = {"index": i, "kind": kind, "dataset": ds}
    secs: Dict[str, Dict[str, Any]] = {}
    errors: Dict[str, str] = {}
    for label, doc in docs.items():
        found = [s for s in doc["sections"] if s["index"] == i]
        if not found:
            errors[label] = f"the {label} run iterated only {len(doc['sections'])} loaders"
        elif found[0]["status"] != "ok":
            errors[label] = f"{label} run: {found[0].get('error')}"
        elif (found[0].get("dataset") or {}).get("name") != ds.get("name"):
            errors[label] = (f"the {label} run's loader {i} reads dataset {found[0]['dataset'].get('name')!r}, not "
                             f"{ds.get('name')!r}: the command must iterate its loaders in the same order every time")
        else:
            secs[label] = found[0]
    modes = ("synthetic", "cached", "cold")
    try:
        if any(m in errors for m in modes):
            raise ValueError("; ".join(errors[m] for m in modes if m in errors))
        runs = {m: model.Run.from_report(secs[m]) for m in modes}
        storage_Bps = (secs["cached"].get("warm") or {}).get("storage_Bps")
        a = model.analyze(runs, int(ds.get("total_bytes", 0)), int(ds.get("num_samples", 0)), storage_Bps,
                          prices, max_workers, docs["cold"].get("cpu_count"))
    except ValueError as e:
        result.update(status="error", error=str(e))
        return result, report.Section(heading, error=str(e))
    validation = []
    for label in docs:
        if label.startswith("cold-w"):
            k = int(label[len("cold-w"):])
            validation.append(model.validate_workers(a, k, model.Run.from_report(secs[label])) if label in secs
                              else {"workers": k, "predicted": a.predict(0.0, k), "measured": None,
                                    "error": errors[label]})
    text = report.text(heading, a, runs, ds, docs["cold"]) + report.validation_text(validation)
    result.update(status="ok", runs={m: {k: v for k, v in d.items() if k not in ("wait_ns", "step_ns")}
                                     for m, d in secs.items()},
                  analysis=a.as_dict(), validation=validation)
    return result, report.Section(heading, a, runs, text, validation)


if __name__ == "__main__":
    sys.exit(main())
