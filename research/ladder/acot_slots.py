"""What the [ANT] slots of a trained ACoT model carry, slot by slot and depth by depth.

    python -m research.ladder.acot_slots --run acot=/work/runs/ladder_shift_long/acot/seed0/model \\
        --run acot_keep=/work/runs/ladder_shift_long/acot_keep/seed0/model --out research/ladder/results/acot_slots.json

For every checkpoint (an ACoT model of the depth ladder) and the ladder's held-out problems (the same
generator seed and sizes as ``depth_ladder.py``), four readings of the slots:

1. **What each slot predicts** (the LM head at slot i, argmax, as in training): the i-th anchor (right),
   another node of the right path (right node, wrong place), a concept on no path to the right answer
   (e.g. the other entity's branch or a dead end), or a token that is no concept of the problem.
   Anchor i of a ProsQA problem is the i-th node of the reasoning path (the entity, then each concept
   down to the answer), so slot 0 reads the asked entity, slot 1 the first step, and so on; at h hops a
   problem has h + 1 anchors, and slots past them carry no loss.
2. **Does the answer follow the slots**: answer accuracy when slot i is right vs wrong (the greedy
   answers of the model's evaluation records, when the run folder has them).
3. **Where in depth the anchor appears** (logit lens: each block's output at the slot through the final
   norm and the LM head): a later position reads block l's output only in block l + 1, so an anchor
   that appears only after the last block is read by nothing.
4. **Does the answer read the slots at all**: forced-choice accuracy (the two answer sentences scored
   by the model, teacher-forced after the gold steps the method keeps) and greedy accuracy (the model's
   own steps, for a method that keeps them), each with the prompt intact and with every later position
   kept from attending to the slots (a 4-D attention mask); if the two agree, the slots carry nothing
   the answer uses.

Writes one JSON with all four per checkpoint and per depth.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.depth_ladder import ladder_problems  # (the ladder's own problems)

log = logging.getLogger("acot_slots")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", action="append", required=True, help="LABEL=CHECKPOINT_DIR (repeatable)")
    p.add_argument("--hops", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--eval-n", type=int, default=50, help="held-out problems per depth (the ladder's)")
    p.add_argument("--train-n", type=int, default=24000, help="the ladder's training problems (held-out problems exclude them)")
    p.add_argument("--generate", type=int, default=96,
                   help="greedy answers with the slots visible and hidden, at most this many new tokens (0: skip)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="research/ladder/results/acot_slots.json")
    return p.parse_args(argv)


def concept_roles(example) -> dict[str, str]:
    """Each concept of a ProsQA problem: 'path' (on the gold reasoning path), or 'other' (in the graph)."""
    meta = example.meta
    symbols = meta["idx_to_symbol"]
    roles = {s: "other" for s in symbols}
    from anchored_reasoning.anchors import logic_anchors

    for node in logic_anchors(example.steps, max_anchors=None):
        roles[node] = "path"
    return roles


def wrong_option(example) -> str:
    return example.meta["idx_to_symbol"][example.meta["neg_target"]]


def hiding_mask(n: int, hidden: list[int]):
    """A causal 4-D additive attention mask over ``n`` positions in which every position after the last
    of ``hidden`` cannot attend to the ``hidden`` positions (which themselves attend as usual)."""
    import torch

    mask = torch.ones(n, n).tril()
    if hidden:
        mask[max(hidden) + 1 :, hidden] = 0
    return torch.zeros(1, 1, n, n).masked_fill(mask == 0, torch.finfo(torch.float32).min)


def choice_scores(model, prompt_ids: list[int], cands: list[list[int]], hidden: list[int]) -> list[float]:
    """Teacher-forced log-likelihood of each candidate continuation of ``prompt_ids``, with every
    position after the last of ``hidden`` kept from attending to the ``hidden`` positions (a 4-D
    additive mask; the hidden positions themselves attend as usual). The token shift of
    ``shift-gpt2`` still sees the hidden tokens' *input* embeddings one to three positions on; for
    the constant ``[ANT]`` slots that carries no content."""
    import torch

    scores = []
    for cand in cands:
        seq = torch.tensor([list(prompt_ids) + list(cand)])
        with torch.no_grad():
            lg = model(input_ids=seq, attention_mask=hiding_mask(seq.shape[1], hidden)).logits[0].log_softmax(-1)
        start = len(prompt_ids)
        scores.append(sum(float(lg[start - 1 + j, t]) for j, t in enumerate(cand)))
    return scores


def greedy(model, prompt_ids: list[int], hidden: list[int], max_new_tokens: int, eos_id: int) -> list[int]:
    """Greedy continuation of ``prompt_ids`` with the ``hidden`` positions masked from every later
    position, generated tokens included (no KV cache: the mask is rebuilt each step)."""
    import torch

    ids = list(prompt_ids)
    for _ in range(max_new_tokens):
        with torch.no_grad():
            nxt = int(model(input_ids=torch.tensor([ids]), attention_mask=hiding_mask(len(ids), hidden)).logits[0, -1].argmax())
        if nxt == eos_id:
            break
        ids.append(nxt)
    return ids[len(prompt_ids):]


def slot_readings(model, tok, method, examples, hops: dict[str, int], generate: int = 0) -> list[dict[str, Any]]:
    """Per example: the slot predictions against the anchors, forced-choice log-likelihoods with the
    slots visible and hidden, and with ``generate`` > 0 the greedy answer (that many new tokens at
    most) graded with the slots visible and hidden."""
    import torch

    from anchored_reasoning.methods.answers import answer_line
    from anchored_reasoning.tasks import get_task
    from anchored_reasoning.train.data.collate import AnchorLabels, special_token_id

    grader = get_task("prosqa")
    ant = special_token_id(tok, "[ANT]")
    head = model.get_output_embeddings()
    norm = model.transformer.ln_f  # GPT-2 family (the ladder's backbones)
    labeler = AnchorLabels(tok)
    out = []
    for ex in examples:
        r = method.render(ex)
        prompt_ids = list(tok(r.prompt)["input_ids"])
        slots = [i for i, t in enumerate(prompt_ids) if t == ant]
        right_line = answer_line(ex)
        wrong_line = right_line[: right_line.rfind(" ") + 1] + wrong_option(ex) + "."
        cands = []
        for line in (right_line, wrong_line):
            target = r.target[: len(r.target) - len(right_line)] + line
            cands.append(list(tok(target, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id])
        roles = concept_roles(ex)
        row: dict[str, Any] = {"id": ex.id, "hops": hops[ex.id], "slots": [], "choice": {}, "greedy": {}}
        with torch.no_grad():
            ids = torch.tensor([prompt_ids])
            res = model(input_ids=ids, output_hidden_states=True)
            logits = res.logits[0]
            # logit lens: each block's output at the slots through the final norm and the LM head
            lens = [head(norm(h[0])).argmax(-1) for h in res.hidden_states[1:-1]] + [logits.argmax(-1)]
            for i, pos in enumerate(slots):
                top = int(lens[-1][pos])  # the head's own prediction, as trained
                pred = tok.decode([top]).strip()
                want = labeler(r.anchors[i])[0] if i < len(r.anchors) else None
                kind = ("right" if want is not None and top == want else
                        "path" if roles.get(pred) == "path" else "graph" if pred in roles else "none")
                row["slots"].append({"pred": pred, "anchor": r.anchors[i] if i < len(r.anchors) else None, "kind": kind,
                                     "lens": [want is not None and int(layer[pos]) == want for layer in lens]})
            for hide in (False, True):
                right, wrong = choice_scores(model, prompt_ids, cands, slots if hide else [])
                row["choice"]["hidden" if hide else "intact"] = right > wrong
                row["choice"]["margin_hidden" if hide else "margin_intact"] = round(right - wrong, 4)
                if generate:
                    out_ids = greedy(model, prompt_ids, slots if hide else [], generate, tok.eos_token_id)
                    text = tok.decode(out_ids, skip_special_tokens=True)
                    row["greedy"]["hidden" if hide else "intact"] = bool(grader.grade(text, ex).correct)
        out.append(row)
    return out


def summarize(rows: list[dict[str, Any]], correct: dict[str, bool] | None) -> dict[str, Any]:
    by_h: dict[int, list] = defaultdict(list)
    for row in rows:
        by_h[row["hops"]].append(row)
    summary: dict[str, Any] = {}
    for h, rs in sorted(by_h.items()):
        k = len(rs[0]["slots"])
        slots = []
        for i in range(k):
            labelled = [r for r in rs if r["slots"][i]["anchor"] is not None]
            kinds = defaultdict(int)
            for r in labelled:
                kinds[r["slots"][i]["kind"]] += 1
            entry: dict[str, Any] = {"labelled": len(labelled),
                                     "share": {kd: round(v / len(labelled), 3) for kd, v in sorted(kinds.items())} if labelled else {}}
            if labelled:
                entry["lens_by_layer"] = [round(sum(r["slots"][i]["lens"][j] for r in labelled) / len(labelled), 3)
                                          for j in range(len(labelled[0]["slots"][i]["lens"]))]
            if correct is not None and labelled:
                for name, sel in (("answer_acc_when_right", True), ("answer_acc_when_wrong", False)):
                    pick = [correct[r["id"]] for r in labelled if (r["slots"][i]["kind"] == "right") == sel and r["id"] in correct]
                    entry[name] = round(sum(pick) / len(pick), 3) if pick else None
                    entry[name.replace("answer_acc", "n")] = len(pick)
            slots.append(entry)
        choice = {c: round(sum(r["choice"][c] for r in rs) / len(rs), 3) for c in ("intact", "hidden")}
        changed = sum(r["choice"]["intact"] != r["choice"]["hidden"] for r in rs)
        summary[str(h)] = {"n": len(rs), "slots": slots, "forced_choice": {**choice, "changed": changed}}
        if rs[0].get("greedy"):
            summary[str(h)]["greedy_recomputed"] = {
                c: round(sum(r["greedy"][c] for r in rs) / len(rs), 3) for c in ("intact", "hidden")}
            summary[str(h)]["greedy_recomputed"]["changed"] = sum(r["greedy"]["intact"] != r["greedy"]["hidden"] for r in rs)
        if correct is not None:
            got = [correct[r["id"]] for r in rs if r["id"] in correct]
            summary[str(h)]["greedy_accuracy"] = round(sum(got) / len(got), 3) if got else None
    return summary


def load_checkpoint(path: str, accepts, what: str):
    """(meta, method, tokenizer, model) of a ladder checkpoint whose ``anchored_reasoning.json`` ``accepts``;
    otherwise exits naming ``what`` it should have been."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import anchored_reasoning.models  # noqa: F401  (registers shift-gpt2)
    from anchored_reasoning.checkpoints import read_checkpoint_meta
    from anchored_reasoning.methods import get_method

    meta = read_checkpoint_meta(path)
    if not meta or not accepts(meta):
        raise SystemExit(f"{path}: not {what} (anchored_reasoning.json says {meta and meta.get('method')!r})")
    method = get_method(meta["method"], style=meta.get("style", "trained"), **meta.get("method_options", {}))
    return meta, method, AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()


def write_readings(args, results: dict[str, Any], t0: float, module: str) -> None:
    """The JSON of a readings script: its runs, the ladder setup, machine, date, command and wall time."""
    from anchored_reasoning.machine import machine_info

    out = {"runs": results, "setup": {"hops": args.hops, "eval_n_per_depth": args.eval_n, "train_n": args.train_n},
           "machine": {**machine_info(), "note": f"{args.threads} thread(s)"}, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": f"python -m {module} " + " ".join(sys.argv[1:]), "wall_seconds": round(time.monotonic() - t0, 1)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    import torch

    from anchored_reasoning.eval.records import load_records

    torch.set_num_threads(args.threads)
    t0 = time.monotonic()
    _, held, hops = ladder_problems(args.hops, args.eval_n, args.train_n)
    results: dict[str, Any] = {}
    for spec in args.run:
        label, _, path = spec.partition("=")
        meta, method, tok, model = load_checkpoint(path, lambda m: m.get("method", "").startswith("acot"), "an ACoT checkpoint")
        records = Path(path).parent / "eval_generated" / "records.jsonl"
        correct = {r["id"]: bool(r["correct"]) for r in load_records(records)} if records.is_file() else None
        rows = slot_readings(model, tok, method, held, hops, generate=args.generate)
        results[label] = {"checkpoint": path, "method": meta["method"], "method_options": meta.get("method_options"),
                          "by_hops": summarize(rows, correct), "_rows": rows}
        log.info("%s: %s", label, json.dumps({h: {"slots": [s["share"].get("right", 0.0) for s in v["slots"]],
                                                   "forced": v["forced_choice"], "greedy": v.get("greedy_recomputed")} for h, v in results[label]["by_hops"].items()}))
    write_readings(args, results, t0, "research.ladder.acot_slots")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
