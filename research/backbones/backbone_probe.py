"""Where a question-aware logic backbone fails: binding, lookup or planning, per depth, zero-shot.

    python -m research.backbones.backbone --out runs/bb-qa --minutes 45 --docs 60000 --seed 7 --lr 1e-3 \\
        --threads 1 --init-from anchored_reasoning/assets/logic-gpt2 --corpus questions
    python -m research.backbones.backbone_probe --model runs/bb-qa --out research/backbones/results/backbone_probe.json

The model continues "<facts> Is X a A or B?\\n" (the pretraining format of ``--corpus questions``)
greedily on held-out ladder problems (shortcut-free, exactly h hops). Each derivation is read step by
step: does it start at the asked entity (binding), is its first step a fact of the problem (lookup),
are all its steps facts, where does the walk first leave the right track (``first_error``: a made-up step,
a wrong branch, stopping short, overshooting; ``eval.probes.chain_check``), does its first step take a
branch that still reaches the answer (by the entity's number of children, beside a random branch's
score: planning), does it end at one of the options, at the right one (accuracy), and is the
answer the same when the question asks about the other entity (``same_under_swap``: a model that
reads the entity has 0, one that answers from the graph's shape 1). Writes one JSON.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
from pathlib import Path



def _steps(text: str) -> list[str]:
    deriv = text.split("###")[0].strip()
    return [s.strip() + "." for s in deriv.split(".") if s.strip()]


def _concept(steps: list[str]) -> str:
    return steps[-1].split(" is a ")[-1].rstrip(".") if steps else ""


def branch_choice(rows: list[tuple[dict[str, set[str]], list[tuple[str, str]], str, str]]) -> dict:
    """The first step's branch against the asked entity's number of children (1, 2, 3+): how often the
    child it names still reaches the answer, beside what picking a child at random would score (the share
    of the entity's children that reach it). Near the random share with 2+ children means the model looks
    a fact up but does not plan which branch leads to an option."""
    from anchored_reasoning.eval.probes import reaches

    by: dict[str, list[float]] = {}
    for children, steps, entity, answer in rows:
        kids = sorted(children.get(entity, ()))
        if not kids:
            continue
        first = steps[0][1] if steps and steps[0][0] == entity else None
        good = [c for c in kids if reaches(children, c, answer)]
        acc = by.setdefault(str(len(kids)) if len(kids) < 3 else "3+", [0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += first in good
        acc[2] += len(good) / len(kids)
    return {k: {"n": int(v[0]), "first_step_reaches_answer": v[1] / v[0], "random_branch": v[2] / v[0]}
            for k, v in sorted(by.items())}


def generate(backend, prompts: list[str], max_new_tokens: int = 64) -> list[str]:
    """Greedy continuations of ``" <question>\n"`` through the library's hf backend."""
    from anchored_reasoning.types import Prompt, SamplingSpec

    outs = backend.generate([Prompt(text=" " + p + "\n") for p in prompts], SamplingSpec(max_new_tokens=max_new_tokens))
    return [samples[0].text for samples in outs]


def probe_set(backend, held: list, max_new_tokens: int = 64) -> dict:
    """Every figure of the module doc on one list of ProsQA problems (shares of ``len(held)``; problems the
    binding probe cannot swap -- possible only in hand-made data -- are left out)."""
    from anchored_reasoning.eval.probes import SWAP_SUFFIX, binding_probe_examples, chain_check, derivation_steps, prosqa_children
    from anchored_reasoning.eval.metrics import mean_ci
    from anchored_reasoning.eval.search_probe import replay
    from anchored_reasoning.generators.traces import proof_sentences
    from anchored_reasoning.train.data.logic_text import document_answer, facts_of

    swapped = {e.id[: -len(SWAP_SUFFIX)]: e for e in binding_probe_examples(held)}
    held = [e for e in held if e.id in swapped]
    n = len(held)
    texts = generate(backend, [e.question for e in held], max_new_tokens)
    swapped_texts = generate(backend, [swapped[e.id].question for e in held], max_new_tokens)
    row = {"entity_first": 0, "first_step_is_a_fact": 0, "all_steps_are_facts": 0, "ends_at_an_option": 0,
           "right": 0, "same_under_swap": 0, "answer_right": 0, "answer_flips": 0}
    branches, errors, branch_steps, searches, right = [], {}, {}, {}, []
    for e, t, ts in zip(held, texts, swapped_texts):
        facts = set(proof_sentences(facts_of(e.question, "prosqa")))
        steps = _steps(t)
        row["entity_first"] += bool(steps) and steps[0].startswith(e.meta["entity"] + " ")
        row["first_step_is_a_fact"] += bool(steps) and steps[0] in facts
        row["all_steps_are_facts"] += bool(steps) and all(s in facts for s in steps)
        row["ends_at_an_option"] += _concept(steps) in (e.meta["answer_concept"], e.meta["neg_concept"])
        row["right"] += _concept(steps) == e.meta["answer_concept"]
        row["same_under_swap"] += bool(_concept(steps)) and _concept(steps) == _concept(_steps(ts))
        options = (e.meta["answer_concept"], e.meta["neg_concept"])
        said, said_swapped = document_answer(t), document_answer(ts)
        right.append(float(said == options[0]))
        row["answer_right"] += said == options[0]
        row["answer_flips"] += said in options and said_swapped in options and said != said_swapped
        kind = replay(e, t)["first_error"]  # read as a written search (the ``search`` corpus's format)
        searches[kind] = searches.get(kind, 0) + 1
        branches.append((prosqa_children(e), derivation_steps(t), e.meta["entity"], e.meta["answer_concept"]))
        check = chain_check(e, t)
        kind = check["first_error"] or "right_walk"
        errors[kind] = errors.get(kind, 0) + 1
        if kind == "wrong_branch":
            branch_steps[str(check["error_step"])] = branch_steps.get(str(check["error_step"]), 0) + 1
    res = {k: v / max(n, 1) for k, v in row.items()}
    res["n"] = n
    ci = mean_ci(right)
    res["answer_right_ci95"] = [ci["ci_low"], ci["ci_high"]]
    res["by_entity_children"] = branch_choice(branches)
    res["first_error"] = {k: v / max(n, 1) for k, v in sorted(errors.items())}
    res["wrong_branch_at_step"] = dict(sorted(branch_steps.items()))  # counts, by 1-based step
    res["search_first_error"] = {k: v / max(n, 1) for k, v in sorted(searches.items())}
    res["example"] = texts[0][:160] if texts else ""
    return res


def probe(model_dir: str, hops: list[int], n: int, seed: int, max_new_tokens: int = 64) -> dict:
    """:func:`probe_set` on ``n`` held-out ladder problems of each depth in ``hops``."""
    from anchored_reasoning.backends import get_backend
    from anchored_reasoning.generators.prosqa import generate_dataset, ladder_size

    backend = get_backend("hf", model_dir, batch_size=32, device="cpu")
    return {str(h): probe_set(backend, generate_dataset(n, seed=seed + h, split="probe", **ladder_size(h)), max_new_tokens)
            for h in hops}


def probe_real(model_dir: str, limit: int | None = None, max_new_tokens: int = 256) -> dict:
    """:func:`probe_set` on the real ProsQA test split (``$ANCHORED_REASONING_DATA`` or the Hub), all of it and by
    answer depth, with a 95% interval on the answer's accuracy."""
    from anchored_reasoning.backends import get_backend
    from anchored_reasoning.eval.probes import hops_of
    from anchored_reasoning.tasks import get_task

    backend = get_backend("hf", model_dir, batch_size=32, device="cpu")
    test = list(get_task("prosqa").load("test", limit=limit))
    out = {"all": probe_set(backend, test, max_new_tokens)}
    for h in sorted({hops_of(e) for e in test}):
        out[str(h)] = probe_set(backend, [e for e in test if hops_of(e) == h], max_new_tokens)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--hops", nargs="+", type=int, default=[1, 2, 3, 4])
    p.add_argument("--n", type=int, default=100, help="held-out problems per depth")
    p.add_argument("--seed", type=int, default=4242)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=64, help="per continuation (a written search needs ~128 at 4 hops)")
    p.add_argument("--real", type=int, default=0, metavar="N",
                   help="also the first N problems of the real ProsQA test split (-1: all 500), by answer depth")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "backbone_probe.json"))
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    model_info = {}
    info_file = Path(a.model) / "backbone.json"
    if info_file.is_file():
        info = json.loads(info_file.read_text())
        model_info = {k: info.get(k) for k in ("steps", "tokens", "train_seconds", "held_out_derivation_loss", "init_from")}
        model_info["corpus"] = (info.get("corpus") or {}).get("kind")
    result = {"model": a.model, "model_info": model_info, "by_hops": probe(a.model, a.hops, a.n, a.seed, a.max_new_tokens),
              **({"real_test": probe_real(a.model, None if a.real < 0 else a.real, max(a.max_new_tokens, 256))}
                 if a.real else {}),
              "chance": {"right": 0.5, "answer_right": 0.5,
                         "same_under_swap": "1.0 for a model that ignores the entity, 0.0 for one that reads it",
                         "answer_flips": "1.0 for a model that reads the entity (the answer after ###)"},
              "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": {"platform": platform.platform(), "torch_threads": a.threads},
              "command": "python -m research.backbones.backbone_probe " + " ".join(sys.argv[1:])}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    rows = [*result["by_hops"].items(), *((f"real {h}", r) for h, r in result.get("real_test", {}).items())]
    for h, r in rows:
        print(h, {k: round(v, 2) for k, v in r.items() if isinstance(v, (int, float))})
        print("  as a search, first error:", {k: round(v, 2) for k, v in r["search_first_error"].items()})
        print("  first error:", {k: round(v, 2) for k, v in r["first_error"].items()}, "wrong branch at step:",
              r["wrong_branch_at_step"])
        for k, b in r["by_entity_children"].items():
            print(f"  {k} children: n {b['n']}, first step reaches the answer {b['first_step_reaches_answer']:.2f}"
                  f" (random branch {b['random_branch']:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
