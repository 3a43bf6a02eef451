"""The ``unstall`` command.

    unstall analyze [--steps N] [--warmup W] [--out DIR] [--storage-bandwidth 50MiB] -- python train.py ...
    unstall token issue --dataset NAME [--dataset NAME ...] [--name WHO] [--home DIR]
    unstall token list [--home DIR]
    unstall token revoke ID [--home DIR]
    unstall profile merge PROFILE.json|DIR ... [--out PREFIX]

Runs the training command (which must iterate an ``unstall.torch.DataLoader``) three times: synthetic
batches, fully cached, cold cache; prints the fetch/prep stall split, the rates and the what-if
predictions; writes ``DIR/analyze.json``, ``DIR/analyze.txt`` and ``DIR/analyze.png``. Exit status 0
when the analysis is complete, 2 when a run failed (nothing but the error is reported then).

``profile merge`` merges the Java agent's per-process I/O profiles of one job (one per rank) and flags what only
the merge can show: ranks reading the same offsets, ranks imbalanced in bytes or stall
(``unstall.profile_merge``). Exit status 2 on bad input.

``token`` is for the owner of a running sidecar (found through ``$UNSTALL_HOME/sidecar.json``): it issues a
tenant token (Flight only, the named datasets only; printed once on stdout, stored only as a hash), lists
them, or revokes one (refused from its next call). Exit status 2 when the sidecar refuses or is not running.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

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
        description="Runs COMMAND (which iterates an unstall.torch.DataLoader) in three modes: synthetic data, "
                    "fully cached, cold cache; reports the fetch/prep stall split and what-if curves.",
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
    pr = sub.add_parser("profile", help="work with the Java agent's I/O profiles")
    prsub = pr.add_subparsers(dest="profile_command", required=True)
    pm = prsub.add_parser("merge", help="merge the profiles of several processes (ranks) of one job",
                          description="Reads unstall agent profiles (files, or directories of them) and reports "
                                      "per rank, the bytes several ranks read at the same offsets, and imbalance.")
    pm.add_argument("profiles", nargs="+", type=Path, metavar="PROFILE", help="PREFIX.json files or directories")
    pm.add_argument("--out", type=Path, default=Path("unstall-profile-merged"),
                    help="writes OUT.json and OUT.txt (default ./unstall-profile-merged)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "analyze":
        return analyze_main(args)
    if args.command == "token":
        return token_main(args)
    if args.command == "profile":
        from . import profile_merge

        return profile_merge.main(args.profiles, args.out)
    return 2  # pragma: no cover


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


def analyze_main(args: argparse.Namespace) -> int:
    from .analyze import model, report
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
    for name in ("analyze.json", "analyze.txt", "analyze.png"):
        (out / name).unlink(missing_ok=True)  # never leave an older run's results next to this one's
    opts = RunOptions(steps=args.steps, warmup=args.warmup, out_dir=out, storage_bandwidth=args.storage_bandwidth,
                      max_cache=args.max_cache or default_max_cache(), jar=args.jar, sidecar_args=args.sidecar_arg,
                      timeout_s=args.timeout, verbose=args.verbose)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    docs: Dict[str, Dict[str, Any]] = {}
    try:
        for mode in ("synthetic", "cached", "cold"):
            docs[mode] = run_mode(cmd, mode, opts)
        datasets = {(d["dataset"].get("name"), d["dataset"].get("num_samples")) for d in docs.values()}
        if len(datasets) != 1:
            raise AnalyzeFailure(f"the runs analysed different datasets: {sorted(map(str, datasets))}; "
                                 "the first DataLoader the command iterates must be the same every time")
        runs = {m: model.Run.from_report(d) for m, d in docs.items()}
        ds = docs["cold"]["dataset"]
        prices = dict(model.PRICES)
        if args.core_price is not None:
            prices["core_hour"] = args.core_price
        if args.gib_price is not None:
            prices["gib_hour"] = args.gib_price
        storage_Bps = (docs["cached"].get("warm") or {}).get("storage_Bps")
        analysis = model.analyze(runs, int(ds.get("total_bytes", 0)), int(ds.get("num_samples", 0)), storage_Bps,
                                 prices, args.max_workers)
    except (AnalyzeFailure, ValueError) as e:
        report.write_json(out / "analyze.json", {
            "format": report.REPORT_FORMAT, "status": "failed", "error": str(e), "command": cmd,
            "started": started, "completed_runs": sorted(docs)})
        print(f"unstall analyze: {e}", file=sys.stderr)
        print(f"unstall analyze: no analysis was produced ({out / 'analyze.json'} records the failure)", file=sys.stderr)
        return 2
    summary = report.text(cmd, analysis, runs, ds)
    doc = {"format": report.REPORT_FORMAT, "status": "ok", "command": cmd, "started": started,
           "storage_bandwidth": args.storage_bandwidth, "dataset": ds,
           "runs": {m: {k: v for k, v in d.items() if k not in ("wait_ns", "step_ns")} for m, d in docs.items()},
           "analysis": analysis.as_dict()}
    report.write_json(out / "analyze.json", doc)
    (out / "analyze.txt").write_text(summary)
    png = report.write_png(out / "analyze.png", analysis, f"unstall analyze: {ds.get('name')} "
                                                           f"(batch {analysis.batch_size:g}, {analysis.num_workers} workers)")
    print(summary, end="")
    print(f"\n  wrote {out / 'analyze.json'}, {out / 'analyze.txt'}"
          + (f", {out / 'analyze.png'}" if png else " (no picture: pip install 'unstall[analyze]' for matplotlib)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
