"""The shim imports downward only: the graph of every import statement between unstall's modules (those
inside functions and under TYPE_CHECKING included, since a lazy import is still a dependency) has no cycle,
and no source file grows past the size where it starts mixing responsibilities."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "unstall"
MAX_LINES = 500
# Modules allowed over the limit (none today), each capped where it stands so that it can only shrink.
LONGER: dict[str, int] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The unstall modules that ``name`` (at ``path``) imports. ``from .x import y`` depends on ``x.y`` when
    that is a module, else on ``x``. Packages that Python loads as parents on the way are not edges: a
    package's own imports are its __init__'s edges."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            for alias in node.names:
                sub = f"{stem}.{alias.name}"
                targets.add(sub if sub in known else stem)
    return {target for target in targets if target in known and target != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imported(name, path, known) for name, path in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    white, grey, black = 0, 1, 2
    color = dict.fromkeys(edges, white)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        color[node] = grey
        stack.append(node)
        for nxt in sorted(edges[node]):
            if color[nxt] == grey:
                return stack[stack.index(nxt) :] + [nxt]
            if color[nxt] == white:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        color[node] = black
        return None

    for start in sorted(edges):
        if color[start] == white:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def test_the_graph_sees_lazy_and_relative_imports() -> None:
    edges = graph()
    # __init__ imports the sidecar at the top and torch inside a function.
    assert "unstall.sidecar" in edges["unstall"]
    assert "unstall.torch" in edges["unstall"]
    assert "unstall.protocol" in edges["unstall.client"]


def test_no_import_cycle() -> None:
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_find_cycle_reports_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_source_file_over_the_limit() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    long = {name: n for name, n in sizes.items() if n > LONGER.get(name, MAX_LINES)}
    assert not long, f"modules over {MAX_LINES} lines (or over their cap in LONGER): {long}"
