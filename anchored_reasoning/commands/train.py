"""``anchored-reasoning train RECIPE [key=value ...]``: train from a YAML recipe.

    anchored-reasoning train prosqa_gpt2_acot
    anchored-reasoning train train/tiny_test.yaml training.max_steps=20 output_dir=/tmp/tiny
    accelerate launch --config_file train/accelerate/ddp_cpu.yaml -m anchored_reasoning.cli train tiny_test

RECIPE is a file path or the name of a recipe in ``train/`` (``$ANCHORED_REASONING_TRAIN_DIR`` first).
The recipe's ``trainer:`` key picks the trainer (``ar`` for causal LMs, ``diffusion`` for MDLM/ADLM,
``tadm``, ``grpo``); overrides are dotted keys with YAML values. Every key and every value is checked
before any data or model loads: an unknown key is named with a close match, and a value of the wrong
type or out of range (``training.max_steps=-5``, ``training.learning_rate=1e-3e``) fails naming the key,
the value and what it accepts. ``--dry-run`` runs the same checks and prints the resolved recipe.

Checkpoints are saved along the way into ``output_dir`` (``training.save_steps``,
``training.save_every_minutes``, ``training.save_total_limit``); rerunning the same command resumes
from the newest one, and a rerun with other settings is refused, naming the keys (docs/checkpoints.md).
The terminal shows one progress bar; every log line goes to ``<output_dir>/train_log.jsonl`` and
``train.log``. ``--quiet``: no bar, warnings only.
"""
from __future__ import annotations

import argparse
import json
import sys

from anchored_reasoning.errors import ConfigError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a model from a YAML recipe (ACoT, CoT, pause, stepwise, diffusion)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("recipe", help="recipe file or name in train/ (e.g. prosqa_gpt2_acot)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. training.learning_rate=3e-4")
    p.add_argument("--dry-run", action="store_true", help="load, override and validate the recipe, print it, do not train")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bar and only warnings on the console (the run folder still gets the full log)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from anchored_reasoning.train import TRAINERS, get_trainer
    from anchored_reasoning.train.recipes import load_recipe, resolve, trainer_name as read_trainer

    recipe = load_recipe(args.recipe)
    trainer_name = read_trainer(recipe, args.overrides)  # the overrides are applied once, by the trainer's resolve
    if not trainer_name:
        raise ConfigError(f"recipe {recipe.get('_source', args.recipe)} has no 'trainer:' key "
                          f"({', '.join(TRAINERS)})")
    if args.dry_run:
        # the trainer's own resolver (its key schema + the value checks); ar's is recipes.resolve
        module = sys.modules[get_trainer(trainer_name).__module__]
        resolve_recipe = getattr(module, "resolve_recipe", None) or (lambda r, o: resolve(r, o, trainer=trainer_name))
        resolved = resolve_recipe(recipe, args.overrides)
        json.dump({k: v for k, v in resolved.items() if not str(k).startswith("_")}, sys.stdout, indent=2, default=str)
        print()
        return 0
    overrides = list(args.overrides)
    if getattr(args, "quiet", False):
        from anchored_reasoning.commands import quiet_console

        quiet_console()
        overrides.append("training.disable_tqdm=true")
    run = get_trainer(trainer_name)
    out = run(recipe, overrides)
    print(f"checkpoint: {out}")
    return 0
