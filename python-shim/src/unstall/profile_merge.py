"""``unstall profile merge``: the agent's per-process I/O profiles of one job, merged with a rank dimension.

Each JVM with the agent writes its own ``unstall.io-profile/1`` JSON (``profile=PREFIX``), with its ``RANK``,
``LOCAL_RANK`` and ``WORLD_SIZE`` when the launcher set them and the distinct byte ranges it read per file. This
module reads several of them and answers the questions one process cannot:

* ``same_offsets_across_ranks``: ranks read the same bytes of the same files (every rank reading the whole
  dataset instead of its shard), with the exact bytes read by every reader, by two or more, and the redundant
  bytes (read again by another rank);
* ``rank_imbalance_bytes`` / ``rank_imbalance_stall``: one rank reads, or waits for data, much more than another.

Merging is done after the run, from files, rather than by the agents writing into a shared directory: the
processes need no coordination (no locks, no clock agreement), profiles copied from different hosts merge the
same way, and a rank that crashed still contributes what it wrote.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = ["PROFILE_FORMAT", "MERGED_FORMAT", "RankProfile", "FileOverlap", "MergedProfile", "load", "merge",
           "overlap", "text", "main"]

PROFILE_FORMAT = "unstall.io-profile/1"
MERGED_FORMAT = "unstall.io-profile-merged/1"

#: Same-offset reads are flagged when bytes read by two or more ranks are at least this share of the union.
OVERLAP_FRACTION = 0.10
#: Ranks are imbalanced when the largest is at least this multiple of the smallest ...
IMBALANCE_RATIO = 1.5
#: ... and the difference is at least this many bytes (bytes) or this share of the run (stall).
IMBALANCE_MIN_BYTES = 1 << 20
IMBALANCE_MIN_STALL_FRACTION = 0.05

Ranges = List[Tuple[int, int]]


@dataclass
class RankProfile:
    """One process's profile, as far as the merge needs it."""

    source: Path
    label: str  # "0", "1", ... (RANK) or "pid-1234" when the launcher set no RANK
    rank: Optional[int]
    local_rank: Optional[int]
    host: Optional[str]
    pid: int
    elapsed_s: float
    bytes: int
    read_calls: int
    stall_ns: int
    stall_count: int
    checkpoint_ns: int
    bytes_written: int
    files: Dict[str, Tuple[int, Ranges, bool]]  # path -> (bytes read, distinct ranges, ranges incomplete)


@dataclass
class FileOverlap:
    path: str
    bytes_by_rank: Dict[str, int]
    union_bytes: int  # distinct bytes read by any rank
    common_bytes: int  # bytes read by every rank that read the file
    overlap_bytes: int  # distinct bytes read by two or more ranks
    redundant_bytes: int  # sum of each rank's distinct bytes minus the union: reads another rank already did
    lower_bound: bool  # some rank's ranges were truncated: the numbers are lower bounds

    def as_dict(self) -> Dict[str, Any]:
        return {"path": self.path, "ranks": len(self.bytes_by_rank), "bytes_by_rank": self.bytes_by_rank,
                "union_bytes": self.union_bytes, "common_bytes": self.common_bytes,
                "overlap_bytes": self.overlap_bytes, "redundant_bytes": self.redundant_bytes,
                "lower_bound": self.lower_bound}


@dataclass
class MergedProfile:
    ranks: List[RankProfile]
    files: List[FileOverlap]
    suggestions: List[Dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> Dict[str, Any]:
        return {
            "format": MERGED_FORMAT,
            "ranks": [{"rank": r.label, "pid": r.pid, "host": r.host, "local_rank": r.local_rank,
                       "source": str(r.source), "elapsed_s": r.elapsed_s, "bytes": r.bytes,
                       "read_calls": r.read_calls, "stall_ns": r.stall_ns, "stall_count": r.stall_count,
                       "bytes_written": r.bytes_written, "checkpoint_ns": r.checkpoint_ns} for r in self.ranks],
            "totals": {"ranks": len(self.ranks), "files": len(self.files),
                       "bytes": sum(r.bytes for r in self.ranks),
                       "union_bytes": sum(f.union_bytes for f in self.files),
                       "overlap_bytes": sum(f.overlap_bytes for f in self.files),
                       "redundant_bytes": sum(f.redundant_bytes for f in self.files)},
            "files": [f.as_dict() for f in self.files],
            "suggestions": self.suggestions,
        }


def _opt_int(v: Any) -> Optional[int]:
    return None if v is None else int(v)


def load(path: Path) -> RankProfile:
    """Reads one agent profile; ValueError names the file and what is wrong with it."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read profile {path}: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != PROFILE_FORMAT:
        raise ValueError(f"{path} is not an unstall agent profile (format {PROFILE_FORMAT!r} expected, "
                         f"got {doc.get('format') if isinstance(doc, dict) else type(doc).__name__!r})")
    try:
        files: Dict[str, Tuple[int, Ranges, bool]] = {}
        for f in doc["files"]:
            ranges = [(int(s), int(e)) for s, e in f.get("read_ranges", [])]
            files[f["path"]] = (int(f["bytes"]), ranges, bool(f.get("read_ranges_truncated", False)))
        rank = _opt_int(doc.get("rank"))
        stalls = doc["stalls"]
        checkpoints = doc.get("checkpoints") or {}
        return RankProfile(
            source=Path(path), label=str(rank) if rank is not None else f"pid-{doc['pid']}", rank=rank,
            local_rank=_opt_int(doc.get("local_rank")), host=doc.get("host"), pid=int(doc["pid"]),
            elapsed_s=float(doc["elapsed_s"]), bytes=int(doc["totals"]["bytes"]),
            read_calls=int(doc["totals"]["read_calls"]), stall_ns=int(stalls["total_ns"]),
            stall_count=int(stalls["count"]), checkpoint_ns=int(checkpoints.get("total_ns", 0)),
            bytes_written=int((doc["totals"].get("writes") or {}).get("bytes", 0)), files=files)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"profile {path} lacks or has a bad field: {e!r}") from None


def overlap(per_rank: Sequence[Ranges]) -> Tuple[int, int, int]:
    """(union, read by every one of them, read by two or more) bytes of several ranks' sorted disjoint ranges."""
    events: List[Tuple[int, int]] = []
    for ranges in per_rank:
        for s, e in ranges:
            if e > s:
                events.append((s, 1))
                events.append((e, -1))
    events.sort()
    union = common = multi = 0
    depth = 0
    prev = 0
    for pos, delta in events:
        width = pos - prev
        if width > 0 and depth > 0:
            union += width
            if depth >= 2:
                multi += width
            if depth == len(per_rank):
                common += width
        depth += delta
        prev = pos
    return union, common, multi


def merge(profiles: Sequence[RankProfile]) -> MergedProfile:
    if not profiles:
        raise ValueError("no profiles to merge")
    seen: Dict[str, Path] = {}
    for p in profiles:
        if p.label in seen:
            raise ValueError(f"rank {p.label} appears twice: {seen[p.label]} and {p.source} "
                             "(one profile per process; set RANK for each)")
        seen[p.label] = p.source
    ranks = sorted(profiles, key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, r.label))
    paths = sorted({path for r in ranks for path in r.files})
    files: List[FileOverlap] = []
    for path in paths:
        readers = [r for r in ranks if path in r.files and r.files[path][0] > 0]
        if not readers:
            continue
        per_rank = [r.files[path][1] for r in readers]
        union, common, multi = overlap(per_rank)
        distinct = sum(e - s for ranges in per_rank for s, e in ranges)
        files.append(FileOverlap(
            path=path, bytes_by_rank={r.label: r.files[path][0] for r in readers}, union_bytes=union,
            common_bytes=common if len(readers) >= 2 else 0, overlap_bytes=multi, redundant_bytes=distinct - union,
            lower_bound=any(r.files[path][2] for r in readers)))
    files.sort(key=lambda f: (-f.redundant_bytes, f.path))
    merged = MergedProfile(ranks=list(ranks), files=files)
    merged.suggestions = _rules(merged)
    return merged


def _rules(m: MergedProfile) -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = []
    if len(m.ranks) < 2:
        return out
    union = sum(f.union_bytes for f in m.files)
    multi = sum(f.overlap_bytes for f in m.files)
    if multi > 0 and multi >= OVERLAP_FRACTION * union:
        shared = [f for f in m.files if f.overlap_bytes > 0]
        top = shared[0]
        out.append({
            "rule": "same_offsets_across_ranks",
            "message": (f"{multi} of the {union} distinct bytes read were read by two or more ranks "
                        f"({sum(f.redundant_bytes for f in shared)} bytes read again by another rank) in "
                        f"{len(shared)} files; {top.path}: {top.common_bytes} bytes read by all of its "
                        f"{len(top.bytes_by_rank)} readers. Shard the data by rank (DistributedSampler, rank-strided "
                        f"shards), or read it once per node and share it (one cache for all ranks)."),
            "evidence": {"ranks": len(m.ranks), "union_bytes": union, "overlap_bytes": multi,
                         "redundant_bytes": sum(f.redundant_bytes for f in shared),
                         "files": [f.as_dict() for f in shared[:20]]},
        })
    by_bytes = sorted(m.ranks, key=lambda r: r.bytes)
    low, high = by_bytes[0], by_bytes[-1]
    if high.bytes - low.bytes >= IMBALANCE_MIN_BYTES and high.bytes >= IMBALANCE_RATIO * low.bytes:
        out.append({
            "rule": "rank_imbalance_bytes",
            "message": (f"Rank {high.label} read {high.bytes} bytes, rank {low.label} {low.bytes} "
                        f"({high.bytes / max(1, low.bytes):.1f}x). Give every rank an equal share of the data "
                        f"(equal-size shards, drop_last / padding in the sampler)."),
            "evidence": {"bytes_by_rank": {r.label: r.bytes for r in m.ranks}},
        })
    by_stall = sorted(m.ranks, key=lambda r: r.stall_ns)
    low, high = by_stall[0], by_stall[-1]
    run_ns = max(r.elapsed_s for r in m.ranks) * 1e9
    if (high.stall_ns - low.stall_ns >= IMBALANCE_MIN_STALL_FRACTION * run_ns
            and high.stall_ns >= IMBALANCE_RATIO * low.stall_ns):
        out.append({
            "rule": "rank_imbalance_stall",
            "message": (f"Rank {high.label} waited {high.stall_ns / 1e9:.3f} s for data, rank {low.label} "
                        f"{low.stall_ns / 1e9:.3f} s: the others wait for it at every synchronisation. Look at "
                        f"that rank's storage path (host {high.host}) and its share of the data."),
            "evidence": {"stall_ns_by_rank": {r.label: r.stall_ns for r in m.ranks}, "run_ns": int(run_ns)},
        })
    return out


def text(m: MergedProfile) -> str:
    lines = [f"unstall merged I/O profile: {len(m.ranks)} ranks, {len(m.files)} files"]
    lines.append(f"  {'rank':>8} {'host':>16} {'pid':>8} {'bytes read':>14} {'reads':>9} {'stall s':>9} "
                 f"{'written':>12} {'ckpt s':>8}")
    for r in m.ranks:
        lines.append(f"  {r.label:>8} {str(r.host or '-')[:16]:>16} {r.pid:>8} {r.bytes:>14} {r.read_calls:>9} "
                     f"{r.stall_ns / 1e9:>9.3f} {r.bytes_written:>12} {r.checkpoint_ns / 1e9:>8.3f}")
    lines.append("\nfiles read by several ranks (by redundant bytes):")
    shown = [f for f in m.files if len(f.bytes_by_rank) > 1][:50]
    if not shown:
        lines.append("  none")
    for f in shown:
        lines.append(f"  {f.path}: {len(f.bytes_by_rank)} ranks, union {f.union_bytes}, read by all "
                     f"{f.common_bytes}, by 2+ {f.overlap_bytes}, redundant {f.redundant_bytes}"
                     + (" (lower bounds)" if f.lower_bound else ""))
    lines.append("\nsuggestions:")
    if not m.suggestions:
        lines.append("  none: no rule fired")
    for s in m.suggestions:
        lines.append(f"  [{s['rule']}] {s['message']}")
    return "\n".join(lines) + "\n"


def _inputs(paths: Iterable[Path]) -> List[Path]:
    """Profile files, with directories expanded to the agent profiles (``*.json``) they hold."""
    out: List[Path] = []
    for p in paths:
        if p.is_dir():
            for candidate in sorted(p.glob("*.json")):
                try:
                    if json.loads(candidate.read_text()).get("format") == PROFILE_FORMAT:
                        out.append(candidate)
                except (OSError, ValueError, AttributeError):
                    continue
        else:
            out.append(p)
    return out


def main(paths: Sequence[Path], out_prefix: Path) -> int:
    """Merges, writes ``PREFIX.json`` and ``PREFIX.txt``, prints the text; 2 on bad input."""
    import sys

    try:
        inputs = _inputs(paths)
        if not inputs:
            raise ValueError(f"no agent profiles in {', '.join(map(str, paths))}")
        merged = merge([load(p) for p in inputs])
    except ValueError as e:
        print(f"unstall profile merge: {e}", file=sys.stderr)
        return 2
    out_prefix.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out_prefix}.json").write_text(json.dumps(merged.as_dict(), indent=1) + "\n")
    summary = text(merged)
    Path(f"{out_prefix}.txt").write_text(summary)
    print(summary, end="")
    print(f"\n  wrote {out_prefix}.json, {out_prefix}.txt")
    return 0
