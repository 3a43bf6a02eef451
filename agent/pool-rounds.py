"""Pools the per-round CPU ratios (agent / no agent) of several agent/run-benchmarks.sh runs.

    python3 agent/pool-rounds.py agent/bench-results/*.txt

Each file is a run's printed output (or the ratios docs/AGENT.md printed for older runs, in the same form): the
ratios after "per-round ratios agent/none:" in the "CPU time of the benchmark thread per op" section. Every round
is one fork without and one with the agent, back to back, so its ratio is one paired observation; the overhead is
the mean ratio - 1 with a Student t interval over the rounds: two-sided 95%, and the one-sided 95% upper bound.
"""

from __future__ import annotations

import math
import statistics
import sys
from statistics import NormalDist


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile (Cornish-Fisher expansion about the normal one: within 1e-3 for df >= 10)."""
    z = NormalDist().inv_cdf(p)
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


def cpu_ratios(text: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    section = text.split("**CPU time of the benchmark thread per op**", 1)
    if len(section) < 2:
        return out
    lines = section[1].split("per-round ratios agent/none:", 1)[1].splitlines()[1:]
    for line in lines:
        name, sep, values = line.strip().partition(":")
        if not sep or not values.strip():
            break
        out.setdefault(name, []).extend(float(v) for v in values.split())
    return out


def summary(r: list[float]) -> str:
    n, m, sd = len(r), statistics.mean(r), statistics.stdev(r)
    se = sd / math.sqrt(n)
    two, one = t_quantile(0.975, n - 1) * se, t_quantile(0.95, n - 1) * se
    return (f"{n} rounds: {100 * (m - 1):+.2f}% ± {100 * two:.2f}% (two-sided 95%: up to {100 * (m - 1 + two):.2f}%; "
            f"one-sided 95% upper bound {100 * (m - 1 + one):.2f}%), SD of a ratio {100 * sd:.1f}%")


def main() -> None:
    pooled: dict[str, list[float]] = {}
    for path in sys.argv[1:]:
        with open(path, encoding="utf-8") as f:
            for name, r in cpu_ratios(f.read()).items():
                print(f"{path}: {name}: {summary(r)}")
                pooled.setdefault(name, []).extend(r)
    for name, r in pooled.items():
        print(f"pooled {name}: {summary(r)}")


if __name__ == "__main__":
    main()
