"""Long work shows progress (issue 49 item 4): backends report per step and per finished sample, the eval
bar moves inside a batch, ppl has a bar, train.log holds the whole run's log lines, GRPO recipes keep the
bar, the demo draws one line per method, and --quiet hides the model-loading bars."""
from __future__ import annotations

import json
import logging
import re
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from anchored_reasoning.types import Completion, Prompt, SamplingSpec
from test_ppl import ckpt  # noqa: F401 - the saved tiny MDLM fixture (tests/ is on sys.path)

torch.set_num_threads(1)

PROMPTS = [Prompt("Question: Natalia sold clips"), Prompt("def add(a, b):"), Prompt("Every wumpus is a tumpus."),
           Prompt("0 1 2"), Prompt("The quick brown fox")]


def _lines(err: str, prefix: str) -> list[str]:
    """The redraws of one bar (tqdm moves the cursor between fixed-position lines with ANSI codes)."""
    plain = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "\n", err).replace("\r", "\n")
    return [line for line in plain.splitlines() if line.startswith(prefix)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from anchored_reasoning.testing import make_tiny_causal_lm

    return str(make_tiny_causal_lm(tmp_path_factory.mktemp("tiny")))


# --------------------------------------------------------------------------------------------- backends

@pytest.mark.parametrize("spec", [
    SamplingSpec(max_new_tokens=12, temperature=1.0, n=2, seed=3, stop=["a"]),  # rows stop at different steps
    SamplingSpec(max_new_tokens=10, n=3),  # greedy: one row stands for its prompt's 3 samples
], ids=["sampled-stops", "greedy-n3"])
def test_hf_backend_reports_tokens_per_step_and_each_finished_sample_without_changing_texts(tiny, spec):
    from anchored_reasoning.backends.hf import HFBackend

    backend = HFBackend(tiny, batch_size=4, device="cpu")
    calls: list[tuple[int, int]] = []
    reported = backend.generate(PROMPTS, spec, on_progress=lambda done, tokens: calls.append((done, tokens)))
    plain = backend.generate(PROMPTS, spec)
    assert [[c.text for c in s] for s in reported] == [[c.text for c in s] for s in plain]
    assert sum(d for d, _ in calls) == len(PROMPTS) * spec.n
    assert sum(t for _, t in calls) == sum(c.n_tokens for s in reported for c in s)
    assert len(calls) >= spec.max_new_tokens  # one report per decoding step, not per batch
    if spec.stop:
        assert len([d for d, _ in calls if d]) > 2  # samples finish one by one, not once per batch of 4


def test_diffusion_backend_reports_each_denoising_step_without_changing_texts(ckpt):  # noqa: F811
    from anchored_reasoning.backends import get_backend

    backend = get_backend("diffusion", str(ckpt), steps=8, batch_size=2, device="cpu")
    spec = SamplingSpec(max_new_tokens=8, n=2)
    calls: list[tuple[int, int]] = []
    reported = backend.generate(PROMPTS[:3], spec, on_progress=lambda done, tokens: calls.append((done, tokens)))
    plain = backend.generate(PROMPTS[:3], spec)
    assert [[c.text for c in s] for s in reported] == [[c.text for c in s] for s in plain]
    assert sum(d for d, _ in calls) == 3 * 2
    token_calls = [t for d, t in calls if t]
    assert len(token_calls) >= 8 and sum(token_calls) == 2 * 3 * 8  # every position of both batches, step by step


def test_backends_without_the_keyword_are_called_as_before():
    from anchored_reasoning.backends import generate_with_progress, takes_progress

    class Old:
        def generate(self, prompts, spec):
            return [[Completion("x", 1, 0.0, "stop")] for _ in prompts]

    assert not takes_progress(Old())
    assert generate_with_progress(Old(), PROMPTS[:2], SamplingSpec(), lambda d, t: None)[1][0].text == "x"


# --------------------------------------------------------------------------------------------- eval bar

class ReportingBackend:
    """Finishes its prompts one at a time and says so (the runner's FakeBackend answers otherwise)."""

    name = "fake"
    batch_size = 8

    def __init__(self):
        from test_runner import FakeBackend  # tests/ is on sys.path under pytest

        self.inner = FakeBackend(batch_size=8)

    def describe(self):
        return self.inner.describe()

    def generate(self, prompts, spec, *, on_progress=None):
        for _ in prompts:
            time.sleep(0.01)
            if on_progress is not None:
                on_progress(1, 3)
        return self.inner.generate(prompts, spec)


def test_the_eval_bar_advances_per_finished_sample_inside_a_batch(tmp_path, capsys):
    from anchored_reasoning.eval.runner import run_eval
    from anchored_reasoning.methods.prompting import NoCoT
    from test_runner import FakeTask

    run_eval(FakeTask(count=8), ReportingBackend(), NoCoT(), out_dir=tmp_path / "e", progress=True)
    gen = _lines(capsys.readouterr().err, "fake/nocot generate")
    shown = {line.split("|")[2].split()[0] for line in gen}
    assert {"1/8", "4/8", "7/8", "8/8"} <= shown  # one batch of 8, yet the bar moved sample by sample
    assert all("tok/s" in line for line in gen if "|" in line and not line.split("|")[2].startswith(" 0/8"))


def test_phase_bars_keep_the_recorded_count_when_live_reports_overshoot(capsys):
    from anchored_reasoning.eval.progress import PhaseBars

    bars = PhaseBars(total=6, done=2, records=[], name="t", show=True)
    bars.live(3, 30)
    bars.live(5, 10)  # more than the 4 samples left: never past the total
    shown = [line.split("|")[2].split()[0] for line in _lines(capsys.readouterr().err, "t generate")]
    assert shown[-2:] == ["5/6", "6/6"]
    bars.generated(3, 40, 1.0)  # the runner recorded 3 (a resumed example's other samples were there)
    bars.close()
    assert _lines(capsys.readouterr().err, "t generate")[-1].split("|")[2].split()[0] == "5/6"


# --------------------------------------------------------------------------------------------- ppl

def test_ppl_shows_a_bar_over_the_blocks_and_scores_the_same(ckpt, capsys):  # noqa: F811
    from anchored_reasoning.commands.ppl import evaluate_text_file, load_model_and_tokenizer
    from anchored_reasoning.train.data.diffusion_data import pack_token_blocks, read_text_documents, tokenize_documents

    model, tok, _ = load_model_and_tokenizer(str(ckpt))
    slow = model.register_forward_pre_hook(lambda *_: time.sleep(0.15))  # each batch past tqdm's redraw interval
    shown = evaluate_text_file(model, tok, ckpt / "corpus.txt", seq_len=32, t_samples=2, batch_size=3)
    slow.remove()
    bars = _lines(capsys.readouterr().err, "ppl:")
    quiet = evaluate_text_file(model, tok, ckpt / "corpus.txt", seq_len=32, t_samples=2, batch_size=3, progress=False)
    blocks = len(pack_token_blocks(tokenize_documents(tok, read_text_documents(ckpt / "corpus.txt")), 32, keep_last=True))
    assert shown == quiet and blocks > 3
    assert bars and f"{blocks}/{blocks}" in bars[-1] and any(f"| 3/{blocks}" in b for b in bars)  # batch by batch
    assert not _lines(capsys.readouterr().err, "ppl:")
    assert not model._forward_hooks  # the bar's hook is gone


# --------------------------------------------------------------------------------------------- training

@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    """A tiny CoT run without a curriculum: nothing of the library logs while it trains."""
    from anchored_reasoning.train import get_trainer

    return get_trainer("ar")("tiny_test", ["method.name=cot", "training.curriculum=false",
                                           "training.generation_eval=false",
                                           f"output_dir={tmp_path_factory.mktemp('sft') / 'run'}"])


def test_train_log_holds_the_whole_runs_lines_without_a_curriculum(sft):
    from anchored_reasoning.train.callbacks.progress import TRAIN_LOG

    out = sft
    text = (out / TRAIN_LOG).read_text()
    assert "anchored_reasoning.train.pipelines.ar: data: 32 train" in text  # before training
    assert "model: 0.03M parameters" in text and f"saved {out}" in text  # after training
    assert not logging.getLogger("anchored_reasoning").handlers  # nothing left behind


def test_run_log_holds_lines_until_the_folder_is_known_and_keeps_the_console_level(tmp_path, capsys):
    from anchored_reasoning.train.callbacks.progress import TRAIN_LOG, console_logging, run_log

    log = logging.getLogger("anchored_reasoning.somewhere")
    console = logging.StreamHandler(sys.stderr)
    root = logging.getLogger()
    root.addHandler(console)
    level = root.level
    root.setLevel(logging.WARNING)
    try:
        with run_log():
            log.info("before training")
            with console_logging(tmp_path):
                log.info("during training")
            log.info("after training")
            log.warning("a warning")
        log.info("after the run")
    finally:
        root.removeHandler(console)
        root.setLevel(level)
    text = (tmp_path / TRAIN_LOG).read_text()
    assert [w in text for w in ("before training", "during training", "after training", "a warning", "after the run")] \
        == [True, True, True, True, False]
    err = capsys.readouterr().err
    assert "a warning" in err and "training" not in err  # the console still shows warnings only
    assert not console.filters and logging.getLogger("anchored_reasoning").level == logging.NOTSET


def test_grpo_recipes_that_run_for_minutes_show_the_bar():
    recipes = sorted(Path(__file__).resolve().parents[1].joinpath("train").glob("grpo_*.yaml"))
    long = [p for p in recipes if "tiny" not in p.stem]
    assert len(long) >= 4
    for path in long:
        training = yaml.safe_load(path.read_text()).get("training") or {}
        assert not training.get("disable_tqdm"), path.name


def test_grpo_training_shows_the_librarys_bar(sft, tmp_path, capsys):
    from anchored_reasoning.train import get_trainer

    get_trainer("grpo")("grpo_tiny_test", [f"model.name={sft}", "training.disable_tqdm=false",
                                           f"output_dir={tmp_path / 'grpo'}"])
    bars = _lines(capsys.readouterr().err, "train:")
    assert bars and "2/2" in bars[-1]


# --------------------------------------------------------------------------------------------- demo

def test_demo_lines_show_minutes_of_the_budget_not_the_step_ceiling(tmp_path):
    from anchored_reasoning.demo_report import status_line

    log = tmp_path / "train_log.jsonl"
    log.write_text(json.dumps({"event": "train_begin", "step": 0, "max_steps": 1_000_000}) + "\n"
                   + json.dumps({"step": 431, "loss": 0.5123, "epoch": 0.4}) + "\n" + '{"step": 45')  # a line being written
    now = 1000.0
    train = status_line("cot", {"phase": "train", "since": now - 96, "limit_s": 258, "log": str(log)}, now)
    assert "1.6/4.3 min" in train and "step 431" in train and "loss 0.512" in train and "1000000" not in train
    assert "418/486 samples" in status_line("acot", {"phase": "eval", "done": 418, "total": 486}, now)
    assert "accuracy 0.81" in status_line("pause", {"phase": "done", "accuracy": 0.81, "steps": 1203, "minutes": 5.1}, now)
    assert status_line("nocot", None, now).split() == ["nocot", "waiting"]


def test_demo_board_draws_one_line_per_method_from_the_workers_status(tmp_path, capsys):
    from concurrent.futures import ThreadPoolExecutor

    from anchored_reasoning.demo_report import MethodStatus, StatusBoard
    from test_runner import FakeBackend

    questions = [Prompt(f"Q: What is {i} doubled?") for i in range(5)]
    (tmp_path / "nocot").mkdir()
    (tmp_path / "nocot" / "status.json").write_text('{"phase": "done", "accuracy": 0.1, "steps": 1, "minutes": 1}')
    with StatusBoard(tmp_path, ["nocot", "cot"]) as board:  # a status left by an earlier run is removed
        status = MethodStatus(tmp_path / "cot", interval=0.0)
        status.set(phase="eval", done=0, total=9)
        watched = status.watch(ReportingBackend())
        assert watched.describe() == ReportingBackend().describe() and watched.batch_size == 8
        reports: list[int] = []
        with ThreadPoolExecutor(1) as pool:
            job = pool.submit(watched.generate, questions, SamplingSpec(max_new_tokens=4),
                              on_progress=lambda d, t: reports.append(d))
            board.follow([job], every=0.01)
        assert reports == [1] * 5 and json.loads(status.path.read_text())["done"] == 5
        status.watch(FakeBackend()).generate(questions[:2], SamplingSpec(max_new_tokens=4, n=2))  # counted at the end
        assert json.loads(status.path.read_text())["done"] == 9
    err = capsys.readouterr().err
    assert _lines(err, "nocot  waiting") and not _lines(err, "nocot  done")
    cot = [line.split("]")[-1].split()[0] for line in _lines(err, "cot    eval")]
    assert "9/9" in cot and len(set(cot)) >= 3  # drawn while the samples finished, then at the end


# --------------------------------------------------------------------------------------------- --quiet

def test_quiet_hides_the_model_loading_bars(tiny, capsys):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from anchored_reasoning.commands import quiet_console

    hf_logging.enable_progress_bar()  # whatever an earlier test in this process left (a quiet run turns it off)
    AutoModelForCausalLM.from_pretrained(tiny)
    assert "Loading weights" in capsys.readouterr().err  # the bar this test is about
    levels = [(h, h.level) for h in logging.getLogger().handlers]
    try:
        quiet_console()
        AutoModelForCausalLM.from_pretrained(tiny)
        assert "Loading weights" not in capsys.readouterr().err
    finally:
        hf_logging.enable_progress_bar()
        import huggingface_hub.utils

        huggingface_hub.utils.enable_progress_bars()
        for handler, level in levels:
            handler.setLevel(level)
