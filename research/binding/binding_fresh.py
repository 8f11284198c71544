"""Does a backbone learn the ProsQA lookup when it cannot memorise? A plain PyTorch loop (no trainer) on
problems drawn fresh for every batch, with the binding probe and a fact-recall probe on held-out problems.

    OMP_NUM_THREADS=1 python -m research.binding.binding_fresh --label logic-gpt2 --steps 12000
    OMP_NUM_THREADS=1 python -m research.binding.binding_fresh --label llama-rope --llama 4 128 4 --steps 12000
    OMP_NUM_THREADS=1 python -m research.binding.binding_fresh --label recall-drill --recall 0.5 --steps 12000
        # each adds its curve to research/binding/results/binding_fresh.json (rewritten at every evaluation,
        # so a run stopped early keeps what it measured, with the step it reached)

Issue 10 found that fine-tuned models do not read the asked entity, and one suspect was memorisation:
a fixed training set of a few thousand problems, learnt by heart. Here every training problem is new
(the generator at the ladder's shortcut-free size, ``--hops``), so the only way down is the rule.

Held-out problems (seeds 10000+, never drawn for training) are scored by forced choice: the gold
target is teacher-forced up to the answer word, and the option with the larger logit is the pick.
Per depth: ``acc`` (the pick is right), ``flip`` (asked about the other entity, options unchanged,
the pick changes), ``both`` (right on the problem and on its swap: the probe's "reads the entity").
``--recall R`` makes a share R of every batch a fact-recall drill: the facts, then each fact again in
a new order, with the loss on each re-stated fact's object only -- a dense version of the lookup a
derivation step needs (about ten lookups per sequence instead of one answer). ``recall_hit`` (always
reported) is the share of re-stated facts of held-out problems whose greedy object is one of that
subject's objects in the facts. Its floor, ``recall_floor``, is what a model that ignores the subject
scores by always naming the problem's most frequent object (about 0.69 on 1-hop problems, where most
facts share a subject): only ``recall_hit`` above ``recall_floor`` is a lookup.
``--annotate`` adds ``recall_floor`` to the runs already in ``--out`` (same held-out problems).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "results" / "binding_fresh.json"

from anchored_reasoning.train.data.collate import IGNORE, TokenizedExample, pad_batch, tokenize_rendered

from research.binding._fresh_loop import build_model, optimizer, run_record, save, train_step


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--label", required=True, help="this run's key in the results file")
    p.add_argument("--hops", type=int, nargs="+", default=[1], help="ladder depths to train and score")
    p.add_argument("--method", default="nocot", help="answer format (nocot or cot, trained style)")
    p.add_argument("--steps", type=int, default=12000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--eval-n", type=int, default=100, help="held-out problems per depth")
    p.add_argument("--init", default="logic-gpt2", help="backbone (alias or directory); its tokenizer is used")
    p.add_argument("--llama", nargs=3, type=int, metavar=("LAYERS", "HIDDEN", "HEADS"),
                   help="train a Llama (RoPE) of this shape from scratch instead, with --init's tokenizer")
    p.add_argument("--shift", type=int, default=0, metavar="N",
                   help="token shift: add projections of the N previous tokens to each input embedding "
                        "(anchored_reasoning.models.shift)")
    p.add_argument("--recall", type=float, default=0.0, help="share of each batch that is a fact-recall drill")
    p.add_argument("--recall-prefix", default="### ", help="each re-stated fact starts with this (the answer marker)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--annotate", action="store_true", help="only add recall_floor to the runs in --out, no training")
    return p.parse_args(argv)


def split_facts(question: str) -> list[str]:
    """The facts of a ProsQA question ("... Bob is a x. Is Bob a y or z?" -> ["... .", "Bob is a x."])."""
    body = question[: question.rindex("?")].rsplit(".", 1)[0]
    return [f.strip() + "." for f in body.split(".") if f.strip()]


def objects_by_subject(facts: list[str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for fact in facts:
        head, obj = fact[:-1].rsplit(" ", 1)
        out.setdefault(head, set()).add(obj)
    return out


def recall_doc(tok, facts: list[str], rng: random.Random, prefix: str) -> tuple[list[int], list[int], list[str]]:
    """Token ids and labels of a recall drill: the facts, then each again (shuffled) as ``prefix`` +
    fact, labelled at its object's first token only. Also returns each re-stated fact's subject."""
    ids = list(tok(" ".join(facts) + "\n")["input_ids"])
    labels = [IGNORE] * len(ids)
    newline = tok("\n", add_special_tokens=False)["input_ids"]
    heads = []
    for fact in rng.sample(facts, len(facts)):
        head, obj = fact[:-1].rsplit(" ", 1)
        h = tok(prefix + head, add_special_tokens=False)["input_ids"]
        o = tok(" " + obj + ".", add_special_tokens=False)["input_ids"]
        ids += h + o + newline
        labels += [IGNORE] * len(h) + [o[0]] + [IGNORE] * (len(o) - 1 + len(newline))
        heads.append(head)
    return ids, labels, heads


def recall_floor(facts: list[str]) -> tuple[int, int]:
    """(hits, facts) of naming the problem's most frequent object for every re-stated fact: no subject read."""
    objects = [f[:-1].rsplit(" ", 1)[1] for f in facts]
    top = max(objects, key=objects.count)
    valid = objects_by_subject(facts)
    return sum(top in valid[f[:-1].rsplit(" ", 1)[0]] for f in facts), len(facts)


def held_out(hops: list[int], eval_n: int) -> list[tuple[dict, dict, int]]:
    """(row, entity-swapped row, hops) of the held-out problems (seeds 10000 + depth, never trained on)."""
    from anchored_reasoning.generators.prosqa import generate_rows, hops_of, ladder_size, swapped_row

    out = []
    for h in hops:
        for row in generate_rows(eval_n, seed=10_000 + h, **ladder_size(h)):
            swap = swapped_row(row)
            if swap is not None:
                out.append((row, swap, hops_of(row)))
    return out


def floors(held: list[tuple[dict, dict, int]], hops: list[int]) -> dict[str, float]:
    out = {}
    for h in hops:
        pairs = [recall_floor(split_facts(row["question"])) for row, _, d in held if d == h]
        out[str(h)] = round(sum(k for k, _ in pairs) / max(sum(m for _, m in pairs), 1), 4)
    return out


class Bench:
    def __init__(self, args: argparse.Namespace):
        import torch
        from transformers import AutoTokenizer

        from anchored_reasoning.generators.prosqa import generate_rows, ladder_size
        from anchored_reasoning.methods import get_method
        from anchored_reasoning.models.zoo import resolve_model
        from anchored_reasoning.tasks import get_task

        self.args, self.torch = args, torch
        torch.manual_seed(args.seed)
        self.tok = AutoTokenizer.from_pretrained(resolve_model(args.init))
        self.model = build_model(args.init, self.tok, llama=args.llama, shift=args.shift)
        self.task, self.method = get_task("prosqa"), get_method(args.method, style="trained")
        self.ladder_size, self.generate_rows = ladder_size, generate_rows
        self.held = held_out(args.hops, args.eval_n)

    def encode(self, row) -> TokenizedExample:
        from anchored_reasoning.generators.prosqa import rows_to_examples

        return tokenize_rendered(self.method.render(rows_to_examples([row])[0], self.task), self.tok, ant_id=None)

    def train_batch(self, rng: random.Random):
        seqs = []
        n_recall = int(round(self.args.batch_size * self.args.recall))
        for i in range(self.args.batch_size):
            size = self.ladder_size(rng.choice(self.args.hops))
            row = self.generate_rows(1, seed=rng.randrange(10**9), **size)[0]
            if i < n_recall:
                ids, labels, _ = recall_doc(self.tok, split_facts(row["question"]), rng, self.args.recall_prefix)
                seqs.append(TokenizedExample(ids, labels, [IGNORE] * len(ids)))
            else:
                seqs.append(self.encode(row))
        batch = pad_batch(seqs, self.tok.eos_token_id)
        return batch["input_ids"], batch["attention_mask"], batch["labels"]

    def context_ids(self, prompt: str, target_prefix: str) -> list[int]:
        return self.tok(prompt)["input_ids"] + self.tok(target_prefix.rstrip(" "), add_special_tokens=False)["input_ids"]

    def pick(self, row) -> tuple[int, int]:
        """(picked option index, gold option index) by forced choice at the answer word."""
        from anchored_reasoning.generators.prosqa import rows_to_examples

        r = self.method.render(rows_to_examples([row])[0], self.task)
        answer = row["answer"].rstrip(".").split()[-1]
        q = row["question"]
        options = q[q.rindex(" a ") + 3:].rstrip("?").split(" or ")
        # the context ends at the token before the answer word ("... is a"), as in training: a trailing
        # space would tokenize alone (" "), a context the model never saw before an object
        ids = self.context_ids(r.prompt, r.target[: r.target.rindex(answer)])
        first = [self.tok(" " + o, add_special_tokens=False)["input_ids"][0] for o in options]
        logits = self.model(self.torch.tensor([ids])).logits[0, -1]
        return int(logits[first[1]] > logits[first[0]]), options.index(answer)

    def recall_hits(self, row, rng: random.Random) -> tuple[int, int]:
        facts = split_facts(row["question"])
        ids, labels, heads = recall_doc(self.tok, facts, rng, self.args.recall_prefix)
        valid = objects_by_subject(facts)
        preds = self.model(self.torch.tensor([ids])).logits[0].argmax(-1).tolist()
        # labels[p] is the object's first token, predicted at position p - 1
        positions = [p for p, lab in enumerate(labels) if lab != IGNORE]
        hits = 0
        for head, p in zip(heads, positions):
            word = self.tok.decode([preds[p - 1]]).strip()
            hits += word in valid[head]
        return hits, len(positions)

    def evaluate(self) -> dict[str, Any]:
        self.model.eval()
        rng = random.Random(1)
        out: dict[str, Any] = {}
        with self.torch.no_grad():
            for h in self.args.hops:
                acc = both = flip = n = hit = facts = 0
                for row, swap, hops in self.held:
                    if hops != h:
                        continue
                    (p, g), (ps, gs) = self.pick(row), self.pick(swap)
                    n += 1
                    acc += p == g
                    both += p == g and ps == gs
                    flip += p != ps
                    k, m = self.recall_hits(row, rng)
                    hit, facts = hit + k, facts + m
                out[str(h)] = {"acc": acc / n, "both": both / n, "flip": flip / n, "recall_hit": hit / max(facts, 1), "n": n}
        self.model.train()
        return out


def main(argv=None) -> int:
    import torch

    args = parse_args(argv)
    if args.annotate:
        path = Path(args.out)
        results = json.loads(path.read_text())
        for run in results["runs"].values():
            a = run["args"]
            run["recall_floor"] = floors(held_out(a["hops"], a["eval_n"]), a["hops"])
        path.write_text(json.dumps(results, indent=1) + "\n")
        return 0
    torch.set_num_threads(1)
    bench = Bench(args)
    opt, sched = optimizer(bench.model, args.lr, args.warmup)
    rng = random.Random(args.seed)
    run = {**run_record(args, bench.model, "binding_fresh.py", argv),
           "chance": 0.5, "recall_floor": floors(bench.held, args.hops), "curve": []}
    t0, loss_sum = time.time(), 0.0
    for step in range(1, args.steps + 1):
        ids, mask, labels = bench.train_batch(rng)
        loss_sum += train_step(bench.model, opt, sched, ids, mask, labels)
        if step == 1 or step % args.eval_every == 0 or step == args.steps:
            point = {"step": step, "problems_seen": step * args.batch_size, "loss": round(loss_sum / (1 if step == 1 else args.eval_every), 4),
                     "seconds": round(time.time() - t0, 1), "eval": bench.evaluate()}
            loss_sum = 0.0
            run["curve"].append(point)
            run["reached_step"] = step
            save(Path(args.out), args.label, run)
            print(json.dumps(point), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
