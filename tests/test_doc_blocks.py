"""Every command and Python block in README.md and docs/*.md runs in the suite at its smallest settings, or,
where it cannot run here, is checked as far as it can be; every command line quoted in RESULTS.md parses.
So no documented command can rot unnoticed.

Code blocks are ```bash / ```sh / ```shell and ```python. ```console / ```text and untagged blocks are
output or layout shown to the reader (test_output_blocks_hold_no_commands keeps commands out of them);
```yaml / ```json are configuration (a complete training recipe shown in a doc is validated).

Bash itself reads each bash block (continuations, quotes, variables, loops, ``&``) with an empty PATH, so
every command is recorded, not run (tests/doc_blocks.py). One test per command, its id
``FILE:LINE-ACTION-WHAT``, ACTION saying what was done (tests/doc_runner.py does it):

run      run for real at its smallest settings in the file's working directory. A file's steps share one
         directory and run in order, so a later command reads what an earlier one wrote (selecting one
         test runs the steps before it first). $ANCHORED_REASONING_DATA comes from the environment (without
         it these tests skip, saying so), the Hub is offline. Rewrites:
           train RECIPE ...   + training.max_steps=2 (16 with a curriculum, its floor 1 step a stage; GRPO 1),
                              batch 4 (GRPO: 2 x 2 generations, 8 completion tokens), generation eval 2
                              samples x 8 tokens, data sections 16 train / 4 valid problems (n, each mix
                              entry, or limit), data.ppl_max_blocks=2 where the recipe has it
           eval ...           --limit 2; --max-new-tokens 8 unless the command sets it
           ppl ... --limit N  --limit 2
           demo ...           + --budget-minutes 0.1 --train-n 64 --eval-n 6 --real-n 0 --no-probe --methods cot
                              --workers 1
           python -m anchored_reasoning.generators ... --n 8
         corpora/*.txt in the directory hold the first 40 kB of the data folder's corpora (relative corpus
         paths resolve there first). The same `train` command in two files trains once (when its recipe
         reads nothing from the directory); the second file gets the files it wrote.
stub     an `eval` on the openai backend (or the openai suite `baselines`) runs for real against a stub
         OpenAI-compatible server on loopback, --base-url rewritten (real servers: tests/test_serve.py).
dry-run  `train ... --dry-run` (recipe and overrides validated, nothing trained) where training cannot run
         here: the recipe downloads from the Hub (prosqa_/prontoqa_/gsm8k_gpt2_*: openai-community/gpt2;
         grpo_gsm8k_qwen25: Qwen2.5-0.5B), generates with vLLM (grpo_gsm8k_smollm2) or builds the paper-size
         model (diffusion_pretrain_paper_*); the train part of `accelerate launch` and `torchrun` lines
         (their --config_file must exist; tests/test_ddp.py and test_fsdp.py launch them on a CPU); a
         command whose input comes from a step that is not run.
parse    not run, checked as far as possible: `anchored-reasoning serve` and `eval --backend vllm` parse with
         the CLI's parser (tests/test_serve.py, test_vllm_backend.py run them); `python -m benchmarks.X` /
         `research.X.Y` (benchmarks and studies: minutes to hours) parse their whole command line with the
         module's own parser, or run --help where the line holds placeholders (`--seed S`, `<run>`, `...`);
         `make T`: make -n T; `pip install`: this project and extras it declares; `pip download`: pins
         equal the installed versions; `bash SCRIPT`: exists, bash -n; `pytest PATHS`: the paths exist.
python   a Python block, run in a fresh namespace in the file's directory (by a worker process that keeps
         torch imported); a static check for undefined names runs first, so blocks must be self-contained.
check    a Python block that needs a GPU, the Hub or a server (CHECK_ONLY), or reads a folder that only a step
         not run here writes: undefined names checked, its imports run.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doc_blocks import (DOC_FILES, PLACEHOLDER, ROOT, RUN_STUB, CODE_LANGS, Step, bash_commands,  # noqa: E402
                        fenced_blocks, plan_file, results_steps)
from doc_runner import (Result, StubServer, Worker, cli_parse_error, copy_outputs, make_workspace,  # noqa: E402
                        pip_check, reads_workspace, small_argv, snapshot, static_check)

CHECK_ONLY = {  # a snippet of the block -> why it cannot run here
    '"GSAI-ML/LLaDA-8B-Instruct"': "loads LLaDA-8B from the Hub",
    "lm_eval.simple_evaluate(": "lambada_openai comes from the Hub",
    "serve_model(": "starts `transformers serve` (tests/test_serve.py runs serve_model)",
}
DATA = os.environ.get("ANCHORED_REASONING_DATA")
PLANS = {path: plan_file(path, CHECK_ONLY) for path in DOC_FILES}
PLANS["RESULTS.md"] = results_steps()
WRITES = ("run", RUN_STUB, "python")
# a dry-run loads nothing, so a Hub model it names need not be in the cache: the check that refuses an
# uncached Hub id offline stays off (nothing is downloaded either way)
ONLINE = {"HF_HUB_OFFLINE": None, "TRANSFORMERS_OFFLINE": None}
STATIC = ("make", "pip", "file", "bash-script", "argparse", "error")


class DocSession:
    """The working directories, the worker and the stub server, and every step's result."""

    def __init__(self, root: Path):
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "TOKENIZERS_PARALLELISM": "false",
               "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}
        self.root, self.worker, self.stub = root, Worker(env), StubServer()
        self.results: dict[str, Result] = {}
        self.workspaces: dict[str, Path] = {}
        self.trained: dict[tuple[str, ...], tuple[Path, list[str]]] = {}

    def close(self) -> None:
        self.worker.close()
        self.stub.close()

    def workspace(self, path: str) -> Path:
        if path not in self.workspaces:
            ws = self.root / re.sub(r"\W+", "_", path)
            make_workspace(ws, DATA)
            self.workspaces[path] = ws
        return self.workspaces[path]

    def check(self, step: Step) -> Result:
        if step.in_workspace:  # what this step reads was written by the file's earlier steps
            for earlier in PLANS[step.path]:
                if earlier is step:
                    break
                if earlier.action in WRITES and earlier.id not in self.results:
                    self.results[earlier.id] = self._execute(earlier)
        if step.id not in self.results:
            self.results[step.id] = self._execute(step)
        result = self.results[step.id]
        failed = [s.id for s in PLANS[step.path] if s is not step and s.action in WRITES and s.id in self.results
                  and not self.results[s.id].ok and s.line < step.line]
        if not result.ok and failed and step.in_workspace:
            return Result(False, f"{result.message}\n(earlier steps of this file failed: {failed})")
        return result

    def _execute(self, step: Step) -> Result:
        if step.kind in STATIC:
            message = static_check(step)
            return Result(not message, message or step.note)
        ws = self.workspace(step.path)
        if step.kind == "module-parse":
            args = ["--help"] if step.note.startswith("--help") or any(PLACEHOLDER.search(a) for a in step.argv[3:]) \
                else step.argv[3:]
            return self._call(step, {"kind": "module-parse", "module": step.argv[2], "argv": args,
                                     "lenient": step.path == "RESULTS.md"})
        if step.kind == "python":
            undefined = undefined_names(step)
            if undefined:
                return Result(False, f"the block is not self-contained (define these in it):\n{undefined}")
            kind = "python" if step.action == "python" else "imports"
            return self._call(step, {"kind": kind, "code": step.code, "line": step.line, "path": step.path, "cwd": str(ws)})
        if step.kind == "dry-run":
            return self._call(step, {"kind": "cli", "argv": step.argv[1:], "cwd": str(ws), "env": ONLINE})
        argv = small_argv(step, self.stub.url if step.action == RUN_STUB else None)
        key = tuple(argv) if argv[1:2] == ["train"] and not reads_workspace(argv) else None
        if key in self.trained:
            source, paths = self.trained[key]
            if source != ws and copy_outputs(source, ws, paths):
                return Result(True, f"the same command trained in {source.name}; its files copied here")
        before = snapshot(ws)
        if argv[0] == "anchored-reasoning":
            result = self._call(step, {"kind": "cli", "argv": argv[1:], "cwd": str(ws)}, shown=argv)
        else:
            result = self._call(step, {"kind": "module", "module": argv[2], "argv": argv[3:], "cwd": str(ws)}, shown=argv)
        if result.ok and key:
            after = snapshot(ws)
            self.trained[key] = (ws, [p for p, stat in after.items() if before.get(p) != stat])
        return result

    def _call(self, step: Step, request: dict, shown: list[str] | None = None) -> Result:
        reply = self.worker.call(request)
        what = " ".join(shown or step.argv) if (shown or step.argv) else f"the Python block at {step.path}:{step.line}"
        if reply["rc"] == 0:
            return Result(True, f"{what} ({reply['seconds']} s) {step.note}", reply["seconds"])
        return Result(False, f"{what}\nexit status {reply['rc']} after {reply['seconds']} s; output:\n{reply['output'][-6000:]}")


def undefined_names(step: Step) -> str:
    """Names a Python block uses without defining or importing them (ruff's F821)."""
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache", "--select", "F821",
                           "--output-format", "concise", "--stdin-filename", f"{step.path}.py", "-"],
                          input="\n" * (step.line - 1) + step.code, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        return f"ruff could not check the block: {proc.stderr.strip()[-500:]}"
    return "\n".join(line for line in proc.stdout.splitlines() if "F821" in line)


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    s = DocSession(tmp_path_factory.mktemp("doc-blocks"))
    yield s
    s.close()


def _params(steps: list[Step]):
    for step in steps:
        slow = step.kind not in STATIC
        yield pytest.param(step, id=step.id, marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("step", list(_params([s for path in DOC_FILES for s in PLANS[path]])))
def test_doc_block(step: Step, session: DocSession):
    if step.action in WRITES and not DATA:
        pytest.skip("ANCHORED_REASONING_DATA is not set: the documented commands read the benchmark files and "
                    "corpora from it (make test sets it)")
    result = session.check(step)
    assert result.ok, result.message


@pytest.mark.parametrize("step", list(_params(PLANS["RESULTS.md"])))
def test_results_command_line_parses(step: Step, session: DocSession):
    result = session.check(step)
    assert result.ok, result.message


def test_output_blocks_hold_no_commands():
    """A command in a block that is not code would escape these tests: tag it bash (or console if it is a
    transcript of output)."""
    command = re.compile(r"^\s*(\$ )?([A-Z_]+=\S+ )*(anchored-reasoning \w|python3? -m |make \w|pip install |accelerate launch |torchrun )")
    found = [f"{b.path}:{b.line} ({b.lang or 'untagged'}): {line.strip()}" for path in DOC_FILES
             for b in fenced_blocks(path) if b.lang not in CODE_LANGS and b.lang not in ("yaml", "json")
             for line in b.text.splitlines() if command.match(line)]
    assert not found, "commands in blocks that are not run:\n" + "\n".join(found)


def test_every_check_only_entry_names_one_block():
    for snippet in CHECK_ONLY:
        hits = [b for path in DOC_FILES for b in fenced_blocks(path) if b.lang == "python" and snippet in b.text]
        assert len(hits) == 1, f"CHECK_ONLY entry {snippet!r} matches {len(hits)} Python blocks: update the table"


RECIPE_BLOCKS = [b for path in DOC_FILES for b in fenced_blocks(path)
                 if b.lang == "yaml" and re.search(r"^trainer:", b.text, re.M) and "..." not in b.text]


@pytest.mark.slow
@pytest.mark.parametrize("block", RECIPE_BLOCKS, ids=[f"{b.path}:{b.line}-dry-run-recipe" for b in RECIPE_BLOCKS])
def test_recipe_shown_in_a_doc_validates(block, session: DocSession, tmp_path):
    recipe = yaml.safe_load(block.text)
    if recipe.get("extends"):
        recipe["extends"] = str(ROOT / "train" / recipe["extends"])
    path = tmp_path / "shown.yaml"
    path.write_text(yaml.safe_dump(recipe))
    reply = session.worker.call({"kind": "cli", "argv": ["train", str(path), "--dry-run"], "cwd": str(tmp_path),
                                 "env": ONLINE})
    assert reply["rc"] == 0, reply["output"][-4000:]


# ---------------------------------------------------------------- the harness itself

def test_fences_inside_list_items_are_blocks_and_inline_fences_are_not(tmp_path, monkeypatch):
    import doc_blocks

    doc = tmp_path / "x.md"
    doc.write_text("A ```` ```python ```` fence.\n\n- item:\n\n  ```python\n  x = 1\n  ```\n\n```\ntree\n```\n")
    monkeypatch.setattr(doc_blocks, "ROOT", tmp_path)
    blocks = fenced_blocks("x.md")
    assert [(b.line, b.lang, b.text) for b in blocks] == [(6, "python", "x = 1\n"), (10, "", "tree\n")]


def test_bash_reads_a_block_as_a_shell_would():
    from doc_blocks import Block

    text = ('M=~/m\nOMP_NUM_THREADS=1 nice -n 10 anchored-reasoning eval --model $M \\\n    --out "a b"  # note\n'
            'anchored-reasoning serve m &\nfor T in x y; do\n  make $T\ndone\nwait\n')
    cmds = [(c.line, c.argv) for c in bash_commands(Block("doc.md", 5, "bash", text))]
    home = str(Path.home())
    assert cmds == [(6, ["nice", "-n", "10", "anchored-reasoning", "eval", "--model", f"{home}/m", "--out", "a b"]),
                    (8, ["anchored-reasoning", "serve", "m"]), (10, ["make", "x"]), (10, ["make", "y"])]


def test_small_settings_shrink_a_recipe_and_an_eval():
    step = Step("d.md", 1, "run", "cli", argv=["anchored-reasoning", "train", "prosqa_search_cpu", "output_dir=runs/x"])
    argv = small_argv(step)
    assert argv[:4] == step.argv and "training.max_steps=2" in argv
    assert any(a.startswith("data.train.mix=") and '"n": 5' in a for a in argv)
    step = Step("d.md", 1, "run", "cli", argv=["anchored-reasoning", "eval", "--task", "gsm8k", "--limit", "50"])
    assert small_argv(step, "http://s/v1")[2:] == ["--task", "gsm8k", "--limit", "2", "--max-new-tokens", "8",
                                                   "--base-url", "http://s/v1"]


def test_static_checks_catch_a_rotted_command():
    assert "--no-such-flag" in cli_parse_error(["eval", "--task", "gsm8k", "--no-such-flag"])
    assert cli_parse_error(["train", "tiny_test", "--quiet", "training.max_steps=1"]) == ""  # overrides after options
    assert "make" in static_check(Step("d.md", 1, "parse", "make", argv=["make", "no-such-target"]))
    assert "extras" in pip_check(["pip", "install", "-e", ".[no-such-extra]"])
    assert pip_check(["pip", "install", "-e", ".[dev]"]) == ""


@pytest.mark.slow
def test_the_worker_parses_without_running_and_names_the_markdown_line(session: DocSession, tmp_path):
    argv = ["prosqa", "--n", "3", "--out", str(tmp_path / "p.json")]
    bad = session.worker.call({"kind": "module-parse", "module": "anchored_reasoning.generators", "argv": [*argv, "--bogus"]})
    assert bad["rc"] == 2 and "--bogus" in bad["output"]
    good = session.worker.call({"kind": "module-parse", "module": "anchored_reasoning.generators", "argv": argv})
    assert good["rc"] == 0 and not (tmp_path / "p.json").exists()  # parsed, not run
    block = session.worker.call({"kind": "python", "code": "x = 1\nraise ValueError('boom')\n", "line": 10,
                                 "path": "docs/x.md", "cwd": str(tmp_path)})
    assert block["rc"] == 1 and 'File "docs/x.md", line 11' in block["output"]
