"""``unstall analyze``: DS-Analyzer's differential stall measurement for an unchanged training command.

The analyzer (``runner``) runs the command several times, each time with a fresh sidecar and the
environment variables below; the shim (``child``) honours them in every loader the command iterates (an
``unstall.torch.DataLoader``, or a ``tf.data.Dataset`` over ``unstall.tf.dataset``; ``sources`` says what
differs between the two): one section per loader, each timing ``steps`` steps after ``warmup`` steps and
then ending that loader's epoch; the process ends with ``SystemExit(0)`` once every loader is done. ``model``
turns each section's three runs into rates, stall fractions and what-if curves; ``report`` writes the
text, JSON, pictures and the HTML page.

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
ENV_SECTIONS = "UNSTALL_ANALYZE_SECTIONS"  # loaders the first run found: end the process after that many
ENV_WORKERS = "UNSTALL_ANALYZE_WORKERS"  # validation runs: every DataLoader gets this many workers

MODES = ("synthetic", "cached", "cold", "real")

__all__ = ["ENV_MODE", "ENV_STEPS", "ENV_WARMUP", "ENV_REPORT", "ENV_WARM", "ENV_SECTIONS", "ENV_WORKERS", "MODES",
           "AnalyzeError"]


class AnalyzeError(Exception):
    """A loader that cannot be analysed; the message is for the user."""
