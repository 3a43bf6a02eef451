"""protocol/fixtures/cache-order-v1.json, which the sidecar's BatchOrder also gives (flight-server's BatchOrderTest):
a prep group's cache-first order is the shim's rule, and its snapshots are written and named as the shim's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from unstall.cache_order import cache_first, decode_snapshot, encode_snapshot, snapshot_digest


def test_the_golden_cache_first_orders(fixtures_dir: Path) -> None:
    cases = json.loads((fixtures_dir / "cache-order-v1.json").read_text())["cases"]
    assert len(cases) >= 40
    for c in cases:
        cached = np.zeros(c["samples"], dtype=bool)
        cached[c["cached"]] = True
        assert cache_first(c["order"], cached, c["window"]) == c["reordered"], c
        assert np.array_equal(decode_snapshot(c["cache_snapshot"], c["samples"], "fixture"), cached)
        assert encode_snapshot(cached) == c["cache_snapshot"] and snapshot_digest(cached) == c["digest"]
        for start in range(0, c["samples"], c["window"]):
            window = c["reordered"][start:start + c["window"]]
            assert sorted(window) == sorted(c["order"][start:start + c["window"]]), "no sample leaves its window"
