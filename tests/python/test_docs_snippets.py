"""The Python in README.md and docs/*.md against the API it shows: every snippet parses, its imports of unstall
import, and every call and attribute it reaches through unstall's modules (``ut.`` for ``unstall.torch``,
``prep.``, ``unstall.``, ``unstall.tf.``, ``unstall.torch.``) exists and takes the arguments the snippet gives it
(names and count; ``inspect.signature(...).bind_partial``), so a renamed option or class fails here, naming the
file and line, instead of in a reader's first run. The snippets are not run: they name datasets, models and GPUs the
test machine does not have (the README's main job is run by test_demo_example.py).

The commands the docs show get the same check: each ``--option`` after one of the repo's scripts
(``benchmarks/bench_gpu.py --rows ...``) is one that script (or a module of its folder it imports from) spells,
and every other ``--option`` in a code span or block is spelled somewhere in the sources (the sidecar's, the shim's,
the scripts'; not the tests'), but for the few of other tools' the docs name. And every relative link in them, and in
every README the repo tracks, reaches a file, and a heading there where it names one (GitHub's anchors)."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
from pathlib import Path
from typing import Any, Iterator, List, Optional, Tuple

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SNIPPET = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
# How the docs spell unstall's modules, longest first: a dotted name is resolved through the first that prefixes it.
ROOTS = (("unstall.torch", "unstall.torch"), ("unstall.tf", "unstall.tf"), ("unstall", "unstall"),
         ("ut", "unstall.torch"), ("prep", "unstall.prep"))
_MISSING = object()
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]+)")
SCRIPT = re.compile(r"((?:benchmarks|scripts|examples)/[\w/]+\.py)([^|;&]*)")
# Options of other programs the docs show: not unstall's to spell.
OTHERS = {"--change": "the duplicates tool (docs/DEVELOPING.md)", "--lr": "the reader's own train.py"}


def snippets() -> Iterator[Tuple[str, int, str]]:
    for path in DOCS:
        text = path.read_text()
        for m in SNIPPET.finditer(text):
            yield path.relative_to(REPO).as_posix(), text.count("\n", 0, m.start()) + 2, m.group(1)


def dotted(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def resolve(name: str) -> Any:
    """The object a dotted name reaches through one of ROOTS; None when it starts with none of them; _MISSING when
    an attribute on the way does not exist."""
    for spelled, module in ROOTS:
        if name == spelled or name.startswith(spelled + "."):
            obj: Any = importlib.import_module(module)
            for part in name[len(spelled):].split(".")[1:]:
                obj = getattr(obj, part, _MISSING)
                if obj is _MISSING:
                    return _MISSING
            return obj
    return None


def problems(code: str, local: set[str]) -> List[Tuple[int, str]]:
    """What in ``code`` does not match the API: (line in the snippet, what)."""
    out: List[Tuple[int, str]] = []
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mod = node.module if isinstance(node, ast.ImportFrom) else None
            for alias in node.names:
                target = f"{mod}.{alias.name}" if mod else alias.name
                if target.split(".")[0] != "unstall":
                    continue
                try:
                    if mod:
                        m = importlib.import_module(mod)
                        if not hasattr(m, alias.name):
                            importlib.import_module(target)
                    else:
                        importlib.import_module(target)
                except ImportError as e:
                    out.append((node.lineno, f"import of {target} fails: {e}"))
        name = dotted(node.func) if isinstance(node, ast.Call) else dotted(node)
        if name is None or name.split(".")[0] in local or not isinstance(node, (ast.Call, ast.Attribute)):
            continue
        obj = resolve(name)
        if obj is None:
            continue
        if obj is _MISSING:
            out.append((node.lineno, f"{name} does not exist"))
        elif isinstance(node, ast.Call) and callable(obj):
            if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                continue
            try:
                sig = inspect.signature(obj)
            except (TypeError, ValueError):
                continue
            try:
                sig.bind_partial(*[None] * len(node.args), **{k.arg: None for k in node.keywords if k.arg})
            except TypeError as e:
                out.append((node.lineno, f"{name}({ast.unparse(node)[len(ast.unparse(node.func)) + 1:-1]}): {e}"))
    return out


def assigned(code: str) -> set[str]:
    """Names a snippet binds itself (``tf = transforms.Compose(...)``): not unstall's, whatever they are called."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                if not (alias.name.split(".")[0] == "unstall" or (isinstance(node, ast.ImportFrom)
                                                                  and (node.module or "").startswith("unstall"))):
                    names.add(bound)
    return names


CASES = list(snippets())


@pytest.mark.parametrize("where,line,code", CASES, ids=[f"{w}:{n}" for w, n, _ in CASES])
def test_a_docs_snippet_matches_the_api(where: str, line: int, code: str) -> None:
    if "unstall.tf" in code or "import tensorflow" in code:
        pytest.importorskip("tensorflow", reason="the snippet shows unstall.tf")
    found = problems(code, assigned(code))
    assert not found, "\n".join(f"{where}:{line + at - 1}: {what}" for at, what in found)


def test_the_check_finds_a_renamed_option_a_missing_name_and_a_failing_import() -> None:
    """What the check above reports, on snippets written wrong on purpose."""
    code = ("import unstall.torch as ut\nfrom unstall import prep\nfrom unstall import no_such_module\n"
            "loader = ut.DataLoader(ds, batch_size=8, num_worker=2)\npipe = prep.imagenet_train(224)\n"
            "x = prep.NoSuchThing\ny = prep.decode(device='mixed', cpu_load='auto')\n")
    found = problems(code, assigned(code))
    assert [at for at, _ in found] == [3, 4, 6], found
    assert "no_such_module" in found[0][1]
    assert "ut.DataLoader(ds, batch_size=8, num_worker=2): got an unexpected keyword argument 'num_worker'" in found[1][1]
    assert found[2][1] == "prep.NoSuchThing does not exist"
    assert len(CASES) >= 15  # the docs' snippets were found


def doc_commands(text: str) -> List[str]:
    """The command lines of a Markdown text: its fenced blocks' lines (a trailing backslash joins the next) and its
    other code spans, each cut at a ``#`` comment."""
    fence = re.compile(r"^```[a-z]*\n(.*?)^```", re.M | re.S)
    lines = [line for block in fence.findall(text) for line in block.replace("\\\n", " ").splitlines()]
    spans = re.findall(r"`([^`\n]+)`", fence.sub("", text))
    return [c.split(" #")[0] for c in [*lines, *spans]]


def script_options(path: Path) -> set[str]:
    """The options a script spells: in its source, and in the modules of its folder it imports from."""
    source = path.read_text()
    found = set(FLAG.findall(source))
    for module in re.findall(r"^from (\w+) import", source, re.M):
        sibling = path.parent / f"{module}.py"
        if sibling.exists():
            found |= set(FLAG.findall(sibling.read_text()))
    return found


def command_problems(commands: List[str], spelled: set[str]) -> List[str]:
    """What in ``commands`` names an option nobody spells: a script's own, or any (``spelled``: the sources')."""
    out = []
    for command in commands:
        head = command.split(" -- ")[0]  # after "--", the user's command (unstall analyze -- python train.py)
        for m in SCRIPT.finditer(head):
            script = REPO / m.group(1)
            if not script.exists():
                out.append(f"{m.group(1)} does not exist: {command!r}")
                continue
            own = script_options(script)
            out += [f"{m.group(1)} has no option {f}: {command!r}" for f in FLAG.findall(m.group(2)) if f not in own]
        out += [f"no source spells {f}: {command!r}" for f in FLAG.findall(head) if f not in spelled and f not in OTHERS]
    return out


def source_options() -> set[str]:
    files = subprocess.run(["git", "ls-files", "*.py", "*.java", "*.sh"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    test_code = re.compile(r"(tests/|python-shim/tests/|.*/src/test/|benchmarks/results/)")
    return {f for name in files if not test_code.match(name) for f in FLAG.findall((REPO / name).read_text())}


def test_the_commands_the_docs_show_name_options_that_exist() -> None:
    spelled = source_options()
    found = [f"{doc.relative_to(REPO)}: {what}" for doc in DOCS
             for what in command_problems(doc_commands(doc.read_text()), spelled)]
    assert not found, "\n".join(found)


def test_the_command_check_finds_a_scripts_unknown_option_and_one_nobody_spells() -> None:
    text = ("Run `python benchmarks/bench_gpu.py --rows prep_device --no-such-row` and\n\n```bash\n"
            "python benchmarks/bench_cache.py --workers 0 \\\n    --bandwith 1e6   # a typo\n"
            "unstall analyze --steps 5 -- python train.py --anything\n```\nand `--cache-capacitty`.\n")
    found = command_problems(doc_commands(text), source_options())
    assert found == ["benchmarks/bench_cache.py has no option --bandwith: "
                     "'python benchmarks/bench_cache.py --workers 0      --bandwith 1e6  '",
                     "no source spells --bandwith: 'python benchmarks/bench_cache.py --workers 0      --bandwith 1e6  '",
                     "benchmarks/bench_gpu.py has no option --no-such-row: "
                     "'python benchmarks/bench_gpu.py --rows prep_device --no-such-row'",
                     "no source spells --no-such-row: 'python benchmarks/bench_gpu.py --rows prep_device --no-such-row'",
                     "no source spells --cache-capacitty: '--cache-capacitty'"], found


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a Markdown text's headings: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces to ``-``, a repeated one suffixed ``-1``, ``-2``, ..."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        out.add(slug if n == 0 else f"{slug}-{n}")
        seen[slug] = n + 1
    return out


def link_problems(doc: Path) -> List[str]:
    out = []
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.M | re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            out.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in heading_anchors(file.read_text()):
            out.append(f"{target}: no heading with that anchor")
    return out


def test_the_docs_links_reach_their_files_and_headings() -> None:
    readmes = [REPO / name for name in subprocess.run(["git", "ls-files", "*/README.md"], cwd=REPO, capture_output=True,
                                                      text=True, check=True).stdout.split()]
    found = [f"{doc.relative_to(REPO)}: {what}" for doc in [*DOCS, *readmes] for what in link_problems(doc)]
    assert not found, "\n".join(found)
    assert heading_anchors("# A, b: the `c` (d)\n## Again\n## Again\n") == {"a-b-the-c-d", "again", "again-1"}


def test_a_broken_link_is_named(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Its title\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](other.md#its-title) [gone](missing.md) [no anchor](other.md#nope) [url](https://x.org/a#b)\n")
    assert link_problems(doc) == ["missing.md: no such file", "other.md#nope: no heading with that anchor"]
