"""Unit tests of unstall.profile_merge: the range arithmetic and the cross-rank rules on made-up profiles
(the end-to-end test with three real JVMs is tests/python/test_profile_merge.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from unstall import profile_merge as pm


def _profile(tmp: Path, rank: Optional[int], pid: int, files: Dict[str, List[Tuple[int, int]]],
             stall_ns: int = 0, elapsed_s: float = 10.0) -> Path:
    doc: Dict[str, Any] = {
        "format": pm.PROFILE_FORMAT, "pid": pid, "rank": rank, "local_rank": rank, "world_size": None,
        "host": "h", "elapsed_s": elapsed_s,
        "totals": {"bytes": sum(e - s for r in files.values() for s, e in r), "read_calls": 1,
                   "writes": {"bytes": 0}},
        "stalls": {"total_ns": stall_ns, "count": 10},
        "files": [{"path": p, "bytes": sum(e - s for s, e in r), "read_ranges": [list(x) for x in r],
                   "read_ranges_truncated": False} for p, r in files.items()],
    }
    path = tmp / f"p-{pid}.json"
    path.write_text(json.dumps(doc))
    return path


def test_overlap_counts_union_common_and_two_or_more() -> None:
    assert pm.overlap([[(0, 100)], [(50, 150)], [(60, 70), (140, 200)]]) == (200, 10, 60)  # 2+: [50,100) and [140,150)
    assert pm.overlap([[(0, 10)], []]) == (10, 0, 0)


def test_disjoint_shards_fire_nothing_and_labels_fall_back_to_the_pid(tmp_path: Path) -> None:
    paths = [_profile(tmp_path, None, 100 + r, {"/d": [(r * 4 << 20, (r + 1) * 4 << 20)]}) for r in range(2)]
    m = pm.merge([pm.load(p) for p in paths])
    assert [r.label for r in m.ranks] == ["pid-100", "pid-101"]
    assert m.files[0].overlap_bytes == 0 and m.suggestions == []


def test_imbalance_in_bytes_and_in_stall(tmp_path: Path) -> None:
    paths = [_profile(tmp_path, 0, 1, {"/a": [(0, 1 << 20)]}, stall_ns=1_000_000_000),
             _profile(tmp_path, 1, 2, {"/b": [(0, 4 << 20)]}, stall_ns=4_000_000_000)]
    rules = {s["rule"]: s for s in pm.merge([pm.load(p) for p in paths]).suggestions}
    assert set(rules) == {"rank_imbalance_bytes", "rank_imbalance_stall"}
    assert rules["rank_imbalance_bytes"]["evidence"]["bytes_by_rank"] == {"0": 1 << 20, "1": 4 << 20}
    assert rules["rank_imbalance_stall"]["evidence"]["stall_ns_by_rank"] == {"0": 1_000_000_000, "1": 4_000_000_000}


def test_bad_input_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="x.json is not an unstall agent profile"):
        pm.load(bad)
    twice = [_profile(tmp_path, 0, 1, {}), _profile(tmp_path, 0, 2, {})]
    with pytest.raises(ValueError, match="rank 0 appears twice"):
        pm.merge([pm.load(p) for p in twice])
