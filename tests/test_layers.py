"""The package's layers, checked by reading every import (no module is imported).

Every ``.py`` file under ``anchored_reasoning/`` and ``benchmarks/`` is parsed with ``ast``; every
import at any depth counts: module-level, inside functions (the lazy imports), ``importlib.import_module``
/ ``__import__`` with a literal name (an f-string counts by its literal prefix), and registry strings of
the form ``"anchored_reasoning.pkg.module:Attr"``. A file breaks a rule when it is in the rule's scope and
one of its imports is, or lies under, one of the rule's forbidden modules.

| rule                | files in scope                                    | may not import (anchored_reasoning.*) |
|---------------------|---------------------------------------------------|---------------------------------------|
| library-no-cli      | anchored_reasoning/ except commands/ and cli.py   | commands, cli                         |
| tasks-leaf          | tasks/, generators/                               | eval, train, models, backends         |
| models-leaf         | models/, objectives*.py, sampling/                | tasks, train, eval, backends          |
| backends-below-eval | backends/                                         | eval, train                           |
| eval-below-train    | eval/                                             | train                                 |
| no-test-helpers     | anchored_reasoning/ except testing.py itself      | testing                               |
| sandbox-standalone  | sandbox/                                          | tasks, eval                           |
| benchmarks-no-cli   | benchmarks/                                       | commands, cli                         |
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = "anchored_reasoning"


def _under(*prefixes: str) -> Callable[[str], bool]:
    return lambda rel: any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in prefixes)


def _library(rel: str) -> bool:
    return _under(PKG)(rel) and not _under(f"{PKG}/commands", f"{PKG}/cli.py")(rel)


def _models_layer(rel: str) -> bool:
    return _under(f"{PKG}/models", f"{PKG}/sampling")(rel) or re.fullmatch(rf"{PKG}/objectives\w*\.py", rel) is not None


@dataclass(frozen=True)
class Rule:
    name: str
    scope: str  # the files it covers, in words (for the failure message)
    applies: Callable[[str], bool]  # path relative to the repository root -> in scope
    forbidden: tuple[str, ...]  # sub-packages/modules of anchored_reasoning

    def broken_by(self, module: str) -> str | None:
        for f in self.forbidden:
            target = f"{PKG}.{f}"
            if module == target or module.startswith(target + "."):
                return target
        return None


RULES = (
    Rule("library-no-cli", "the library (anchored_reasoning/ except commands/ and cli.py)", _library,
         ("commands", "cli")),
    Rule("tasks-leaf", "tasks/ and generators/", _under(f"{PKG}/tasks", f"{PKG}/generators"),
         ("eval", "train", "models", "backends")),
    Rule("models-leaf", "models/, objectives*.py and sampling/", _models_layer,
         ("tasks", "train", "eval", "backends")),
    Rule("backends-below-eval", "backends/", _under(f"{PKG}/backends"), ("eval", "train")),
    Rule("eval-below-train", "eval/", _under(f"{PKG}/eval"), ("train",)),
    Rule("no-test-helpers", "anchored_reasoning/ (testing.py is for the tests only)",
         lambda rel: _under(PKG)(rel) and rel != f"{PKG}/testing.py", ("testing",)),
    Rule("sandbox-standalone", "sandbox/", _under(f"{PKG}/sandbox"), ("tasks", "eval")),
    Rule("benchmarks-no-cli", "benchmarks/", _under("benchmarks"), ("commands", "cli")),
)

_REGISTRY_STRING = re.compile(rf"{PKG}(?:\.\w+)+:\w+")


def _module_name(rel: str) -> str:
    parts = list(Path(rel).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve_relative(rel: str, level: int, module: str | None) -> str:
    package = _module_name(rel).split(".")
    if not rel.endswith("__init__.py"):
        package = package[:-1]
    base = package[: len(package) - (level - 1)] if level > 1 else package
    return ".".join(base + ([module] if module else []))


def _is_import_call(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in ("import_module", "__import__")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def _literal_prefix(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value.rstrip(".")
    return None


def imports_of(rel: str, source: str) -> Iterator[tuple[int, str, tuple[str, ...]]]:
    """(line, what the statement imports, the modules it may load) for every import in the file at ``rel``."""
    for node in ast.walk(ast.parse(source, filename=rel)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, (alias.name,)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_relative(rel, node.level, node.module) if node.level else (node.module or "")
            # `from anchored_reasoning import commands` loads the module anchored_reasoning.commands.
            names = [a.name for a in node.names if a.name != "*"]
            yield node.lineno, f"{base} ({', '.join(names) or '*'})", (base, *(f"{base}.{n}" for n in names))
        elif isinstance(node, ast.Call) and _is_import_call(node.func) and node.args:
            name = _literal_prefix(node.args[0])
            if name:
                yield node.lineno, name, (name,)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _REGISTRY_STRING.fullmatch(node.value):
                yield node.lineno, node.value, (node.value.partition(":")[0],)


def violations(rel: str, source: str) -> list[str]:
    """One message per import statement and broken rule, naming file, line and rule."""
    found = []
    rules = [r for r in RULES if r.applies(rel)]
    for line, shown, modules in imports_of(rel, source):
        for rule in rules:
            target = next((t for t in map(rule.broken_by, modules) if t), None)
            if target:
                found.append((line, f"{rel}:{line}: imports {shown} (rule {rule.name}: {rule.scope} "
                                    f"may not import {target})"))
    return [msg for _, msg in sorted(set(found))]


def _sources() -> list[str]:
    files = sorted((ROOT / PKG).rglob("*.py")) + sorted((ROOT / "benchmarks").rglob("*.py"))
    return [str(p.relative_to(ROOT)) for p in files]


def test_the_tree_has_python_files_in_every_scope():
    # Guards the test itself: a moved directory must not leave a rule checking nothing.
    files = _sources()
    for rule in RULES:
        assert any(rule.applies(rel) for rel in files), f"rule {rule.name} covers no file ({rule.scope})"


def test_no_import_crosses_a_layer():
    found = []
    for rel in _sources():
        found += violations(rel, (ROOT / rel).read_text(encoding="utf-8"))
    assert not found, f"{len(found)} import(s) cross a layer:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "rel, source, rule, line",
    [
        ("anchored_reasoning/eval/x.py", "def f():\n    from anchored_reasoning.commands.eval import g\n",
         "library-no-cli", 2),
        ("anchored_reasoning/tasks/x.py", "from anchored_reasoning.eval import code_exec\n", "tasks-leaf", 1),
        ("anchored_reasoning/tasks/x.py", "import os\nfrom ..eval import code_exec\n", "tasks-leaf", 2),
        ("anchored_reasoning/generators/x.py", "import anchored_reasoning.models.zoo as z\n", "tasks-leaf", 1),
        ("anchored_reasoning/objectives_tadm.py", "from anchored_reasoning.train import diffusion\n",
         "models-leaf", 1),
        ("anchored_reasoning/sampling/x.py", "from anchored_reasoning import backends\n", "models-leaf", 1),
        ("anchored_reasoning/backends/x.py",
         "import importlib\nimportlib.import_module('anchored_reasoning.eval.runner')\n", "backends-below-eval", 2),
        ("anchored_reasoning/eval/x.py", "T = {'a': 'anchored_reasoning.train.pipelines.ar:run'}\n", "eval-below-train", 1),
        ("anchored_reasoning/train/x.py", "def f():\n    from anchored_reasoning.testing import tiny\n",
         "no-test-helpers", 2),
        ("anchored_reasoning/sandbox/x.py", "from anchored_reasoning.tasks import get_task\n",
         "sandbox-standalone", 1),
        ("benchmarks/x.py", "import importlib\nm = importlib.import_module(f'anchored_reasoning.commands.{n}')\n",
         "benchmarks-no-cli", 2),
    ],
)
def test_each_rule_catches_its_import(rel, source, rule, line):
    found = violations(rel, source)
    assert len(found) == 1, found
    assert found[0].startswith(f"{rel}:{line}: imports ") and f"(rule {rule}:" in found[0], found


@pytest.mark.parametrize(
    "rel, source",
    [
        ("anchored_reasoning/commands/eval.py", "from anchored_reasoning.commands import demo\n"),
        ("anchored_reasoning/train/x.py", "from anchored_reasoning.eval.runner import run_eval\n"),
        ("anchored_reasoning/testing.py", "from anchored_reasoning.tokenization import train_tiny_tokenizer\n"),
        ("anchored_reasoning/tasks/x.py", "from anchored_reasoning.sandbox import run_programs\n"),
        ("anchored_reasoning/eval/x.py", "from anchored_reasoning.trainer_utils import x\n"),  # not train/
        ("tests/x.py", "from anchored_reasoning.testing import tiny\n"),
    ],
)
def test_allowed_imports_pass(rel, source):
    assert violations(rel, source) == []


def _module_files() -> dict[str, str]:
    """Module name -> path relative to the root, for every module of the package."""
    return {_module_name(rel): rel for rel in (str(p.relative_to(ROOT)) for p in sorted((ROOT / PKG).rglob("*.py")))}


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (at any depth, lazy imports and ``import_module`` with a literal
    name included; a registry string ``"pkg.module:Attr"`` is a name in a table resolved on demand, like an entry
    point, and is not an import). A ``from package import name`` counts as an import of ``package.name`` when
    that is a module, else of ``package``."""
    modules = _module_files()
    graph: dict[str, set[str]] = {}
    for name, rel in modules.items():
        edges = graph.setdefault(name, set())
        for _, shown, targets in imports_of(rel, (ROOT / rel).read_text(encoding="utf-8")):
            if _REGISTRY_STRING.fullmatch(shown):
                continue
            base, *members = targets
            submodules = [m for m in members if m in modules]
            for target in submodules or ([base] if base in modules else []):
                if target != name:
                    edges.add(target)
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_import_circles():
    circles = import_circles(import_graph())
    assert not circles, "import circles (each a set of modules that import each other):\n" + "\n".join(
        " <-> ".join(c) for c in circles)


def test_the_circle_check_finds_a_circle_through_a_lazy_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_circles(graph) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []
