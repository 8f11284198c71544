"""Can a backbone learn associative recall in the ProsQA sentence form? The lookup every derivation step
needs, on its own: a plain PyTorch loop on fresh synthetic documents, scored on held-out ones.

    OMP_NUM_THREADS=1 python -m research.binding.assoc_recall --label logic-gpt2 --steps 12000
    OMP_NUM_THREADS=1 python -m research.binding.assoc_recall --label llama-2x128 --llama 2 128 4 --lr 3e-3
        # each adds its curve to research/binding/results/assoc_recall.json (rewritten at every evaluation)

A document is ``k`` facts with distinct entity subjects, ``"Bob is a wumpus. Tom is a lempus. ..."``,
then ``k`` queries ``"\\n### Bob is a"`` whose next word (the only labelled token) is that subject's
object: the No-CoT answer form of a 1-hop ProsQA problem without its question and options. With
``--queries replace`` the queried subjects are drawn with replacement, so nothing but the subject tells
the object apart and chance is the mean of 1/k; with ``--queries shuffle`` every fact is asked once in a
random order and a model that names an object not yet asked, ignoring the subject, already scores the
``floor`` reported beside the accuracy (mean of 1/(k - j) at the j-th query). ``--format adjacent``
drops " is a" (``"Bob wumpus."``): the classic key-value recall, key right before value.
``--direction reverse`` asks the other way (distinct objects; ``"\\n### wumpus:"`` -> ``Bob``): the look-up a walk
back from an option needs; ``--save DIR`` keeps the trained model (``assoc_recall_reverse.json``).

``binding_fresh.py`` asks the same of whole ProsQA problems; this isolates its first step.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "results" / "assoc_recall.json"

from anchored_reasoning.train.data.collate import IGNORE, TokenizedExample, pad_batch

from research.binding._fresh_loop import build_model, optimizer, run_record, save, train_step


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--label", required=True, help="this run's key in the results file")
    p.add_argument("--init", default="logic-gpt2", help="backbone (alias or directory); its tokenizer is used")
    p.add_argument("--scratch", action="store_true", help="--init's architecture, randomly initialised")
    p.add_argument("--llama", nargs=3, type=int, metavar=("LAYERS", "HIDDEN", "HEADS"),
                   help="a Llama (RoPE) of this shape from scratch, with --init's tokenizer")
    p.add_argument("--shift", type=int, default=0, metavar="N",
                   help="add learned projections of the N previous tokens' embeddings to each input embedding "
                        "(a token shift, as in RWKV or a short convolution): the subject 3 tokens back is then "
                        "in the object's own input")
    p.add_argument("--format", choices=("sentence", "adjacent"), default="sentence")
    p.add_argument("--queries", choices=("replace", "shuffle"), default="replace")
    p.add_argument("--direction", choices=("forward", "reverse"), default="forward",
                   help="reverse: distinct objects, queries \"\\n### wumpus:\" whose next word is the subject")
    p.add_argument("--k-min", type=int, default=2)
    p.add_argument("--k-max", type=int, default=6)
    p.add_argument("--steps", type=int, default=12000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--eval-docs", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--save", default=None, metavar="DIR",
                   help="save the trained model and its tokenizer here (e.g. a reverse-recall phase to fine-tune on)")
    return p.parse_args(argv)


class Docs:
    """Token-level document builder (every name is one token of the logic tokenizer)."""

    def __init__(self, tok, fmt: str, queries: str, k_min: int, k_max: int, direction: str = "forward"):
        from anchored_reasoning.generators.prosqa import CONCEPT_NAMES, ENTITY_NAMES

        def one(text: str) -> list[int]:
            return list(tok(text, add_special_tokens=False)["input_ids"])

        self.names = {n: one(" " + n) for n in ENTITY_NAMES + CONCEPT_NAMES}
        split = [n for n, ids in self.names.items() if len(ids) != 1]
        if split:
            raise ValueError(f"assoc_recall needs one-token names; this tokenizer splits {split[:5]}")
        self.entities, self.concepts = list(ENTITY_NAMES), list(CONCEPT_NAMES)
        if k_max > len(self.entities) or not 1 <= k_min <= k_max:
            raise ValueError(f"k must satisfy 1 <= k_min <= k_max <= {len(self.entities)}; got {k_min}..{k_max}")
        self.link = one(" is a") if fmt == "sentence" else []
        self.dot, self.mark, self.colon = one("."), one("\n###"), one(":")
        self.direction = direction
        self.bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
        self.queries, self.k_min, self.k_max = queries, k_min, k_max

    def make(self, rng: random.Random) -> tuple[TokenizedExample, int, list[int]]:
        """(example, k, order of the queried facts)."""
        k = rng.randint(self.k_min, self.k_max)
        subjects = rng.sample(self.entities, k)
        if self.direction == "reverse":  # distinct objects: the object names its one subject
            objects = rng.sample(self.concepts, k)
        else:
            objects = [rng.choice(self.concepts) for _ in subjects]
        ids = list(self.bos)
        for s, o in zip(subjects, objects):
            ids += self.names[s] + self.link + self.names[o] + self.dot
        labels = [IGNORE] * len(ids)
        order = [rng.randrange(k) for _ in range(k)] if self.queries == "replace" else rng.sample(range(k), k)
        for i in order:
            key, value = (objects[i], subjects[i]) if self.direction == "reverse" else (subjects[i], objects[i])
            q = self.mark + self.names[key] + (self.colon if self.direction == "reverse" else self.link)
            ids += q + self.names[value] + self.dot
            labels += [IGNORE] * len(q) + self.names[value] + [IGNORE] * len(self.dot)
        return TokenizedExample(ids, labels, [IGNORE] * len(ids)), k, order

    def floor(self, k: int, order: list[int]) -> float:
        """Expected hits of naming a random fact's object, not yet asked where queries cannot repeat."""
        if self.queries == "replace":
            return len(order) / k
        return sum(1.0 / (k - j) for j in range(len(order)))


def batch(docs: Docs, rng: random.Random, n: int, pad_id: int):
    made = [docs.make(rng) for _ in range(n)]
    b = pad_batch([m[0] for m in made], pad_id)
    return b, [(m[1], m[2]) for m in made]


def evaluate(model, docs: Docs, n: int, pad_id: int) -> dict[str, Any]:
    import torch

    model.eval()
    rng = random.Random(123_456)  # held-out documents: the same every evaluation, never trained on
    hits = total = 0
    floor = 0.0
    by_k: dict[int, list[int]] = {}
    with torch.no_grad():
        for start in range(0, n, 50):
            b, meta = batch(docs, rng, min(50, n - start), pad_id)
            pred = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.argmax(-1)
            for row, (k, order) in enumerate(meta):
                lab = b["labels"][row, 1:]
                sel = lab != IGNORE
                ok = int((pred[row, :-1][sel] == lab[sel]).sum())
                hits, total, floor = hits + ok, total + len(order), floor + docs.floor(k, order)
                acc = by_k.setdefault(k, [0, 0])
                acc[0], acc[1] = acc[0] + ok, acc[1] + len(order)
    model.train()
    return {"acc": round(hits / total, 4), "floor": round(floor / total, 4), "queries": total,
            "by_k": {str(k): round(h / t, 4) for k, (h, t) in sorted(by_k.items())}}


def main(argv=None) -> int:
    import torch
    from transformers import AutoTokenizer

    from anchored_reasoning.models.zoo import resolve_model

    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(resolve_model(args.init))
    docs = Docs(tok, args.format, args.queries, args.k_min, args.k_max, args.direction)
    model = build_model(args.init, tok, llama=args.llama, scratch=args.scratch, shift=args.shift)
    model.train()
    pad_id = tok.eos_token_id
    opt, sched = optimizer(model, args.lr, args.warmup)
    rng = random.Random(args.seed)
    run = {**run_record(args, model, "assoc_recall.py", argv),
           "curve": [{"step": 0, "eval": evaluate(model, docs, args.eval_docs, pad_id)}]}
    t0, loss_sum = time.time(), 0.0
    for step in range(1, args.steps + 1):
        b, _ = batch(docs, rng, args.batch_size, pad_id)
        loss_sum += train_step(model, opt, sched, b["input_ids"], b["attention_mask"], b["labels"])
        if step % args.eval_every == 0 or step == args.steps:
            n = args.eval_every if step % args.eval_every == 0 else step % args.eval_every
            point = {"step": step, "loss": round(loss_sum / n, 4), "seconds": round(time.time() - t0, 1),
                     "eval": evaluate(model, docs, args.eval_docs, pad_id)}
            loss_sum = 0.0
            run["curve"].append(point)
            run["reached_step"] = step
            save(Path(args.out), args.label, run)
            print(json.dumps(point), flush=True)
    if args.save:
        model.save_pretrained(args.save)
        tok.save_pretrained(args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
