"""Helpers for the tests that install unstall as users do (test_wheel.py, test_bundle.py): an environment and
a PATH in which nothing points at this checkout, a Java or a running sidecar."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["REPO", "clean_env", "path_without_java"]

REPO = Path(__file__).resolve().parents[2]


def clean_env(**extra: str) -> dict[str, str]:
    """The environment with nothing that points at this checkout, a Java or a sidecar."""
    drop = ("PYTHONPATH", "PYTHONHOME", "JAVA_HOME", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("UNSTALL_")}
    env.update(extra)
    return env


def path_without_java(first: Path) -> str:
    """``first`` (a venv's bin), then this PATH's directories that hold no ``java`` and are not in the checkout."""
    return os.pathsep.join([str(first), *(d for d in os.environ.get("PATH", "").split(os.pathsep)
                                          if d and not os.access(os.path.join(d, "java"), os.X_OK)
                                          and not Path(d).resolve().is_relative_to(REPO))])
