"""Shared bits of the benchmark reports: the command/date/machine header, and the transport a loader used."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any, List, Optional

__all__ = ["header", "machine", "transport_of"]


def machine() -> str:
    model = ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as fh:
            kib = int(fh.readline().split()[1])
            mem = f", {kib / (1 << 20):.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    versions = [f"Python {platform.python_version()}"]
    for mod in ("torch", "torchvision", "unstall"):
        m = sys.modules.get(mod)
        if m is not None:
            versions.append(f"{mod} {getattr(m, '__version__', '?')}")
    return (f"{platform.machine()}{', ' + model if model else ''}, {os.cpu_count()} CPUs{mem}, "
            f"{platform.system()} {platform.release()}, {', '.join(versions)}")


def header() -> List[str]:
    """Markdown lines naming the command, the date (UTC) and the machine."""
    cmd = " ".join(shlex.quote(a) for a in [os.path.relpath(sys.executable), *sys.argv])
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return [f"- command: `{cmd}`", f"- date: {now}", f"- machine: {machine()}"]


def transport_of(*objs: Any) -> Optional[str]:
    """The data transport (e.g. Flight, shared memory) if any of ``objs`` exposes one, else None.

    Looks, defensively, for a ``transport`` attribute on each object, on its ``total`` (LoaderStats),
    and on its ``_client`` (a Dataset's Flight client). The attribute is new; older builds have none.
    """
    for obj in objs:
        if obj is None:
            continue
        for cand in (obj, getattr(obj, "total", None), getattr(obj, "_client", None)):
            if cand is None:
                continue
            try:
                value = getattr(cand, "transport", None)
            except Exception:
                continue
            if callable(value):
                try:
                    value = value()
                except Exception:
                    continue
            if value:
                return str(getattr(value, "value", value))
    return None


def write_out(path: Optional[Path], lines: List[str]) -> None:
    """Also writes the printed tables to ``path`` (a benchmark's ``--out``), when given."""
    if path is not None:
        path.write_text("\n".join(lines) + "\n")
        print(f"wrote {path}", file=sys.stderr)
