"""What a trained Coconut model's continuous thoughts carry, and whether its answer reads them.

    python -m research.ladder.coconut_thoughts --run s0=/work/runs/ladder_coconut/coconut/seed0/model \\
        --out research/ladder/results/coconut_thoughts.json

For every checkpoint (a Coconut model of the depth ladder, evaluated at its last stage: every step replaced
by the thoughts) and the ladder's held-out problems (the same generator seed and sizes as
``benchmarks/depth_ladder.py``), two readings:

1. **Does the answer read the thoughts**: forced-choice accuracy (the right and the wrong answer line scored
   by the model, teacher-forced after the prompt) with the thoughts as the model computes them (``intact``:
   each ``<thought>`` is the last hidden state fed back, :func:`anchored_reasoning.backends.latent.latent_forward`),
   with every thought left as the ``<thought>`` token's own embedding (``constant``: no state fed back, what
   pause-as-thought sees), and with the thoughts of another problem of the same depth (``donor``). If the
   three agree, the thoughts carry nothing the answer uses; ``changed`` counts the answers that differ
   from ``intact``.
2. **What each thought holds** (the LM head applied to the fed-back state, the token it would have written
   there): the node the replaced step reaches (``next``), another node of the right path (``path``), a concept
   on no path to the answer (``graph``), or no concept of the problem (``none``).

Writes one JSON with both per checkpoint and per depth.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from collections import defaultdict
from typing import Any

from benchmarks.depth_ladder import ladder_problems  # (the ladder's own problems)
from research.ladder.acot_slots import concept_roles, load_checkpoint, write_readings, wrong_option

log = logging.getLogger("coconut_thoughts")
MODES = ("intact", "constant", "donor")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", action="append", required=True, help="LABEL=CHECKPOINT_DIR (repeatable)")
    p.add_argument("--hops", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--eval-n", type=int, default=50, help="held-out problems per depth (the ladder's)")
    p.add_argument("--train-n", type=int, default=24000, help="the ladder's training problems (held-out problems exclude them)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="research/ladder/results/coconut_thoughts.json")
    return p.parse_args(argv)


def continuation_logprob(model, seq, thought: int, mode: str, donor=None) -> Any:
    """Log-probabilities (L, V) of every next token of the one-row ``seq`` with the thoughts ``mode``-filled,
    and the thought states used ((n, hidden); None for ``constant``)."""
    import torch

    from anchored_reasoning.backends.latent import input_embeddings, latent_forward

    mask = torch.ones_like(seq)
    with torch.no_grad():
        if mode == "intact":
            passes = latent_forward(model, seq, mask, thought, cache=False, logits=True)
            return passes.logits[0].log_softmax(-1), passes.thoughts
        if mode == "constant":
            return model(input_ids=seq, attention_mask=mask).logits[0].log_softmax(-1), None
        embeds = input_embeddings(model, seq, mask).clone()
        cols = torch.nonzero(seq[0] == thought).flatten()
        embeds[0, cols] = donor
        return model(inputs_embeds=embeds, attention_mask=mask).logits[0].log_softmax(-1), donor


def thought_roles(model, tok, states, example) -> list[str]:
    """For each thought state: what the LM head would write from it (see the module docstring)."""
    from anchored_reasoning.anchors import logic_anchors

    roles = concept_roles(example)
    path = logic_anchors(example.steps, max_anchors=None)
    head = model.get_output_embeddings()
    out = []
    for i, state in enumerate(states):
        pred = tok.decode([int(head(state).argmax())]).strip()
        nxt = path[i + 1] if i + 1 < len(path) else None
        out.append("next" if pred == nxt else "path" if roles.get(pred) == "path" else "graph" if pred in roles else "none")
    return out


def readings(model, tok, method, examples, hops: dict[str, int]) -> list[dict[str, Any]]:
    """Per example: forced choice under each mode, and the roles of its intact thoughts."""
    import torch

    from anchored_reasoning.backends.latent import thought_id
    from anchored_reasoning.methods.answers import answer_line

    thought = thought_id(tok)
    rendered = [(ex, method.render(ex)) for ex in examples]
    by_depth: dict[int, list[int]] = defaultdict(list)
    for i, ex in enumerate(examples):
        by_depth[hops[ex.id]].append(i)
    intact_states: dict[int, Any] = {}
    rows = []
    for mode in MODES:  # intact first: the donor mode borrows those states
        for i, (ex, r) in enumerate(rendered):
            prompt_ids = list(tok(r.prompt)["input_ids"])
            right_line = answer_line(ex)
            wrong_line = right_line[: right_line.rfind(" ") + 1] + wrong_option(ex) + "."
            scores = []
            for line in (right_line, wrong_line):
                target = r.target[: len(r.target) - len(right_line)] + line
                cand = list(tok(target, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
                seq = torch.tensor([prompt_ids + cand])
                donor = None
                if mode == "donor":
                    group = by_depth[hops[ex.id]]
                    donor = intact_states[group[(group.index(i) + 1) % len(group)]]
                logprob, states = continuation_logprob(model, seq, thought, mode, donor)
                start = len(prompt_ids) - (seq.shape[1] - logprob.shape[0])
                scores.append(sum(float(logprob[start - 1 + j, t]) for j, t in enumerate(cand)))
                if mode == "intact" and line is right_line:
                    intact_states[i] = states
            if mode == "intact":
                rows.append({"id": ex.id, "hops": hops[ex.id], "choice": {},
                             "thoughts": thought_roles(model, tok, intact_states[i], ex)})
            rows[i]["choice"][mode] = scores[0] > scores[1]
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by_h: dict[int, list] = defaultdict(list)
    for row in rows:
        by_h[row["hops"]].append(row)
    out: dict[str, Any] = {}
    for h, rs in sorted(by_h.items()):
        choice = {m: round(sum(r["choice"][m] for r in rs) / len(rs), 3) for m in MODES}
        changed = {m: sum(r["choice"][m] != r["choice"]["intact"] for r in rs) for m in MODES if m != "intact"}
        n_thoughts = len(rs[0]["thoughts"])
        roles = []
        for k in range(n_thoughts):
            counts = defaultdict(int)
            for r in rs:
                counts[r["thoughts"][k]] += 1
            roles.append({kind: round(v / len(rs), 3) for kind, v in sorted(counts.items())})
        out[str(h)] = {"n": len(rs), "forced_choice": {**choice, "changed_vs_intact": changed}, "thought_roles": roles}
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    import torch

    torch.set_num_threads(args.threads)
    t0 = time.monotonic()
    _, held, hops = ladder_problems(args.hops, args.eval_n, args.train_n)
    results: dict[str, Any] = {}
    for spec in args.run:
        label, _, path = spec.partition("=")
        meta, method, tok, model = load_checkpoint(
            path, lambda m: m.get("method") == "coconut" and (m.get("method_options") or {}).get("thought", "latent") == "latent",
            "a Coconut checkpoint with continuous thoughts")
        rows = readings(model, tok, method, held, hops)
        results[label] = {"checkpoint": path, "method_options": meta.get("method_options"),
                          "by_hops": summarize(rows), "_rows": rows}
        log.info("%s: %s", label, json.dumps({h: v["forced_choice"] for h, v in results[label]["by_hops"].items()}))
    write_readings(args, results, t0, "research.ladder.coconut_thoughts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
