"""Can a logic backbone look a fact up forward (subject -> object) and backward (object -> subject), zero-shot?

    python -m research.backbones.reverse_lookup --model anchored_reasoning/assets/logic-gpt2-shift \\
        --model runs/backbone_back --out research/backbones/results/reverse_lookup.json

Walking a ProsQA graph back from an option (``trace: options_backward``) is a chain of *reverse* look-ups:
given a concept, name a subject of a fact that ends in it. ``logic-gpt2-shift`` was pretrained on forward
derivations only, and fine-tuned 2,000 steps on backward walks it wrote a fact as its next step only 17% of
the time (research/depth-ladder.md, session 20). This probe asks each backbone, after a problem's facts and a
newline, for one fact in each direction, in the form of the pretraining drills:

- forward: ``Every <X> is a`` (``<X> is a`` for an entity) -> the next word; right if ``<X> is a <word>`` is a fact;
- reverse: ``<Y>:`` -> the sentence up to its period; right if it is a fact of the problem ending in ``<Y>``.

Problems: held-out generated ladder problems (3 hops) and the real ProsQA test's 500 graphs (only the facts
are used; no answer is read). Chance: the share of the problem's concepts (and entities) that would be right
if named at random. Greedy decoding, one query per direction per problem, one thread.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import re
import sys
from pathlib import Path


_FACT = re.compile(r"^(?:Every )?(\w+) is a (\w+)\.$")


def parse_facts(question: str) -> list[tuple[str, str]]:
    """(subject, object) of each fact of a ProsQA question (``generators.shortcuts.parse``)."""
    from anchored_reasoning.generators.shortcuts import parse

    return [(a, b) for _, a, b in parse(question)[0]]


def queries(question: str, rng: random.Random) -> dict:
    """One forward and one reverse query on a random fact of the problem, with what counts as right; each
    after two other facts of the problem restated in the query's own form (in-context examples, so that a
    backbone that never saw the ``<Y>:`` form is asked the same thing)."""
    from anchored_reasoning.train.data.logic_text import facts_of

    facts = parse_facts(question)
    names = sorted({n for f in facts for n in f})
    sub, obj = rng.choice(facts)
    shots = rng.sample([f for f in facts if f[1] != obj and f[0] != sub], 2)

    def said(a: str, b: str) -> str:
        return f"{a} is a {b}." if a[:1].isupper() else f"Every {a} is a {b}."

    head = facts_of(question, "prosqa") + "\n"
    fwd_head = head + " ".join(said(a, b) for a, b in shots) + " "
    rev_head = head + " ".join(f"{b}: {said(a, b)}" for a, b in shots) + " "
    fwd_ok = sorted({b for a, b in facts if a == sub})
    rev_ok = sorted({a for a, b in facts if b == obj})
    return {
        "forward": {"prompt": fwd_head + (f"{sub} is a" if sub[:1].isupper() else f"Every {sub} is a"),
                    "right": fwd_ok, "chance": len(fwd_ok) / len(names)},
        "reverse": {"prompt": rev_head + f"{obj}:", "right": rev_ok, "chance": len(rev_ok) / len(names),
                    "object": obj},
    }


def grade(direction: str, query: dict, text: str) -> bool:
    if direction == "forward":
        words = text.strip().split()
        return bool(words) and words[0].rstrip(".") in query["right"]
    m = _FACT.match(text.strip().split(".")[0].strip() + ".")
    return bool(m) and m.group(2) == query["object"] and m.group(1) in query["right"]


def probe(model_dir: str, problems: dict[str, list[str]], batch_size: int = 32) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from anchored_reasoning.models import ShiftGPT2LMHeadModel  # registers shift-gpt2 with the Auto classes
    from anchored_reasoning.eval.metrics import mean_ci

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    kind = "shift-gpt2" if isinstance(model, ShiftGPT2LMHeadModel) else model.config.model_type
    out: dict = {"architecture": kind}
    for source, questions in problems.items():
        rng = random.Random(0)
        qs = [queries(q, rng) for q in questions]
        for direction in ("forward", "reverse"):
            right: list[bool] = []
            for i in range(0, len(qs), batch_size):
                batch = [q[direction] for q in qs[i:i + batch_size]]
                enc = tok([b["prompt"] for b in batch], return_tensors="pt", padding=True)
                with torch.no_grad():
                    gen = model.generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
                texts = tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
                right += [grade(direction, b, t) for b, t in zip(batch, texts)]
            ci = mean_ci(right)
            out[f"{source}/{direction}"] = {"accuracy": ci["mean"], "ci95": [ci["ci_low"], ci["ci_high"]],
                                            "n": ci["n"], "chance": sum(q[direction]["chance"] for q in qs) / len(qs),
                                            "example": texts[0]}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", required=True, help="a backbone directory (repeatable)")
    p.add_argument("--n", type=int, default=300, help="generated problems (the real test: all 500)")
    p.add_argument("--out", default=None)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    import torch

    from anchored_reasoning import generators
    from anchored_reasoning.generators.prosqa import ladder_size
    from anchored_reasoning.machine import machine_info
    from anchored_reasoning.tasks import get_task

    torch.set_num_threads(a.threads)
    problems = {
        "ladder3": [ex.question for ex in generators.generate_dataset("prosqa", a.n, seed=9301, split="probe",
                                                                      **ladder_size(3))],
        "real_test": [ex.question for ex in get_task("prosqa").load("test")],
    }
    result = {
        "what": "zero-shot fact look-up forward (subject -> object) and backward (object -> subject) after a "
                "ProsQA problem's facts (research/backbones/reverse_lookup.py)",
        "command": "python -m research.backbones.reverse_lookup " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": dt.date.today().isoformat(), "machine": machine_info(), "threads": a.threads,
        "models": {m: probe(m, problems) for m in a.model},
    }
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
