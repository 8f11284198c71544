"""Does fine-tuning keep what the backbone does zero-shot? Binding and accuracy by depth, before and after.

    python -m research.binding.finetune_binding --lrs 1e-3 3e-4 1e-4 --steps 120 --threads 1
    python -m research.binding.finetune_binding --lrs 1e-3 --steps 400 --out /tmp/fb.json     # one more point
    python -m research.binding.finetune_binding --option answer_line=false --out /tmp/fb.json  # CoT without its answer line

The demo's CoT (the written depth-first search, steps joined by a space; ``anchored_reasoning.demo``; another
trained method and its options with ``--method`` and ``--option key=value``) is
fine-tuned from ``--backbone`` (default: the demo's, ``logic-gpt2-search``) for each learning rate and step
budget, through the ``ar`` trainer, on the demo's 1-3-hop problems; each model is graded greedily on
``--eval-n`` held-out problems (equal shares per depth) and under the binding probe (the same problems
asked about the other entity: does the answer flip?). The backbone itself is read zero-shot on the same
problems in its pretraining format ("<question>\\n<search> ### <answer>", ``backbone_probe.probe_set``),
so every fine-tuned figure has its zero-shot counterpart beside it. Chance: 0.5 right; a model that
ignores the asked entity flips 0. Writes one JSON (default
``research/binding/results/finetune_binding.json``).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path
from urllib.parse import quote

from anchored_reasoning.machine import machine_info



def zero_shot(backbone: str, held: list, hops: dict[str, int], max_new_tokens: int) -> dict[str, dict]:
    """The backbone in its own format, per depth: right (with its 95% interval) and flips."""
    from research.backbones import backbone_probe

    from anchored_reasoning.backends import get_backend
    from anchored_reasoning.models.zoo import resolve_model

    be = get_backend("hf", resolve_model(backbone), batch_size=64, device="cpu")
    out = {}
    for h in sorted(set(hops.values())):
        r = backbone_probe.probe_set(be, [e for e in held if hops[e.id] == h], max_new_tokens)
        out[str(h)] = {"right": r["answer_right"], "right_ci95": r["answer_right_ci95"], "flips": r["answer_flips"],
                       "n": r["n"]}
    return out


def fine_tuned(lr: float, steps: int, args, options: dict, train: list, held: list, hops: dict[str, int]) -> dict:
    """One fine-tune (resumed or reused if its folder holds it) and its figures per depth."""
    from anchored_reasoning import demo
    from anchored_reasoning.eval.probes import binding_probe_examples
    from anchored_reasoning.train.pipelines import ar

    settings = demo.DemoSettings(seed=args.seed, learning_rate=lr, backbone=args.backbone)
    run = Path(args.work) / run_name(args.method, args.option, lr, steps)
    recipe = demo.method_recipe(args.method, settings, None, run / "model", 0.0, options=options or None)
    recipe["training"].update(max_steps=steps, max_train_seconds=None)
    t0 = time.monotonic()
    ckpt = ar.run_with_examples(recipe, train, [])
    train_s = time.monotonic() - t0
    ev = demo.evaluate(str(ckpt), held, run / "eval_generated", args.max_new_tokens, hops=hops)
    pr = demo.probe(str(ckpt), binding_probe_examples(held), run, args.max_new_tokens, hops)
    return {"lr": lr, "steps": steps, "train_seconds": round(train_s, 1), "truncated": ev["truncated"],
            "by_hops": {h: {"right": ev["by_hops"][h]["accuracy"], "right_ci95": ev["by_hops"][h]["accuracy_ci95"],
                            "flips": pr["by_hops"][h]["flip_rate"]["mean"],
                            "flips_ci95": [pr["by_hops"][h]["flip_rate"]["ci_low"], pr["by_hops"][h]["flip_rate"]["ci_high"]],
                            "n": ev["by_hops"][h]["n"]} for h in sorted(ev["by_hops"])}}


def method_options(pairs: list[str]) -> dict:
    """``["answer_line=false", "k=3"]`` -> ``{"answer_line": False, "k": 3}``, read as ``--method-arg`` is
    (``anchored_reasoning.options``); the demo's options for the method are replaced by these where any are given."""
    from anchored_reasoning.errors import ConfigError
    from anchored_reasoning.options import parse_key_values

    try:
        return parse_key_values(pairs, "--option")
    except ConfigError as exc:
        raise SystemExit(str(exc)) from None


def run_name(method: str, pairs: list[str], lr: float, steps: int) -> str:
    """The run's folder: the demo's CoT keeps the name earlier results were written under. Option values
    are escaped (``step_separator=" "`` gives ``step_separator-+22+20+22``): no quote, space or slash
    reaches the path, and two different values never share a folder."""
    escaped = [key + "-" + quote(value, safe="").replace("%", "+")
               for key, _, value in (pair.partition("=") for pair in sorted(pairs))]
    tag = "" if method == "cot" and not pairs else "_".join([method, *escaped]) + "_"
    return f"{tag}lr{lr:g}_steps{steps}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backbone", default="logic-gpt2-search")
    p.add_argument("--method", default="cot", help="the trained method fine-tuned (default: the demo's CoT)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a method option (repeatable; JSON values: answer_line=false, k=3); replaces the demo's")
    p.add_argument("--lrs", nargs="+", type=float, default=[1e-3, 3e-4, 1e-4])
    p.add_argument("--steps", nargs="+", type=int, default=[120])
    p.add_argument("--seed", type=int, default=5, help="the problems' and the run's seed (the suite's test uses 5)")
    p.add_argument("--eval-n", type=int, default=240, help="held-out problems, equal shares over 1-3 hops")
    p.add_argument("--max-new-tokens", type=int, default=160)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work", default="runs/finetune_binding")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "finetune_binding.json"))
    p.add_argument("--machine-note", default=None)
    args = p.parse_args(argv)
    import torch

    from anchored_reasoning import demo
    from anchored_reasoning.eval.probes import hops_of

    options = method_options(args.option)  # a malformed --option fails before any work
    torch.set_num_threads(args.threads)
    t0 = time.monotonic()
    steps_max = max(args.steps)
    train, held = demo.make_data(demo.DemoSettings(train_n=steps_max * 32, eval_n=args.eval_n, seed=args.seed,
                                                   backbone=args.backbone))
    hops = {ex.id: hops_of(ex) for ex in held}
    result = {"backbone": args.backbone, "zero_shot": zero_shot(args.backbone, held, hops, args.max_new_tokens),
              "fine_tuned": [fine_tuned(lr, s, args, options, train, held, hops) for s in args.steps for lr in args.lrs],
              "chance": {"right": 0.5, "flips": "0 for a model that ignores the asked entity"},
              "setup": {"method": args.method, "options": options, "trace": "dfs",
                        "step_separator": options.get("step_separator", demo.DemoSettings().step_separator), "seed": args.seed, "eval_n": args.eval_n,
                        "batch_size": demo.DemoSettings().batch_size, "max_new_tokens": args.max_new_tokens},
              "machine": machine_info(torch_threads=args.threads, **({"note": args.machine_note} if args.machine_note else {})),
              "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "wall_seconds": round(time.monotonic() - t0, 1),
              "command": "python -m research.binding.finetune_binding " + " ".join(sys.argv[1:] if argv is None else argv)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for h, z in result["zero_shot"].items():
        print(f"zero-shot {h} hops: right {z['right']:.2f} flips {z['flips']:.2f}")
    for r in result["fine_tuned"]:
        print(f"lr {r['lr']:g} {r['steps']} steps:",
              {h: (round(v["right"], 2), round(v["flips"], 2)) for h, v in r["by_hops"].items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
