"""What tests/test_doc_blocks.py runs: the code blocks of README.md and docs/*.md, and the command lines
quoted in RESULTS.md, turned into steps (see that module's docstring for the rules).

* :func:`fenced_blocks` reads Markdown fences (also inside list items); a fence whose info string holds a
  backtick is inline code, not a fence.
* :func:`bash_commands` lets bash itself read a ``bash`` block (line continuations, quotes, variables,
  ``for`` loops, ``&``) with an empty ``PATH``, so every external command lands in bash's
  ``command_not_found_handle``, which records its expanded argv and the Markdown line it sits on. Nothing
  runs there.
* :func:`plan` classifies each command (run / dry-run / parse / check) and :mod:`doc_runner` runs them.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
CODE_LANGS = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python", "py": "python"}
SMALL_N = {"train": 16, "valid": 4}  # problems per generated data section in a real run
RUN_STUB = "stub"  # action of an openai-backend command run against the stub server

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository root
    line: int  # 1-based line of the block's first content line
    lang: str
    text: str


def fenced_blocks(path: str | Path) -> list[Block]:
    path = ROOT / path
    lines = path.read_text().splitlines()
    rel = str(path.relative_to(ROOT))
    blocks, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m or (m["fence"][0] == "`" and "`" in m["info"]):
            i += 1
            continue
        indent, fence = len(m["indent"]), m["fence"]
        closing = re.compile(rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        body, j = [], i + 1
        while j < len(lines) and not closing.match(lines[j]):
            text = lines[j]
            body.append(text[indent:] if not text[:indent].strip() else text.lstrip())
            j += 1
        lang = (m["info"].split() or [""])[0].lower()
        blocks.append(Block(rel, i + 2, lang, "\n".join(body) + "\n"))
        i = j + 1
    return blocks


# ---------------------------------------------------------------- bash blocks -> argv lists

_PRELUDE = (  # one write per record, so a background command's record never interleaves with another's
    '__rec() { local n=${#BASH_LINENO[@]} r; printf -v r "%s\\x1f" "${BASH_LINENO[$((n-2))]}" "$@"; '
    'printf "%s\\x1e" "$r" >> "$__DOCREC"; return 0; }; command_not_found_handle() { __rec "$@"; }'
)


@dataclass
class Command:
    line: int
    argv: list[str]


def bash_commands(block: Block) -> list[Command]:
    """The external commands of a bash block, expanded as bash expands them, in line order."""
    with tempfile.TemporaryDirectory() as tmp:
        script, rec = Path(tmp) / "block.sh", Path(tmp) / "rec"
        # line 1: the prelude; the block's lines keep their Markdown line numbers
        script.write_text(_PRELUDE + "\n" * (block.line - 1) + block.text)
        rec.write_text("")
        env = {"PATH": "/nonexistent", "HOME": str(Path.home()), "__DOCREC": str(rec), "OUT": "out"}
        proc = subprocess.run(["/bin/bash", str(script)], cwd=tmp, env=env, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0 or proc.stderr.strip():
            raise ValueError(f"bash could not read the block: {proc.stderr.strip() or proc.returncode}")
        records = [r.split("\x1f")[:-1] for r in rec.read_text().split("\x1e") if r]
    commands = [Command(int(r[0]), r[1:]) for r in records]
    return sorted(commands, key=lambda c: c.line)  # stable: a loop's commands keep their order


def strip_wrappers(argv: list[str]) -> list[str]:
    """``nice -n 10 CMD`` -> CMD; ``python3`` -> ``python``; ``python -m anchored_reasoning.cli`` ->
    ``anchored-reasoning``."""
    if argv[:1] == ["nice"]:
        argv = argv[3:] if argv[1:2] == ["-n"] else argv[1:]
    if argv[:1] == ["python3"]:
        argv = ["python", *argv[1:]]
    if argv[:3] == ["python", "-m", "anchored_reasoning.cli"]:
        argv = ["anchored-reasoning", *argv[3:]]
    return argv


# ---------------------------------------------------------------- steps

@dataclass
class Step:
    """One check: ``action`` is what the test does (its id says it), ``kind`` how."""
    path: str
    line: int
    action: str  # run | stub | dry-run | parse | check | python | error
    kind: str  # cli | module | python | dry-run | argparse | module-parse | make | pip | file | bash-script | error
    argv: list[str] = field(default_factory=list)
    code: str = ""
    note: str = ""  # why it is not run for real, or what was done instead
    label: str = ""
    outputs: list[str] = field(default_factory=list)  # workspace paths a parse-only step would have written

    @property
    def id(self) -> str:
        label = re.sub(r"[^\w.+-]+", "-", self.label).strip("-")
        return f"{self.path}:{self.line}-{self.action}" + (f"-{label}" if label else "")

    @property
    def in_workspace(self) -> bool:
        return self.kind in ("cli", "module", "python", "dry-run")


def flag_value(argv: list[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def is_hub_id(name: Any) -> bool:
    text = str(name or "")
    return "/" in text and not text.startswith(("runs/", "./", "/", "~", "..")) and not Path(text).exists()


def recipe_of(argv: list[str]) -> dict:
    """The recipe a ``train RECIPE overrides...`` argv names, overrides applied (not validated)."""
    from anchored_reasoning.train.recipes import apply_overrides, load_recipe

    overrides = [a for a in argv[3:] if "=" in a and not a.startswith("-")]
    return apply_overrides(load_recipe(argv[2]), overrides)


def why_not_train(recipe: dict) -> str:
    """Why a recipe cannot train on a CPU in seconds ('' when it can)."""
    model, training = recipe.get("model") or {}, recipe.get("training") or {}
    if is_hub_id(model.get("name")):
        return f"downloads {model['name']} from the Hub"
    if training.get("use_vllm"):
        return "generates with vLLM (GPU)"
    if model.get("preset") in ("paper", "gpt2-124m"):
        return f"the paper-size {model['preset']} model (GPU)"
    return ""


def _outputs(argv: list[str]) -> list[str]:
    outs = [v for f in ("--out", "--workdir", "--output-dir") if (v := flag_value(argv, f))]
    outs += [a.split("=", 1)[1] for a in argv if a.startswith("output_dir=")]
    return outs


def classify(path: str, cmd: Command, promised: dict[str, int]) -> Step:
    argv = strip_wrappers(cmd.argv)
    step = Step(path, cmd.line, "parse", "error", argv=argv)
    head = argv[0] if argv else ""
    if head == "anchored-reasoning":
        return _classify_cli(step, promised)
    if head == "python" and argv[1:2] == ["-m"] and len(argv) > 2:
        module = argv[2]
        step.label = module
        if module == "anchored_reasoning.generators":
            step.action, step.kind = "run", "module"
        elif module == "pip":
            step.kind, step.argv = "pip", ["pip", *argv[3:]]
        elif module == "pytest":
            step.kind, step.note = "file", "pytest: the paths it names exist"
        else:
            step.kind = "module-parse"
            step.note = "a benchmark or research script (minutes to hours): parsed by its own argparse parser"
        return step
    if head in ("make", "pip", "bash", "accelerate", "torchrun"):
        step.label = " ".join(argv[:2])
        if head == "make":
            step.kind = "make"
        elif head == "pip":
            step.kind = "pip"
        elif head == "bash":
            step.kind, step.note = "bash-script", "the script exists and `bash -n` reads it"
        else:
            inner = argv[argv.index("-m") + 1:] if "-m" in argv else []
            inner = strip_wrappers(["python", "-m", *inner]) if inner else []
            step.kind, step.action, step.argv = "dry-run", "dry-run", [*inner, "--dry-run"]
            step.note = f"{head} starts several processes (tests/test_ddp.py, test_fsdp.py run them on a CPU)"
            config = flag_value(argv, "--config_file")
            if config and not (ROOT / config).is_file():
                step.kind, step.note = "error", f"--config_file {config} does not exist"
            if inner[:2] != ["anchored-reasoning", "train"]:
                step.kind, step.note = "error", f"{head}: no `-m anchored_reasoning.cli train ...` to validate"
            step.label = f"{head}-train-{inner[2] if len(inner) > 2 else ''}"
        return step
    step.note = f"tests/doc_blocks.py has no rule for the command {head!r}: add one"
    step.label = head
    return step


def _needs_unmade_input(argv: list[str], promised: dict[str, int]) -> str:
    for a in argv:
        value = a.split("=", 1)[1] if "=" in a and not a.startswith("-") else a
        for out, line in promised.items():
            if value == out or value.startswith(out.rstrip("/") + "/"):
                return f"its input {value} comes from line {line}, which is not run here"
    return ""


def _classify_cli(step: Step, promised: dict[str, int]) -> Step:
    argv = step.argv
    sub = argv[1] if len(argv) > 1 else ""
    step.label, step.kind = sub, "cli"
    unmade = _needs_unmade_input(argv[2:], promised)
    if sub == "train":
        step.label = f"train-{argv[2] if len(argv) > 2 else ''}"
        try:
            why = why_not_train(recipe_of(argv)) if len(argv) > 2 else ""
            step.outputs = [str(recipe_of(argv).get("output_dir") or "")] if why or unmade else []
        except Exception as exc:  # the dry-run reports it with the library's message
            why = f"the recipe does not load ({type(exc).__name__})"
        if "--dry-run" in argv:
            why = why or "the block asks for --dry-run"
        why = why or unmade
        if why:
            step.action, step.kind, step.note = "dry-run", "dry-run", why
            step.argv = argv if "--dry-run" in argv else [*argv, "--dry-run"]
        else:
            step.action = "run"
        return step
    if sub == "serve":
        step.action, step.kind = "parse", "argparse"
        step.note = "starts a server: tests/test_serve.py starts `anchored-reasoning serve` and stops it"
        return step
    if sub == "eval":
        backend = flag_value(argv, "--backend")
        suite = argv[2] if len(argv) > 2 and not argv[2].startswith("-") else None
        if backend == "vllm":
            step.action, step.kind = "parse", "argparse"
            step.note = "starts a vLLM engine (minutes on a CPU): tests/test_vllm_backend.py runs the backend"
        elif backend == "openai" or (suite and _suite_backend(suite) == "openai"):
            step.action = RUN_STUB
            step.note = "against a stub OpenAI-compatible server (tests/test_serve.py runs real servers)"
        elif is_hub_id(flag_value(argv, "--model")):
            step.action, step.kind = "parse", "argparse"
            step.note = f"needs {flag_value(argv, '--model')} from the Hub"
        else:
            step.action = "run"
        if unmade and step.action != "parse":
            step.action, step.kind, step.note = "parse", "argparse", unmade
        if step.action == "parse":
            step.outputs = _outputs(argv)
        step.label = f"eval-{suite or flag_value(argv, '--task') or ''}"
        return step
    if unmade:
        step.action, step.kind, step.note = "parse", "argparse", unmade
        step.outputs = _outputs(argv)
        return step
    step.action = "run" if sub in ("tasks", "models", "compare", "ppl", "demo") else "parse"
    if step.action == "parse":
        step.kind = "argparse"
        step.note = f"no rule to run `anchored-reasoning {sub}`: parsed only"
    return step


def _suite_backend(name: str) -> str | None:
    import yaml

    for cand in (Path(name), ROOT / "eval" / f"{name}.yaml", ROOT / "eval" / name):
        if cand.is_file():
            return (yaml.safe_load(cand.read_text()) or {}).get("backend")
    return None


def plan_file(path: str, check_only: dict[str, str]) -> list[Step]:
    """Every step of one Markdown file, in reading order."""
    steps: list[Step] = []
    promised: dict[str, int] = {}
    for block in fenced_blocks(path):
        lang = CODE_LANGS.get(block.lang)
        if lang == "python":
            reason = next((why for snippet, why in check_only.items() if snippet in block.text), "")
            reason = reason or _needs_unmade_input(re.findall(r"[\"']([^\"'\s]+)[\"']", block.text), promised)
            action = "check" if reason else "python"
            steps.append(Step(path, block.line, action, "python", code=block.text, note=reason,
                              label="python" if reason else ""))
        elif lang == "bash":
            try:
                commands = bash_commands(block)
            except ValueError as exc:
                steps.append(Step(path, block.line, "error", "error", note=str(exc)))
                continue
            for cmd in commands:
                step = classify(path, cmd, promised)
                if step.action not in ("run", RUN_STUB) and not step.outputs:
                    step.outputs = _outputs(step.argv)
                for out in step.outputs if step.action not in ("run", RUN_STUB) else []:
                    if out:
                        promised[out.rstrip("/")] = step.line
                steps.append(step)
    seen: dict[str, int] = {}
    for step in steps:  # a loop's commands share a line: number them
        seen[step.id] = seen.get(step.id, 0) + 1
        if seen[step.id] > 1:
            step.label += f"#{seen[step.id]}"
    return steps


# ---------------------------------------------------------------- RESULTS.md command lines

_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
_COMMAND_START = re.compile(r"^(?:[A-Z_]+=\S+\s+)*(anchored-reasoning|python -m|make|bash)\s+\S")
PLACEHOLDER = re.compile(r"^([A-Z]{1,3}|DIR)$|[<>]|\.\.\.")  # `--seed S`, `--run <run>`, `...`


def results_commands(path: str = "RESULTS.md") -> list[tuple[int, str, list[str]]]:
    """(line, text, argv) of every code span in RESULTS.md that starts with a command."""
    text = (ROOT / path).read_text()
    out = []
    for para_start, para in _paragraphs(text):
        for m in _SPAN.finditer(para):
            body = " ".join(m.group(2).split())
            if not _COMMAND_START.match(body):
                continue
            line = para_start + para[: m.start()].count("\n")
            try:
                argv = shlex.split(body)
            except ValueError:
                argv = body.split()
            while argv and re.match(r"^[A-Z_]+=", argv[0]):
                argv = argv[1:]
            out.append((line, body, argv))
    return out


def _paragraphs(text: str):
    start = 1
    for chunk in re.split(r"(\n\s*\n)", text):
        if chunk.strip():
            yield start, chunk
        start += chunk.count("\n")


def has_placeholders(argv: list[str]) -> bool:
    return any(PLACEHOLDER.search(a) for a in argv[2:])


def results_steps(path: str = "RESULTS.md") -> list[Step]:
    """One parse/dry-run step per command line quoted in RESULTS.md (benchmarks are not run: their
    figures are recorded there)."""
    steps = []
    for line, _text, argv in results_commands(path):
        placeholders = has_placeholders(argv)
        # `...` elides arguments (kept as the value of an option it follows) and `[x]` marks an optional one
        argv = strip_wrappers([a[1:-1] if a.startswith("[") and a.endswith("]") else a for i, a in enumerate(argv)
                               if a != "..." or argv[i - 1].startswith("--")])
        step = Step(path, line, "parse", "error", argv=argv, label=" ".join(argv[:2]))
        if argv[0] == "anchored-reasoning":
            sub = argv[1] if len(argv) > 1 else ""
            step.kind, step.label = "argparse", f"{sub}-{argv[2]}" if sub == "train" else sub
            if sub == "train" and not placeholders:
                step.action, step.kind, step.argv = "dry-run", "dry-run", [*argv, "--dry-run"]
        elif argv[:2] == ["python", "-m"]:
            step.kind = "file" if argv[2] == "pytest" else "module-parse"
            step.label = argv[2]
            step.note = "--help only: the line holds placeholders" if placeholders else ""
        elif argv[0] == "make":
            step.kind = "make"
        elif argv[0] == "bash":
            step.kind = "bash-script"
        steps.append(step)
    seen: dict[str, int] = {}
    for step in steps:
        seen[step.id] = seen.get(step.id, 0) + 1
        if seen[step.id] > 1:
            step.label += f"#{seen[step.id]}"
    return steps
