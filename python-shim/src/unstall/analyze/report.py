"""The analysis for people (text), for programs (JSON), as a picture (PNG: stall breakdown bar,
throughput vs cache size, throughput vs DataLoader workers) and as one self-contained HTML page (the
same plots as inline SVG, the numbers, one section per loader; nothing fetched from the network)."""

from __future__ import annotations

import html
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from .model import Analysis, Run

__all__ = ["Section", "text", "validation_text", "write_json", "write_png", "figure_svg", "write_html", "REPORT_FORMAT"]

REPORT_FORMAT = "unstall.analyze/2"


@dataclass
class Section:
    """One loader of the command: its heading, and its analysis or why there is none."""

    heading: str
    analysis: Optional[Analysis] = None
    runs: Dict[str, Run] = field(default_factory=dict)
    text: str = ""
    validation: List[Dict[str, Any]] = field(default_factory=list)
    error: Optional[str] = None


def _rate(x: float) -> str:
    return "unbounded" if math.isinf(x) else f"{x:,.1f} samples/s"


def _bytes(n: Optional[float]) -> str:
    if n is None:
        return "?"
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= k:
            return f"{n / k:.2f} {unit}"
    return f"{n:.0f} B"


def text(heading: str, a: Analysis, runs: Mapping[str, Run], dataset: Mapping[str, Any],
         machine: Optional[Mapping[str, Any]] = None) -> str:
    lines = [
        heading,
        f"  dataset {dataset.get('name')!r}: {a.num_samples} samples, {_bytes(a.dataset_bytes)}; "
        f"batch size {a.batch_size:g}, num_workers {a.num_workers}; {a.steps} timed steps per run",
        "",
        f"  {'run':<10} {'time':>9} {'per step':>10} {'samples/s':>11}  cache hits",
    ]
    for mode in ("synthetic", "cached", "cold"):
        r = runs[mode]
        hf = r.hit_fraction
        lines.append(f"  {mode:<10} {r.elapsed_s:>8.2f}s {1000 * r.step_s:>8.1f}ms {r.rate:>11.1f}  "
                     f"{'-' if hf is None else f'{100 * hf:.0f}%'}")
    lines += [
        "",
        f"  ingestion rate (synthetic data)   {_rate(a.ingestion_rate)}",
        f"  prep rate (fully cached)          {_rate(a.prep_rate)}",
        f"  fetch rate (cold cache)           {_rate(a.fetch_rate)}",
        f"  storage                           {_bytes(a.storage_bandwidth_Bps)}/s, "
        + ("overlapped with the loader (prefetch/readahead)" if a.storage_model == "overlapped"
           else "reads block the loader"),
        "",
        f"  cold run: trainer {100 * a.compute_fraction:.1f}%, prep stall {100 * a.prep_stall_fraction:.1f}%, "
        f"fetch stall {100 * a.fetch_stall_fraction:.1f}%",
        "",
        "  what if (predicted samples/s):",
        "    cache   " + "  ".join(f"{int(100 * p['cache_fraction']):>6}%" for p in a.cache_curve[::4]),
        "            " + "  ".join(f"{p['samples_per_s']:>7.1f}" for p in a.cache_curve[::4]),
        "    workers " + "  ".join(f"{p['workers']:>7}" for p in a.cpu_curve[:9]),
        "    cold    " + "  ".join(f"{p['samples_per_s_cold']:>7.1f}" for p in a.cpu_curve[:9]),
        "    cached  " + "  ".join(f"{p['samples_per_s_cached']:>7.1f}" for p in a.cpu_curve[:9]),
    ]
    if machine and machine.get("cpu_count"):
        load = machine.get("load_average")
        lines.append(f"    (workers: their prep's CPU time shares the cold run's machine's {machine['cpu_count']} cores"
                     + (f", load average {load:.1f})" if load is not None else ")"))
    lines += echo_lines(a)
    lines += cache_forms_lines(dataset.get("cache_forms"))
    c = a.cheapest or {}
    if not c.get("found"):
        lines.append(f"  {c.get('message', 'no configuration removes the stall')}")
    elif not c["stalled_now"]:
        lines.append("  no stall: the cold run already runs at the ingestion rate (within 5%)")
    else:
        lines.append(
            f"  cheapest configuration without a stall: cache {100 * c['cache_fraction']:.0f}% of the dataset "
            f"({_bytes(c['cache_bytes'])}) with {c['workers']} loader workers -> {_rate(c['samples_per_s'])} "
            f"(~${c['cost_per_hour']:.3f}/h at ${a.prices['core_hour']}/core-h, ${a.prices['gib_hour']}/GiB-h)")
    return "\n".join(lines) + "\n"


def cache_forms_lines(plan: Optional[Mapping[str, Any]]) -> List[str]:
    """The sidecar's cache-forms plan for a prep group (docs/PREP.md, "Cache forms"): what it keeps in which form,
    why, and the epoch it predicted against the one it measured."""
    if not plan:
        return []
    line = f"  cache forms (sidecar, epoch {plan.get('epoch')}): {plan.get('reason')}"
    measured = plan.get("measured_epoch_s")
    if plan.get("predicted_epoch_s") is not None:
        line += (f"; predicted epoch {plan['predicted_epoch_s']:.2f} s"
                 + (f", measured {measured:.2f} s" if measured is not None else ""))
    return [line]


def echo_lines(a: Analysis) -> List[str]:
    """The data-echoing what-if (``model``'s module doc states the model)."""
    rows = a.echo_curve
    if not rows:
        return []
    now = next(r for r in rows if r["echo"] == a.echo)
    lines = ["    echo    " + "  ".join(f"{r['echo']:>7}" for r in rows)
             + f"   (data echoing; the job runs with echo={a.echo})",
             "    stall   " + "  ".join(f"{100 * r['stall_fraction']:>6.1f}%" for r in rows),
             "    fresh/s " + "  ".join(f"{r['fresh_samples_per_s']:>7.1f}" for r in rows)]
    better = [r for r in rows if r["echo"] > a.echo and r["stall_s"] < now["stall_s"] * (1 - 1e-9)]
    if better:
        r = better[0]
        lines.append(f"  with echo={r['echo']} the data stall would drop from {100 * now['stall_fraction']:.1f}% to "
                     f"{100 * r['stall_fraction']:.1f}% of the step ({1000 * now['stall_s']:.1f} -> "
                     f"{1000 * r['stall_s']:.1f} ms) at the cost of fresh samples = 1/{r['echo']} per step "
                     f"({r['fresh_samples_per_s']:.1f} fresh samples/s)")
    else:
        lines.append("  more data echoing would not reduce the stall: the loader keeps up (or the model says no)")
    return lines


def validation_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """The worker-count what-if against reruns of the command with those workers (cold cache)."""
    if not rows:
        return ""
    lines = ["  worker-count what-if checked by rerunning the command (cold cache):",
             f"    {'workers':>7} {'predicted':>10} {'measured':>10} {'error':>8}"]
    for r in rows:
        if r.get("error") is not None:
            lines.append(f"    {r['workers']:>7}  not checked: {r['error']}")
        else:
            lines.append(f"    {r['workers']:>7} {r['predicted']:>10.1f} {r['measured']:>10.1f} "
                         f"{100 * r['relative_error']:>+7.1f}%")
    return "\n".join(lines) + "\n"


def write_json(path: Path, doc: Dict[str, Any]) -> None:
    path.write_text(json.dumps(doc, indent=1, default=_json_default))


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and math.isinf(o):
        return None
    raise TypeError(type(o).__name__)


def write_png(path: Path, a: Analysis, title: str, validation: Sequence[Mapping[str, Any]] = ()) -> bool:
    """The picture; False when matplotlib is not installed (``pip install 'unstall[analyze]'``)."""
    fig = _figure(a, title, validation)
    if fig is None:
        return False
    fig.savefig(path, dpi=110)
    _close(fig)
    return True


def figure_svg(a: Analysis, title: str, validation: Sequence[Mapping[str, Any]] = ()) -> Optional[str]:
    """The picture as an ``<svg>`` element to inline in HTML (text kept as text); None without matplotlib."""
    fig = _figure(a, title, validation)
    if fig is None:
        return None
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format="svg")
    _close(fig)
    doc = buf.getvalue()
    return re.sub(r"\s*<metadata>.*?</metadata>", "", doc[doc.index("<svg"):], flags=re.S)  # dates, generator


def _close(fig: Any) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)


def _figure(a: Analysis, title: str, validation: Sequence[Mapping[str, Any]]) -> Any:
    """Stall bar, throughput vs cache, throughput vs workers (with the reruns' measurements, if any)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig = plt.figure(figsize=(11, 6.5))
    grid = fig.add_gridspec(2, 2, height_ratios=[1, 3])
    ax0 = fig.add_subplot(grid[0, :])
    left = 0.0
    for label, frac, color in (("trainer", a.compute_fraction, "#4c72b0"), ("prep stall", a.prep_stall_fraction, "#dd8452"),
                               ("fetch stall", a.fetch_stall_fraction, "#c44e52")):
        ax0.barh([0], [frac], left=[left], color=color, label=f"{label} {100 * frac:.1f}%")
        if frac > 0.06:
            ax0.text(left + frac / 2, 0, f"{label}\n{100 * frac:.0f}%", ha="center", va="center", color="white", fontsize=9)
        left += frac
    ax0.set_xlim(0, 1)
    ax0.set_yticks([])
    ax0.set_xlabel("share of the cold run's time")
    ax0.set_title(title, fontsize=10)
    ax0.legend(loc="upper center", bbox_to_anchor=(0.5, -0.55), ncol=3, fontsize=8, frameon=False)

    ax1 = fig.add_subplot(grid[1, 0])
    xs = [100 * p["cache_fraction"] for p in a.cache_curve]
    ax1.plot(xs, [p["samples_per_s"] for p in a.cache_curve], marker="o", ms=3, label=f"{a.num_workers} workers (as run)")
    ax1.axhline(a.ingestion_rate, color="gray", ls="--", lw=1, label="ingestion rate (no stall)")
    c = a.cheapest or {}
    if c.get("found") and c.get("workers") != a.num_workers:
        ax1.plot(xs, [a.predict(p["cache_fraction"], c["workers"]) for p in a.cache_curve], marker=".", ms=3,
                 label=f"{c['workers']} workers")
    if c.get("found") and c.get("stalled_now"):
        ax1.plot([100 * c["cache_fraction"]], [c["samples_per_s"]], marker="*", ms=14, color="#c44e52",
                 label=f"cheapest: {100 * c['cache_fraction']:.0f}% cache, {c['workers']} workers")
    ax1.set_xlabel("dataset cached (%)")
    ax1.set_ylabel("samples/s (predicted)")
    ax1.set_ylim(bottom=0)
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3)

    ax2 = fig.add_subplot(grid[1, 1])
    ks = [p["workers"] for p in a.cpu_curve]
    ax2.plot(ks, [p["samples_per_s_cold"] for p in a.cpu_curve], marker="o", ms=3, label="cold cache")
    ax2.plot(ks, [p["samples_per_s_cached"] for p in a.cpu_curve], marker="o", ms=3, label="fully cached")
    ax2.axhline(a.ingestion_rate, color="gray", ls="--", lw=1, label="ingestion rate")
    checked = [(r["workers"], r["measured"]) for r in validation if r.get("error") is None]
    if checked:
        ax2.plot(*zip(*checked), ls="none", marker="X", ms=9, color="#c44e52", label="measured, cold (rerun)")
    ax2.set_xlabel("loader workers (DataLoader num_workers, tf.data parallelism)")
    ax2.set_ylabel("samples/s (predicted)")
    ax2.set_ylim(bottom=0)
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    return fig


_CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:20px}h2{font-size:17px;border-top:1px solid #ccc;padding-top:12px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f2f2f2}td:first-child,th:first-child{text-align:left}pre{background:#f7f7f7;padding:8px;overflow:auto}
.error{color:#b00}svg{max-width:100%;height:auto}"""


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cell = lambda tag, v: f"<{tag}>{html.escape(str(v))}</{tag}>"  # noqa: E731
    return ("<table><tr>" + "".join(cell("th", h) for h in head) + "</tr>"
            + "".join("<tr>" + "".join(cell("td", v) for v in r) + "</tr>" for r in rows) + "</table>")


def _section_html(sec: Section) -> str:
    parts = [f"<h2>{html.escape(sec.heading)}</h2>"]
    a = sec.analysis
    if a is None:
        return parts[0] + f'<p class="error">not analysed: {html.escape(sec.error or "?")}</p>'
    runs = [(m, f"{r.elapsed_s:.2f} s", f"{1000 * r.step_s:.1f} ms", f"{r.rate:.1f}",
             "-" if r.hit_fraction is None else f"{100 * r.hit_fraction:.0f}%") for m, r in sec.runs.items()]
    parts.append(_table(("run", "time", "per step", "samples/s", "cache hits"), runs))
    parts.append(_table(("quantity", "value"), [
        ("ingestion rate (synthetic data)", _rate(a.ingestion_rate)),
        ("prep rate (fully cached)", _rate(a.prep_rate)),
        ("fetch rate (cold cache)", _rate(a.fetch_rate)),
        ("trainer share of the cold run", f"{100 * a.compute_fraction:.1f}%"),
        ("prep stall", f"{100 * a.prep_stall_fraction:.1f}%"),
        ("fetch stall", f"{100 * a.fetch_stall_fraction:.1f}%"),
        ("storage", f"{_bytes(a.storage_bandwidth_Bps)}/s ({a.storage_model})"),
    ]))
    if a.echo_curve:
        parts.append(_table(("echo (predicted, cold cache)", "data stall", "stall ms/step", "fresh samples/s"), [
            (f"{r['echo']}" + (" (as run)" if r["echo"] == a.echo else ""), f"{100 * r['stall_fraction']:.1f}%",
             f"{1000 * r['stall_s']:.1f}", f"{r['fresh_samples_per_s']:.1f}") for r in a.echo_curve]))
    if sec.validation:
        parts.append(_table(("workers", "predicted samples/s", "measured samples/s", "error"), [
            (r["workers"], "-", "-", f"not checked: {r['error']}") if r.get("error") is not None else
            (r["workers"], f"{r['predicted']:.1f}", f"{r['measured']:.1f}", f"{100 * r['relative_error']:+.1f}%")
            for r in sec.validation]))
    svg = figure_svg(a, sec.heading, sec.validation)
    parts.append(svg if svg is not None else "<p>(no plots: pip install 'unstall[analyze]' for matplotlib)</p>")
    parts.append(f"<pre>{html.escape(sec.text)}</pre>")
    return "\n".join(parts)


def write_html(path: Path, title: str, sections: Sequence[Section]) -> None:
    """One self-contained page: inline CSS and SVG, no scripts, nothing fetched."""
    body = "\n".join(_section_html(s) for s in sections)
    path.write_text(
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_CSS}</style></head>\n<body><h1>{html.escape(title)}</h1>\n{body}\n</body></html>\n")
