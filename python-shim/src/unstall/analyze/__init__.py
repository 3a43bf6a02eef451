"""``unstall analyze``: DS-Analyzer's differential stall measurement for an unchanged training command.

The analyzer (``runner``) runs the command several times, each time with a fresh sidecar and the
environment variables below; the shim's DataLoader (``child``) honours them in the first DataLoader the
command iterates, times ``steps`` steps after ``warmup`` steps, writes a JSON report and ends the process
with ``SystemExit(0)``. ``model`` turns the three runs into rates, stall fractions and what-if curves;
``report`` writes the text, JSON and picture.

Modes: ``synthetic`` (after the first real batch, copies of it: the model's own ingestion rate),
``cached`` (the whole dataset read into a cache larger than it first: prep only), ``cold`` (cache 0:
fetch and prep), ``real`` (whatever the sidecar's cache holds after an optional warm pass; used to check
predictions).
"""

from __future__ import annotations

ENV_MODE = "UNSTALL_ANALYZE_MODE"
ENV_STEPS = "UNSTALL_ANALYZE_STEPS"
ENV_WARMUP = "UNSTALL_ANALYZE_WARMUP"
ENV_REPORT = "UNSTALL_ANALYZE_REPORT"
ENV_WARM = "UNSTALL_ANALYZE_WARM"

MODES = ("synthetic", "cached", "cold", "real")

__all__ = ["ENV_MODE", "ENV_STEPS", "ENV_WARMUP", "ENV_REPORT", "ENV_WARM", "MODES"]
