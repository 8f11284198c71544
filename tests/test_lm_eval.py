"""lm-eval support (anchored_reasoning/eval/lm_eval_model.py): the real ``lm_eval`` CLI on a tiny
diffusion model with local task YAMLs over offline data, checked against our own runner and ELBO."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("lm_eval", reason="the [lm-eval] extra is not installed")

from anchored_reasoning.errors import DataError  # noqa: E402
from anchored_reasoning.eval.lm_eval_model import AnchoredDiffusionLM, mc_elbo  # noqa: E402

torch.set_num_threads(1)

ITEMS = [
    {"id": f"q{i}", "question": q, "answer": a, "choices": c, "label": lab}
    for i, (q, a, c, lab) in enumerate([
        ("Every cat is an animal. Tom is a cat. Tom is", "an animal", ["an animal", "a stone"], 0),
        ("Two plus two is", "four", ["five", "four"], 1),
        ("The sky is", "blue", ["blue", "green", "loud"], 0),
        ("Water is", "wet", ["dry", "wet"], 1),
        ("Fire is", "hot", ["hot", "cold"], 0),
    ])
]
GEN_LEN = 6


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import anchored_reasoning.models  # noqa: F401
    from anchored_reasoning.models import ADLM, ADLMConfig
    from anchored_reasoning.tokenization import train_tiny_tokenizer

    root = tmp_path_factory.mktemp("lmeval")
    ckpt = root / "tiny_adlm"
    tok = train_tiny_tokenizer(ckpt, texts=[i["question"] + " " + i["answer"] for i in ITEMS], vocab_size=300)
    torch.manual_seed(0)
    cfg = ADLMConfig.from_preset("tiny", vocab_size=len(tok), mask_token_id=tok.mask_token_id, pad_token_id=tok.pad_token_id,
                                 eos_token_id=tok.eos_token_id, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                 max_position_embeddings=48)
    ADLM(cfg).save_pretrained(ckpt)
    data = root / "data"
    data.mkdir()
    with open(data / "items.jsonl", "w") as f:
        for it in ITEMS:
            f.write(json.dumps(it) + "\n")
    tasks = root / "tasks"
    tasks.mkdir()
    common = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data / 'items.jsonl'}\ntest_split: test\n"
    (tasks / "tiny_mc.yaml").write_text(
        "task: tiny_mc\n" + common + "output_type: multiple_choice\ndoc_to_text: '{{question}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: label\nmetric_list:\n  - metric: acc\n")
    (tasks / "tiny_gen.yaml").write_text(
        "task: tiny_gen\n" + common + "output_type: generate_until\ndoc_to_text: '{{question}}'\n"
        f"doc_to_target: '{{{{answer}}}}'\ngeneration_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: {GEN_LEN}\n"
        "metric_list:\n  - metric: exact_match\n")
    (tasks / "tiny_ppl.yaml").write_text(
        "task: tiny_ppl\n" + common + "output_type: loglikelihood_rolling\ndoc_to_text: ''\n"
        "doc_to_target: '{{question}}'\nmetric_list:\n  - metric: word_perplexity\n")
    # our own runner's task over the same file: the prompt is the question, graded by exact match
    ours = root / "our_tasks"
    ours.mkdir()
    (ours / "tiny_gen_ours.yaml").write_text(
        "name: tiny_gen_ours\nsplits: [test]\ndata:\n  loader: fields\n  options: {question: question, answer: answer, id: id}\n"
        "  local: {test: items.jsonl}\nextractor: none\ngrader: exact\nprompts:\n  nocot: \"{question}\"\n"
        f"generation:\n  max_new_tokens: {GEN_LEN}\n  stop: [\"\\n\"]\nmetrics: [accuracy]\n")
    return {"root": root, "ckpt": ckpt, "tasks": tasks, "ours": ours, "tok": tok}


MODEL_ARGS = "sampler=low_confidence,steps={g},mc_num=8,mc_batch_size=8".format(g=GEN_LEN)


def run_cli(setup, tasks: str, extra_args: str = ""):
    out = setup["root"] / f"out_{tasks.replace(',', '_')}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "anchored_reasoning.eval.lm_eval_cli", "run", "--model", "anchored_diffusion",
           "--model_args", f"pretrained={setup['ckpt']},{MODEL_ARGS}{extra_args}", "--tasks", *tasks.split(","),
           "--include_path", str(setup["tasks"]), "--output_path", str(out), "--log_samples", "--batch_size", "2",
           "--device", "cpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(next(out.rglob("results_*.json")).read_text())
    samples = {p.name.split("_")[2]: [json.loads(line) for line in p.read_text().splitlines()]
               for p in out.rglob("samples_*.jsonl")}
    return proc, results, samples


def ours(setup):
    return AnchoredDiffusionLM(pretrained=str(setup["ckpt"]), sampler="low_confidence", steps=GEN_LEN, mc_num=8,
                               mc_batch_size=8, device="cpu", batch_size=2)


def test_cli_loglikelihood_matches_our_mc_elbo(setup):
    proc, results, samples = run_cli(setup, "tiny_mc")
    lm = ours(setup)
    correct = []
    for it in ITEMS:
        scores = []
        for choice in it["choices"]:
            ctx, cont = lm.encode_pair(it["question"] + " ", choice)  # lm-eval adds its target delimiter
            scores.append(mc_elbo(lm.model, ctx, cont, mc_num=8, batch_size=8, seed=0))
        correct.append(float(max(range(len(scores)), key=scores.__getitem__) == it["label"]))
        by_doc = {s["doc"]["id"]: s for s in samples["mc"]}
        logged = [float(r[0][0]) for r in by_doc[it["id"]]["resps"]]
        assert logged == pytest.approx(scores, abs=1e-6), it["id"]
    acc = results["results"]["tiny_mc"]["acc,none"]
    assert acc == pytest.approx(sum(correct) / len(correct))
    row = next(line for line in proc.stdout.splitlines() if line.startswith("|tiny_mc"))  # the table the CLI prints
    cells = [c.strip() for c in row.split("|")]
    assert cells[cells.index("acc") + 2] and float(cells[cells.index("acc") + 2]) == pytest.approx(acc, abs=1e-4)


def test_cli_generate_until_matches_our_runner(setup, monkeypatch, tmp_path):
    from anchored_reasoning.backends.diffusion import DiffusionBackend
    from anchored_reasoning.eval.runner import run_eval

    proc, results, samples = run_cli(setup, "tiny_gen")
    monkeypatch.setenv("ANCHORED_REASONING_TASKS_DIR", str(setup["ours"]))
    backend = DiffusionBackend(str(setup["ckpt"]), sampler="low_confidence", steps=GEN_LEN, batch_size=2, device="cpu")
    summary = run_eval("tiny_gen_ours", backend, "nocot", out_dir=tmp_path / "run", progress=False,
                       max_new_tokens=GEN_LEN, data_dir=setup["root"] / "data")
    records = [json.loads(line) for p in sorted((tmp_path / "run").rglob("*.jsonl")) for line in p.read_text().splitlines()]
    ours_text = {r["id"]: r["completion"] for r in records if "completion" in r}
    theirs = {s["doc"]["id"]: s["resps"][0][0] for s in samples["gen"]}
    assert set(theirs) == {it["id"] for it in ITEMS}
    assert theirs == ours_text
    assert results["results"]["tiny_gen"]["exact_match,none"] == pytest.approx(summary["accuracy"]["mean"])


def test_rolling_loglikelihood_and_chunks(setup):
    lm = ours(setup)
    req = type("R", (), {"args": ("The sky is blue and water is wet.",)})()
    [ll] = lm.loglikelihood_rolling([req])
    toks = lm._encode(req.args[0])
    assert ll == pytest.approx(mc_elbo(lm.model, [], toks, mc_num=8, batch_size=8, seed=0)) and ll < 0
    lm.max_length, lm.rolling_context = 10, 4
    long = list(range(5, 40))
    chunks = lm.rolling_chunks(long)
    assert [t for _, c in chunks for t in c] == long  # every token scored once
    assert all(len(c) + len(x) <= 10 for x, c in chunks) and all(len(x) == 4 for x, _ in chunks[1:])


def test_too_long_request_is_a_clear_error_naming_it(setup):
    lm = ours(setup)
    long_ctx = "Every cat is an animal. " * 40
    req = type("R", (), {"args": (long_ctx, " yes")})()
    with pytest.raises(DataError, match=r"lm-eval request 0 .*more than the model's 48"):
        lm.loglikelihood([req])
    gen = type("R", (), {"args": (long_ctx, {"until": ["\n"], "max_gen_toks": 4})})()
    with pytest.raises(DataError, match=r"lm-eval request 0 \(context \+ generation window"):
        lm.generate_until([gen])


def test_elbo_is_deterministic_and_tracks_the_model(setup):
    lm = ours(setup)
    ctx, cont = lm.encode_pair("Two plus two is", " four")
    a = mc_elbo(lm.model, ctx, cont, mc_num=16, seed=3)
    assert a == pytest.approx(mc_elbo(lm.model, ctx, cont, mc_num=16, seed=3, batch_size=5), rel=1e-12)  # batching
    assert a < 0
    # one token: the ELBO with l = L = 1 is exactly its log-probability under the model
    one = cont[:1]
    z = torch.tensor([ctx + [lm.mask_token_id]])
    with torch.no_grad():
        exact = float(lm.model(input_ids=z).logits[0, -1].log_softmax(-1)[one[0]])
    assert mc_elbo(lm.model, ctx, one, mc_num=4) == pytest.approx(exact, abs=1e-5)
