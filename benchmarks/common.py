"""Code the maintained benchmarks share (the one helper module: a benchmark imports this and the library, never
another benchmark script; tests/test_benchmarks_layout.py checks it).

- intervals and paired tests over per-problem records: :func:`accuracy_ci`, :func:`paired_with`,
  :func:`last_validation` (prosqa_real, prontoqa_real_runs, prontoqa_mirror);
- one method fine-tuned on a task and graded on its test split: :func:`run_one` with :data:`OPTIONS` and
  :data:`MAX_NEW_TOKENS` (acot_vs_cot, prontoqa_mirror);
- ProntoQA written proofs read against the gold: :func:`chain_report`, :func:`anchor_chain_report`
  (prontoqa_mirror);
- one timed greedy ProsQA pass on the diffusion backend: :func:`timed_pass` (diffusion_reasoning, tadm_speed);
- the small logic-text ADLM / TADM models of the stale-anchor contrast and their judge: :func:`logic_rows`,
  :func:`window_batch`, :func:`trained_stale_model`, :func:`judge_ppl` (tadm_stale_contrast, diffusion_cache);
- a result JSON written whole: :func:`write_result`; its machine block: :func:`machine` (hf_batching, lm_eval_vs_harness).
"""
from __future__ import annotations

import collections
import json
import logging
import math
import shutil
import time
from pathlib import Path
from typing import Any, Iterable

import torch

logger = logging.getLogger("benchmarks.common")


def write_result(path: str | Path, result: dict[str, Any]) -> Path:
    """``result`` as indented JSON at ``path`` (its folder made), written whole (a killed run never leaves half a
    file); logged, and the path returned."""
    from anchored_reasoning.files import atomic_write

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(result, indent=2) + "\n")
    logger.info("wrote %s", path)
    return path


def machine(load_before: tuple[float, ...], **extra: Any) -> dict[str, Any]:
    """A result's ``machine`` block: platform, cores, torch threads and version, ``extra``, and the 1-minute load
    averages at ``load_before`` (``os.getloadavg()`` when the timing began) and now (the machine is shared)."""
    import os
    import platform

    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__, **extra,
            "shared": "the machine is shared with other busy processes: 1-minute load averages before/after",
            "loadavg_1min_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)]}


# --- intervals and paired tests --------------------------------------------------------------------------


def accuracy_ci(values: list[float]) -> dict[str, Any]:
    """Per-problem 0/1 scores -> ``{"accuracy", "ci95", "n"}`` (bootstrap)."""
    from anchored_reasoning.eval.metrics import mean_ci

    c = mean_ci(values)
    return {"accuracy": round(c["mean"], 4), "ci95": [round(c["ci_low"], 4), round(c["ci_high"], 4)], "n": c["n"]}


def paired_with(a: dict[int, dict[str, int]], b: dict[int, dict[str, int]]) -> dict[str, Any] | None:
    """Two methods' per-problem records (``{seed: {id: 0/1}}``) on the seeds both ran (same seed: same
    initialisation and data order): the per-problem difference averaged over those seeds (paired
    bootstrap) and an exact McNemar test on their (seed, problem) pairs; None when no seed is shared."""
    from anchored_reasoning.eval.compare import mcnemar_exact
    from anchored_reasoning.eval.metrics import paired_bootstrap_diff, per_problem_over_seeds

    both = sorted(set(a) & set(b))
    if not both:
        return None
    mean_a = per_problem_over_seeds([a[s] for s in both])
    mean_b = per_problem_over_seeds([b[s] for s in both])
    ids = sorted(set(mean_a) & set(mean_b))
    d = paired_bootstrap_diff([mean_a[i] for i in ids], [mean_b[i] for i in ids])
    pairs = [(a[s][i], b[s][i]) for s in both for i in ids]
    only_a, only_b = sum(x > y for x, y in pairs), sum(y > x for x, y in pairs)
    return {"diff": round(d["diff"], 4), "ci95": [round(d["ci_low"], 4), round(d["ci_high"], 4)],
            "seeds_paired": both, "only_this_right": only_a, "only_cot_right": only_b,
            "mcnemar_p": float(f"{mcnemar_exact(only_a, only_b):.3g}")}


def last_validation(run: Path) -> Path | None:
    """The records of a training run's last end-of-stage validation (``validation/step-*/records.jsonl``), or None."""
    steps = sorted((run / "validation").glob("step-*/records.jsonl"))
    return steps[-1] if steps else None


# --- one method fine-tuned and graded (acot_vs_cot's protocol) ----------------------------------------


#: Method options per task (the paper's k and curriculum) for :func:`run_one`.
OPTIONS = {
    "prosqa": {
        "acot": {"k": 6, "remove_steps_per_stage": 1},
        "pause": {"k": 6, "remove_steps_per_stage": 1},
        "stepwise": {"stages": 6, "remove_steps_per_stage": 1},
        "cot": {},
        "nocot": {},
        "anchor_chain": {},
    },
    "prontoqa": {
        "acot": {"k": 6},
        "pause": {"k": 6},
        "stepwise": {"stages": 6, "remove_steps_per_stage": 1},
        "cot": {},
        "nocot": {},
        "anchor_chain": {},
    },
}

# Longest gold CoT target (+ EOS) of each real test split in the logic-gpt2 tokenizer: 53 tokens (ProsQA,
# median 37) and 96 (ProntoQA, median 79); the caps leave headroom without letting an untrained model babble.
MAX_NEW_TOKENS = {"prosqa": 56, "prontoqa": 112}


def backbone_of(args) -> str | None:
    """The backbone ``args.backbone`` names (None: ``args.preset`` from scratch)."""
    from anchored_reasoning.demo import parse_backbone

    return parse_backbone(args.backbone)


def run_one(task: str, method: str, seed: int, train: list, test: list, tokenizer: Path, args) -> dict[str, Any]:
    """Fine-tune ``method`` on ``train`` (a backbone, ``args.backbone``, or ``args.preset`` from scratch, for
    ``args.train_seconds`` or ``args.train_steps``) through the ``ar`` trainer in ``args.work``/task/method/seed<seed>,
    then grade it greedily on ``test`` through the evaluation runner; the per-seed entry of acot_vs_cot.json
    (``_correct``: per-problem correctness, for pairing). Also prontoqa_mirror's fine-tune and evaluation."""
    from anchored_reasoning import demo
    from anchored_reasoning.train.pipelines import ar

    run_dir = Path(args.work) / task / method / f"seed{seed}"
    ckpt = run_dir / "model"
    settings = demo.DemoSettings(seed=seed, backbone=backbone_of(args), preset=args.preset, learning_rate=args.lr,
                                 batch_size=args.batch_size, trace="forward", step_separator="\n")
    recipe = demo.method_recipe(method, settings, tokenizer, ckpt, args.train_seconds, task=task,
                                options=OPTIONS[task][method])
    recipe["training"]["max_length"] = 512 if backbone_of(args) else 1024  # the backbone has 512 positions
    if args.train_steps:
        recipe["training"]["max_steps"] = args.train_steps
        recipe["training"]["max_train_seconds"] = None
    if getattr(args, "extend", False):  # go on from a finished shorter run's last checkpoint (same first steps)
        recipe["training"]["extend_max_steps"] = True
    # Always through the trainer: a finished run with the same recipe and examples returns at once, one
    # with other settings (steps, trace, backbone, data) is refused with the differing keys, not reused.
    ar.run_with_examples(recipe, train, [])
    summary = json.loads((ckpt / "train_summary.json").read_text())
    ev = demo.evaluate(str(ckpt), test, run_dir / "eval_test", MAX_NEW_TOKENS[task], task=task)
    records = [json.loads(line) for line in (run_dir / "eval_test" / "records.jsonl").read_text().splitlines() if line.strip()]
    return {
        "seed": seed,
        "accuracy": ev["accuracy"],
        "accuracy_ci95": ev["accuracy_ci95"],
        "mean_generated_tokens": ev["mean_generated_tokens"],
        "no_answer": ev["no_answer"],
        "steps": summary["global_steps"],
        "train_seconds": summary["train_seconds"],  # this session's; an extended or resumed run's total is below
        "train_seconds_all_sessions": summary.get("train_seconds_all_sessions", summary["train_seconds"]),
        "final_stage": summary["final_stage"],
        "stages_planned": summary["stages_planned"],
        "_correct": {r["id"]: bool(r["correct"]) for r in records},
    }


# --- ProntoQA written proofs against the gold ---------------------------------------------------------


def _against_gold(rows) -> dict[str, Any]:
    """Counts over ``(gold, written, wrong_kind, conclusion_is_gold, correct)`` rows, where ``gold`` and
    ``written`` are sequences read item by item and ``wrong_kind(i)`` names a wrong written item i."""
    n = exact = conclusion = right_after = correct = 0
    at = collections.Counter()
    first_error = collections.Counter()
    for gold, written, wrong_kind, conclusion_is_gold, right in rows:
        n += 1
        correct += bool(right)
        exact += written == gold
        for i, item in enumerate(written[: len(gold)]):
            at[i] += item == gold[i]
        wrong = next((i for i, g in enumerate(gold) if i >= len(written) or written[i] != g), None)
        if wrong is None:
            first_error["none"] += 1  # the gold read in full (anything written after it is not counted)
        elif wrong >= len(written):
            first_error["stopped_short"] += 1
        else:
            first_error[wrong_kind(wrong)] += 1
        if conclusion_is_gold:
            conclusion += 1
            right_after += bool(right)
    return {"n": n, "accuracy": round(correct / max(1, n), 4), "exact": exact,
            "at_position": [at[i] for i in range(max(at) + 1)] if at else [],
            "first_error": dict(first_error.most_common()), "conclusion_is_gold": conclusion,
            "answer_right_when_conclusion_is_gold": right_after}


def chain_report(examples, records: Iterable[dict[str, Any]], order: str) -> dict[str, Any]:
    """How a ProntoQA CoT model's written proofs (eval records) compare with the gold proof in ``order``.

    Sentence by sentence (the gold steps split into sentences): exact proofs, the gold sentence at each
    position, where the first wrong sentence is and whether it is a rule of the question
    (``in_question``) or not (``made_up``), and how often the conclusion (last sentence) is the gold
    one and the answer is right then. ``by_rule`` reads the same proofs with each sentence parsed to its
    rule (``("rompus", False, "impus")``), so a right step in other words ("Every rompus is an impus."
    for the question's "Each rompus is an impus.") counts as right there: the concept chain, as
    ``anchor_chain_report`` reads a bare chain.
    """
    from anchored_reasoning.eval.probes import derivation_text
    from anchored_reasoning.generators.traces import apply_trace, proof_sentences, prontoqa_rules

    by_id = {ex.id: ex for ex in examples}
    proofs = []
    for r in records:
        ex = by_id[r["id"]]
        gold = [s for step in apply_trace([ex], "prontoqa", order)[0].steps for s in proof_sentences(step)]
        written = proof_sentences(derivation_text(r["completion"]))
        proofs.append((gold, written, set(prontoqa_rules(ex.question)), r["correct"]))

    def rule(sentence: str):
        parsed = prontoqa_rules(sentence)
        return parsed[0] if parsed else sentence

    def rows(parse):
        for gold, written, rules, correct in proofs:
            g, w = [parse(x) for x in gold], [parse(x) for x in written]

            def kind(i, n=len(g), written=written, rules=rules):
                where = "conclusion" if i == n - 1 else "step"
                return f"{where}_{'in_question' if rule(written[i]) in rules else 'made_up'}"
            yield g, w, kind, bool(w) and w[-1] == g[-1], correct

    c, by_rule = _against_gold(rows(str)), _against_gold(rows(rule))
    return {"order": order, "n": c["n"], "accuracy": c["accuracy"], "exact_proofs": c["exact"],
            "gold_sentence_at_position": c["at_position"], "first_error": c["first_error"],
            "conclusion_is_gold": c["conclusion_is_gold"],
            "answer_right_when_conclusion_is_gold": c["answer_right_when_conclusion_is_gold"],
            "by_rule": {"exact_proofs": by_rule["exact"], "gold_rule_at_position": by_rule["at_position"],
                        "first_error": by_rule["first_error"]}}


def anchor_chain_report(examples, records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """How an ``anchor_chain`` model's written chains (``Sally rompus impus not sour[EoA]``) compare with
    the gold chain the method trains on: exact chains, the gold anchor at each position, the first wrong
    anchor (``stopped_short``, ``made_up``: a word that is no concept or property of the question, or
    ``in_question``: a real one off the chain), and how often the conclusion sentence written after the
    chain is the gold one and the answer is right then."""
    from anchored_reasoning.methods.anchor_chain import AnchorChain
    from anchored_reasoning.methods.anchored import EOA

    method = AnchorChain()
    by_id = {ex.id: ex for ex in examples}

    def rows():
        for r in records:
            ex = by_id[r["id"]]
            gold_chain, _, gold_rest = method.render(ex, "prontoqa").target.partition(EOA)
            chain, _, rest = r["completion"].partition(EOA)
            written, words = chain.split(), set(ex.question.replace(".", " ").split())
            yield (gold_chain.split(), written,
                   lambda i, w=written, words=words: "in_question" if w[i] in words else "made_up",
                   rest.strip().split("\n")[0] == gold_rest.strip().split("\n")[0], r["correct"])

    c = _against_gold(rows())
    return {"n": c["n"], "accuracy": c["accuracy"], "exact_chains": c["exact"], "gold_anchor_at_position": c["at_position"],
            "first_error": c["first_error"], "conclusion_is_gold": c["conclusion_is_gold"],
            "answer_right_when_conclusion_is_gold": c["answer_right_when_conclusion_is_gold"]}


# --- diffusion: one timed greedy ProsQA pass ----------------------------------------------------------


def timed_pass(model, tok, method, examples, out_dir: Path, *, gen_length: int, batch_size: int,
               **sampler) -> tuple[dict, float]:
    """One greedy ProsQA pass of the evaluation runner on the diffusion backend (``gen_length`` tokens in
    as many steps, low-confidence remasking, these sampler options), from scratch; (summary with the
    backend's ``anchor_refresh_fraction``, wall seconds). diffusion_reasoning's and tadm_speed's evaluation."""
    from anchored_reasoning.backends.diffusion import DiffusionBackend
    from anchored_reasoning.eval.runner import run_eval

    backend = DiffusionBackend(model, tokenizer=tok, sampler="low_confidence", steps=gen_length, gen_length=gen_length,
                               batch_size=batch_size, device="cpu", **sampler)
    shutil.rmtree(out_dir, ignore_errors=True)  # a resumed pass would skip generation and its timing
    t0 = time.perf_counter()
    summary = run_eval("prosqa", backend, method, out_dir=out_dir, examples=examples, max_new_tokens=gen_length,
                       progress=False)
    secs = time.perf_counter() - t0
    summary["anchor_refresh_fraction"] = backend.anchor_refresh_fraction  # None without an anchor cache
    return summary, secs


# --- the stale-anchor contrast's logic-text models ----------------------------------------------------


def logic_rows(tok, n: int, seed: int, window: int) -> list[tuple[list[int], list[int]]]:
    """(facts + newline ids, derivation + EOS padded to ``window``) for ``n`` small ProsQA documents."""
    from anchored_reasoning import generators
    from anchored_reasoning.train.data.logic_text import document, encode

    rows = []
    for ex in generators.generate_dataset("prosqa", n, seed=seed, split=f"stale{seed}", num_nodes=7, min_hops=1, max_hops=2,
                                            neg_depth="any"):
        ids, head = encode(tok, document(ex, "prosqa"))
        resp = ids[head:][:window]
        rows.append((ids[:head], resp + [tok.eos_token_id] * (window - len(resp))))
    return rows


def window_batch(rows, pad_id: int):
    """Left-padded facts, then the window: ids, attention mask, window mask (B, P + window)."""
    width = max(len(f) for f, _ in rows)
    ids, am, lm = [], [], []
    for facts, resp in rows:
        pad = width - len(facts)
        ids.append([pad_id] * pad + facts + resp)
        am.append([0] * pad + [1] * (len(facts) + len(resp)))
        lm.append([False] * (pad + len(facts)) + [True] * len(resp))
    return torch.tensor(ids), torch.tensor(am), torch.tensor(lm)


def build_stale_model(kind: str, tok, hidden: int, max_len: int):
    """A fresh ``kind`` model (``adlm``; ``tadm``; ``tadm_relative``: fusion_scale relative), 4 blocks of ``hidden``, seed 0."""
    from anchored_reasoning.models import ADLM, ADLMConfig, TADM, TADMConfig

    common = dict(vocab_size=len(tok), mask_token_id=tok.mask_token_id, pad_token_id=tok.pad_token_id,
                  eos_token_id=tok.eos_token_id, hidden_size=hidden, num_attention_heads=4, intermediate_size=4 * hidden,
                  max_position_embeddings=max_len, dropout=0.0)
    torch.manual_seed(0)
    if kind == "adlm":
        return ADLM(ADLMConfig(**common, num_hidden_layers=3, denoiser_layers=1))
    scale = "relative" if kind == "tadm_relative" else "absolute"
    return TADM(TADMConfig(**common, shared_layers=1, num_hidden_layers=2, denoiser_layers=1, fusion_scale=scale,
                           fusion_variant="residual"))  # the fusion tadm_stale_contrast.json was measured with


def train_stale_model(model, rows, args, window: int, pad_id: int) -> dict[str, Any]:
    """``args.stale_steps`` AdamW steps on ``rows`` (ANELBO; T-ANELBO with K in {1, 2, 4, 8} for a TADM); the budget spent."""
    from anchored_reasoning.objectives import diffusion_loss, gamma_schedule
    from anchored_reasoning.objectives_tadm import t_anelbo

    opt = torch.optim.AdamW(model.parameters(), lr=args.stale_lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(0)
    model.train()
    t0, log = time.perf_counter(), []
    for step in range(args.stale_steps):
        for g in opt.param_groups:
            g["lr"] = args.stale_lr * min(1.0, (step + 1) / 20)
        pick = torch.randint(len(rows), (args.stale_batch,), generator=gen).tolist()
        ids, am, lm = window_batch([rows[i] for i in pick], pad_id)
        gamma = gamma_schedule(step, args.stale_steps)
        common = dict(attention_mask=am, loss_mask=lm, gamma=gamma, anchor_ignore_ids=[pad_id], generator=gen)
        if hasattr(model, "fusion"):
            out = t_anelbo(model, ids, k_choices=(1, 2, 4, 8), sampling_steps=window, **common)
        else:
            out = diffusion_loss(model, ids, **common)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % 100 == 0:
            log.append({"step": step + 1, "nelbo": round(float(out.nelbo), 4)})
            logger.info("%s step %d nelbo %.3f", type(model).__name__, step + 1, float(out.nelbo))
    model.eval()
    return {"steps": args.stale_steps, "seconds": round(time.perf_counter() - t0, 1), "nelbo_curve": log}


def trained_stale_model(kind: str, tok, rows, args, window: int, max_len: int):
    """The ``kind`` model trained on ``rows``, saved under ``WORKDIR/stale_<kind>_h<hidden>_s<steps>`` and reused from there
    (tadm_stale_contrast trains them, diffusion_cache samples the same checkpoints)."""
    from transformers import AutoModelForMaskedLM

    import anchored_reasoning.models  # noqa: F401  (Auto registration)

    out = Path(args.workdir) / f"stale_{kind}_h{args.hidden}_s{args.stale_steps}"
    if (out / "config.json").is_file():
        return AutoModelForMaskedLM.from_pretrained(out).eval(), json.loads((out / "training.json").read_text())
    model = build_stale_model(kind, tok, args.hidden, max_len)
    budget = train_stale_model(model, rows, args, window, tok.pad_token_id)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "training.json").write_text(json.dumps({**budget, "window": window}, indent=1))
    return model, budget


@torch.no_grad()
def judge_ppl(judge, prompts: torch.Tensor, prompt_am: torch.Tensor, gen: torch.Tensor, eos: int) -> float:
    """Generative perplexity: exp(mean NLL) of the generated tokens (up to and including the first
    EOS) under the AR judge, given the facts."""
    total, count = 0.0, 0
    for r in range(prompts.shape[0]):
        facts = prompts[r][prompt_am[r].bool()].tolist()
        toks = gen[r].tolist()
        toks = toks[:toks.index(eos) + 1] if eos in toks else toks
        x = torch.tensor([facts + toks])
        logp = judge(input_ids=x).logits[0, len(facts) - 1:-1].float().log_softmax(-1)
        total -= float(logp.gather(-1, torch.tensor(toks).unsqueeze(-1)).sum())
        count += len(toks)
    return math.exp(total / max(count, 1))
