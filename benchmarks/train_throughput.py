"""Training throughput: the ACoT trainer against TRL's plain ``SFTTrainer`` and a plain PyTorch loop, same model,
same batch, same threads, interleaved in one process.

    OMP_NUM_THREADS=1 python -m benchmarks.train_throughput

Model: the shipped ``logic-gpt2`` (0.9M parameters) with the ACoT method's tokens; batch: ``--batch-size``
generated ProsQA problems rendered as ACoT (6 anchor slots, full CoT target) by the library's collator. One step
is a forward and backward pass plus an AdamW step (lr 5e-5 everywhere):

* ``acot``: ``AnchoredSFTTrainer.training_step`` (LM loss + anchor loss) on the full ACoT batch;
* ``trl_sft``: TRL ``SFTTrainer.training_step`` (its own LM loss) on the batch's ids, mask and labels;
* ``plain``: ``model(input_ids, attention_mask, labels).loss.backward()`` and ``torch.optim.AdamW``.

Each repeat runs the three in a rotating order; medians of step times, tokens/s (real tokens in the batch over
the step) and the ratios are written to benchmarks/results/train_throughput.json; a regression shows as a ratio
rising above 1.10.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import write_result


def build(batch_size: int, work: Path):
    """(ACoT trainer, TRL trainer, plain (model, optimizer), ACoT batch, LM batch), each with its own model copy."""
    from trl import SFTConfig, SFTTrainer

    from anchored_reasoning.generators.prosqa import generate_dataset
    from anchored_reasoning.methods import get_method
    from anchored_reasoning.train.data.collate import AnchoredCollator, examples_dataset
    from anchored_reasoning.train.pipelines.ar import build_model_and_tokenizer, training_texts
    from anchored_reasoning.train.trainers.acot_trainer import AnchoredSFTConfig, AnchoredSFTTrainer

    examples = generate_dataset(batch_size, seed=999, split="bench-throughput")
    method = get_method("acot", style="trained", k=6)
    model, tok = build_model_and_tokenizer({"name": "logic-gpt2"}, training_texts(examples, method, "prosqa"), work, 0,
                                           extra_tokens=getattr(method, "added_tokens", ()))
    ds = examples_dataset(examples)
    batch = AnchoredCollator(tok, method, task="prosqa")([{"example": r} for r in ds["example"]])

    def copy():
        m = type(model)(model.config)
        m.load_state_dict(model.state_dict())
        return m

    common = dict(output_dir=str(work / "o"), report_to="none", per_device_train_batch_size=batch_size,
                  learning_rate=5e-5, gradient_checkpointing=False, bf16=False, use_cpu=True, disable_tqdm=True)
    acot = AnchoredSFTTrainer(model=model, args=AnchoredSFTConfig(**common), train_dataset=ds,
                              data_collator=lambda rows: rows, processing_class=tok)
    trl = SFTTrainer(model=copy(), args=SFTConfig(**common, dataset_kwargs={"skip_prepare_dataset": True},
                                                  remove_unused_columns=False),
                     train_dataset=ds, data_collator=lambda rows: rows, processing_class=tok)
    for t in (acot, trl):
        t.create_optimizer_and_scheduler(num_training_steps=1000)
        t.current_gradient_accumulation_steps = 1  # set by Trainer's own loop, which is not used here
    plain = copy().train()
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=5e-5)
    lm_batch = {k: batch[k] for k in ("input_ids", "attention_mask", "labels")}
    return acot, trl, (plain, plain_opt), dict(batch), lm_batch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    ap.add_argument("--work", default="runs/train_throughput")
    ap.add_argument("--out", default="benchmarks/results/train_throughput.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    acot, trl, (plain, plain_opt), acot_batch, lm_batch = build(args.batch_size, Path(args.work))

    def trainer_step(trainer, batch):
        trainer.training_step(trainer.model, {k: v.clone() for k, v in batch.items()})
        trainer.optimizer.step()
        trainer.optimizer.zero_grad()

    def plain_step(batch):
        plain(**batch).loss.backward()
        plain_opt.step()
        plain_opt.zero_grad()

    sides = {"acot": lambda: trainer_step(acot, acot_batch), "trl_sft": lambda: trainer_step(trl, lm_batch),
             "plain": lambda: plain_step(lm_batch)}
    for _ in range(3):  # warm-up
        for step in sides.values():
            step()
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {k: [] for k in sides}
    names = list(sides)
    for i in range(args.repeats):
        for name in names[i % 3:] + names[:i % 3]:  # rotating order: no side always first
            t0 = time.perf_counter()
            sides[name]()
            times[name].append(time.perf_counter() - t0)
    tokens = int(lm_batch["attention_mask"].sum())
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = {f"{a}_over_{b}": round(statistics.median([x / y for x, y in zip(times[a], times[b])]), 3)
             for a, b in (("acot", "trl_sft"), ("acot", "plain"), ("trl_sft", "plain"))}
    print({k: f"{1000 * v:.1f} ms, {tokens / v:.0f} tokens/s" for k, v in med.items()}, ratio, flush=True)
    write_result(args.out, {
        "benchmark": "train_throughput",
        "command": f"OMP_NUM_THREADS={args.threads} python -m benchmarks.train_throughput " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
                    "torch": torch.__version__,
                    "shared": "the machine is shared with other busy processes: 1-minute load averages before/after",
                    "loadavg_1min_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)]},
        "model": "logic-gpt2", "batch": {"examples": args.batch_size, "tokens": tokens}, "repeats": args.repeats,
        "step_ms_median": {k: round(1000 * v, 2) for k, v in med.items()},
        "tokens_per_second": {k: round(tokens / v, 1) for k, v in med.items()},
        "ratios_median_of_pairs": ratio,
        "goal": "acot_over_trl_sft <= 1.10",
        "goal_met": ratio["acot_over_trl_sft"] <= 1.10,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
