"""ADLM vs MDLM: perplexity bound at equal training tokens and at equal training FLOPs, anchored vs
plain diffusion SFT on ProsQA, and each sampler's tokens/s at equal steps -- side by side, one run.

    OMP_NUM_THREADS=2 ANCHORED_REASONING_DATA=../shared/data python -m benchmarks.adlm_vs_mdlm

What it does (every budget is a flag; defaults are sized for a shared 2-core CPU, ~25 minutes):

1. **Perplexity.** A byte-level BPE (``--vocab``) is trained on ``--train-file`` (default WikiText-2
   *valid*), which is packed into ``--seq-len`` blocks. For each seed, an MDLM (``--layers`` blocks)
   and an ADLM (anchor network ``--layers`` blocks + denoiser ``--layers/2`` blocks, same width) are
   trained from scratch by :class:`DiffusionSFTTrainer` on the same blocks in the same order: MDLM
   with its NELBO, ADLM with ANELBO (gamma 3e-3 ramped over 0.3% of steps, tau = 5). LR is constant
   after warm-up, so the MDLM checkpoint at step N is the same as an N-step run. Both are scored by
   the NELBO perplexity bound on the first ``--test-tokens`` tokens of ``--test-file`` (default
   WikiText-2 *test*, a different split of the same corpus), with the same noise draws
   (``--t-samples`` stratified times per block, fixed seed):
   * equal tokens: ADLM and MDLM at ``--steps`` steps each;
   * equal FLOPs: MDLM at ``round(--steps x r)`` steps, where ``r`` = ADLM's training FLOPs per token
     over MDLM's (counted from the layer shapes: every matmul, attention included; ~1.5x at paper
     size, more at small width because ADLM has two vocabulary-sized layers more).
2. **SFT on ProsQA** (generated small problems: ``--sft-nodes`` nodes, 1-2 hops; held-out problems from
   another seed): plain = MDLM with the LLaDA SFT loss; anchored = ADLM with ANELBO whose anchors are
   the reasoning-path nodes (the task's anchor extractor). Same steps, seeds and data; accuracy from
   the eval runner through the diffusion backend (low-confidence remasking, greedy).
3. **Samplers.** The seed-0 ADLM from part 1 generates ``--gen-length`` tokens for 8 prompts with each
   sampler at the same ``--gen-length`` steps; tokens/s = generated positions / wall seconds (the
   threshold sampler may stop early: that is its speed-up; ``nfe`` says how many model calls ran).

Writes ``benchmarks/results/adlm_vs_mdlm.json`` (updated after each part): ``ppl_mdlm``, ``ppl_adlm``,
``ppl_ratio`` (ADLM / MDLM at equal tokens, means over seeds), ``ppl_mdlm_equal_flops``,
``ppl_ratio_equal_flops``, per-seed numbers, ``sft``, ``samplers``, ``seeds``, ``machine``, ``date``.
Goal from the paper: ppl_ratio <= 0.92 (0.89-0.91 at 33B-524B tokens); at CPU scale the numbers say
what a few hundred steps give, nothing more.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from anchored_reasoning.files import atomic_write
from anchored_reasoning.machine import machine_info

log = logging.getLogger("adlm_vs_mdlm")


# ---------------------------------------------------------------------------------------------
# helpers

def train_flops_per_token(model: Any, seq_len: int) -> float:
    """Training FLOPs per token (3 x forward): 2 x every Linear's weight count plus attention's
    QK^T and AV (4 x seq_len x width per block). Embedding lookups are free."""
    from torch import nn

    from anchored_reasoning.models.blocks import Block

    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    attention = sum(4 * seq_len * b.num_heads * b.head_dim for b in blocks)
    return 3.0 * (2.0 * linear + attention)


def flops_ratio(mdlm: Any, adlm: Any, seq_len: int) -> float:
    """ADLM's training FLOPs per token over MDLM's (:func:`train_flops_per_token` of each)."""
    return train_flops_per_token(adlm, seq_len) / train_flops_per_token(mdlm, seq_len)


def add_ppl_arguments(ap: argparse.ArgumentParser, *, t_samples: int = 4) -> None:
    """The perplexity setup's options (corpus, sizes, optimiser, ANELBO, scoring), shared with adlm_ppl_curve.py."""
    ap.add_argument("--train-file", default="corpora/wikitext2_valid.txt")
    ap.add_argument("--test-file", default="corpora/wikitext2_test.txt")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4, help="MDLM depth = ADLM anchor depth (denoiser: half)")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--gamma", type=float, default=3e-3)
    ap.add_argument("--tau", type=int, default=5)
    ap.add_argument("--test-tokens", type=int, default=16384, help="score the first N tokens of the test file")
    ap.add_argument("--t-samples", type=int, default=t_samples)


def write(out: Path, result: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, json.dumps(result, indent=2, default=str) + "\n")


def mean(xs: list[float]) -> float:
    return float(statistics.fmean(xs)) if xs else float("nan")


def model_config(arch: str, tok: Any, args: argparse.Namespace, max_len: int):
    from anchored_reasoning.models import ADLMConfig, MDLMConfig

    cls = MDLMConfig if arch == "mdlm" else ADLMConfig
    return cls(vocab_size=len(tok), hidden_size=args.width, num_hidden_layers=args.layers, num_attention_heads=args.heads,
               intermediate_size=4 * args.width, max_position_embeddings=max_len, mask_token_id=tok.mask_token_id,
               pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)


def build(arch: str, tok: Any, args: argparse.Namespace, seed: int, max_len: int):
    import torch

    from anchored_reasoning.models import ADLM, MDLM

    torch.manual_seed(seed)
    return (MDLM if arch == "mdlm" else ADLM)(model_config(arch, tok, args, max_len))


def make_args(out_dir: Path, seed: int, max_steps: int, *, anchored: bool, mode: str, args: argparse.Namespace, lr: float, batch: int):
    from anchored_reasoning.train.trainers.diffusion_trainer import DiffusionSFTConfig

    return DiffusionSFTConfig(
        output_dir=str(out_dir), seed=seed, data_seed=seed, max_steps=max_steps, per_device_train_batch_size=batch,
        learning_rate=lr, lr_scheduler_type="constant_with_warmup", warmup_steps=min(args.warmup, max(1, max_steps // 10)),
        weight_decay=0.0, max_grad_norm=1.0, logging_steps=max(1, max_steps // 10), save_strategy="no",
        disable_tqdm=True, diffusion_mode=mode, anchored=anchored, anchor_gamma=args.gamma, anchor_tau=args.tau,
        gamma_warmup_ratio=0.003,
    )


# ---------------------------------------------------------------------------------------------
# part 1: perplexity at equal tokens / equal FLOPs

def ppl_data(args: argparse.Namespace, work: Path) -> tuple[Any, Any, Any, int, int]:
    """The perplexity part's data: a tokenizer trained on ``--train-file`` (special tokens added), its
    packed training rows, the packed first ``--test-tokens`` test tokens, and the token counts
    (training tokens available, training blocks)."""
    import torch
    from datasets import Dataset

    from anchored_reasoning.methods.anchored import add_special_tokens
    from anchored_reasoning.tokenization import train_tiny_tokenizer
    from anchored_reasoning.train.pipelines.diffusion import data_path
    from anchored_reasoning.train.data.diffusion_data import pack_token_blocks, packed_rows, read_text_documents, tokenize_documents

    train_path, test_path = data_path(args.train_file), data_path(args.test_file)
    tok = train_tiny_tokenizer(work / "tokenizer", texts=read_text_documents(train_path, split_lines=True), vocab_size=args.vocab)
    add_special_tokens(tok)
    train_ids = tokenize_documents(tok, read_text_documents(train_path))
    blocks = pack_token_blocks(train_ids, args.seq_len, keep_last=False)
    test_ids = tokenize_documents(tok, read_text_documents(test_path))[: args.test_tokens]
    test_x = torch.tensor(pack_token_blocks(test_ids, args.seq_len, keep_last=False))
    return tok, Dataset.from_list(packed_rows(blocks)), test_x, len(train_ids), len(blocks)


def eval_callback(model: Any, at: list[int], test_x: Any, t_samples: int):
    """A TrainerCallback that scores ``model``'s NELBO perplexity bound on ``test_x`` after each step in
    ``at`` (fixed noise draws: seed 12345), keeping ``scores[step]`` and ``seconds[step]`` -- training
    seconds so far, evaluation time not counted."""
    from transformers import TrainerCallback

    from anchored_reasoning.objectives import perplexity_bound

    class EvalAt(TrainerCallback):
        def __init__(self):
            self.at, self.scores, self.seconds, self.t0 = set(at), {}, {}, None

        def on_train_begin(self, a, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            if state.global_step in self.at:
                self.seconds[state.global_step] = time.perf_counter() - self.t0
                b = perplexity_bound(model, test_x, num_t_samples=t_samples, batch_size=32, seed=12345)
                model.train()
                self.scores[state.global_step] = b.perplexity
                log.info("  step %d: test perplexity bound %.2f", state.global_step, b.perplexity)
                self.t0 = time.perf_counter() - self.seconds[state.global_step]
            return control

    return EvalAt()


def part_ppl(args: argparse.Namespace, work: Path, result: dict[str, Any], out: Path) -> Any:
    from anchored_reasoning.train.trainers.diffusion_trainer import DiffusionCollator, DiffusionSFTTrainer

    tok, rows, test_x, n_train_tokens, n_blocks = ppl_data(args, work)
    mdlm_probe, adlm_probe = build("mdlm", tok, args, 0, args.seq_len), build("adlm", tok, args, 0, args.seq_len)
    r = flops_ratio(mdlm_probe, adlm_probe, args.seq_len)
    flops_steps = int(round(args.steps * r))
    tokens_per_step = args.batch_size * args.seq_len
    setup = {
        "train_file": str(args.train_file), "test_file": str(args.test_file), "train_tokens_available": n_train_tokens,
        "test_tokens_scored": int(test_x.numel()), "tokenizer": f"byte-level BPE, {len(tok)} tokens, trained on the train file",
        "seq_len": args.seq_len, "batch_size": args.batch_size, "steps_equal_tokens": args.steps,
        "training_tokens_equal": args.steps * tokens_per_step, "mdlm_steps_equal_flops": flops_steps,
        "flops_ratio_adlm_over_mdlm": r, "width": args.width, "mdlm_layers": args.layers,
        "adlm_layers": f"{args.layers} anchor + {max(1, args.layers // 2)} denoiser",
        "parameters": {"mdlm": sum(p.numel() for p in mdlm_probe.parameters()),
                       "adlm": sum(p.numel() for p in adlm_probe.parameters())},
        "learning_rate": args.lr, "schedule": "constant after warm-up", "gamma": args.gamma, "tau": args.tau,
        "t_samples": args.t_samples, "epochs_equal_tokens": args.steps * tokens_per_step / max(1, n_blocks * args.seq_len),
    }
    del mdlm_probe, adlm_probe
    log.info("ppl setup: %s", setup)
    result["ppl_setup"] = setup
    per_seed: list[dict[str, Any]] = []
    result["per_seed"] = per_seed

    last_adlm = None
    for seed in args.seeds:
        entry: dict[str, Any] = {"seed": seed}
        for arch in ("mdlm", "adlm"):
            steps = flops_steps if arch == "mdlm" else args.steps
            model = build(arch, tok, args, seed, args.seq_len)
            cb = eval_callback(model, sorted({args.steps, steps}), test_x, args.t_samples)
            trainer = DiffusionSFTTrainer(
                model=model, args=make_args(work / f"{arch}-{seed}", seed, steps, anchored=arch == "adlm", mode="pretrain",
                                            args=args, lr=args.lr, batch=args.batch_size),
                train_dataset=rows, data_collator=DiffusionCollator.for_tokenizer(tok), processing_class=tok, callbacks=[cb])
            log.info("seed %d: training %s for %d steps", seed, arch, steps)
            trainer.train()
            entry[f"ppl_{arch}"] = cb.scores[args.steps]
            entry[f"train_seconds_{arch}"] = round(cb.seconds[args.steps], 2)
            if arch == "mdlm":
                entry["ppl_mdlm_equal_flops"] = cb.scores[steps]
            else:
                last_adlm = model if seed == args.seeds[0] else last_adlm
        entry["ppl_ratio"] = entry["ppl_adlm"] / entry["ppl_mdlm"]
        entry["ppl_ratio_equal_flops"] = entry["ppl_adlm"] / entry["ppl_mdlm_equal_flops"]
        per_seed.append(entry)
        log.info("seed %d: %s", seed, entry)
        summarize_ppl(result)
        write(out, result)
    return last_adlm, tok


def summarize_ppl(result: dict[str, Any]) -> None:
    ps = result["per_seed"]
    result["seeds"] = [e["seed"] for e in ps]
    result["ppl_mdlm"] = mean([e["ppl_mdlm"] for e in ps])
    result["ppl_adlm"] = mean([e["ppl_adlm"] for e in ps])
    result["ppl_ratio"] = result["ppl_adlm"] / result["ppl_mdlm"]
    result["ppl_mdlm_equal_flops"] = mean([e["ppl_mdlm_equal_flops"] for e in ps])
    result["ppl_ratio_equal_flops"] = result["ppl_adlm"] / result["ppl_mdlm_equal_flops"]
    result["ppl_ratio_per_seed"] = [e["ppl_ratio"] for e in ps]
    result["ppl_ratio_equal_flops_per_seed"] = [e["ppl_ratio_equal_flops"] for e in ps]
    result["ppl_goal_met"] = result["ppl_ratio"] <= 0.92


# ---------------------------------------------------------------------------------------------
# part 2: anchored vs plain diffusion SFT on ProsQA

def part_sft(args: argparse.Namespace, work: Path, result: dict[str, Any], out: Path) -> None:
    from anchored_reasoning.backends.diffusion import DiffusionBackend
    from anchored_reasoning.eval.runner import run_eval
    from anchored_reasoning.methods import get_method
    from anchored_reasoning.train.data.data_sources import generate_examples
    from anchored_reasoning.train.pipelines.diffusion import run as train_run

    params = {"num_nodes": args.sft_nodes, "min_hops": 1, "max_hops": 2, "neg_depth": "any"}  # as the recipe pins
    heldout = generate_examples("prosqa", args.sft_eval_n, 10_000, params, split="heldout")
    method = get_method(args.sft_method, style="trained")
    sft: dict[str, Any] = {"setup": {"task": "prosqa (generated)", "generator_params": params, "train_n": args.sft_n,
                                     "heldout_n": args.sft_eval_n, "heldout_seed": 10_000, "steps": args.sft_steps,
                                     "batch_size": args.sft_batch, "width": args.sft_width, "layers": args.layers,
                                     "method": f"trained-style {args.sft_method}",
                                     "response_window": args.gen_length,
                                     "sampler": f"low_confidence, greedy, gen_length {args.gen_length}, steps {args.gen_length}, "
                                                f"block {args.gen_length // 2}",
                                     "plain": "MDLM, LLaDA SFT loss", "anchored": "ADLM, ANELBO, anchors = reasoning-path nodes"}}
    result["sft"] = sft
    seeds = args.sft_seeds or args.seeds
    for seed in seeds:  # seeds outermost: a run cut short still holds paired plain/anchored results
        for label, arch in (("plain", "mdlm"), ("anchored", "adlm")):
            recipe_over = [
                f"output_dir={work / f'sft-{arch}-{seed}'}", f"seed={seed}", f"model.arch={arch}",
                f"model.config.hidden_size={args.sft_width}", f"model.config.intermediate_size={4 * args.sft_width}",
                f"model.config.num_hidden_layers={args.layers}", f"model.config.num_attention_heads={args.heads}",
                f"data.train.n={args.sft_n}", f"data.train.seed={seed}", f"data.train.params.num_nodes={args.sft_nodes}",
                "data.valid=null", f"training.max_steps={args.sft_steps}", f"training.per_device_train_batch_size={args.sft_batch}",
                f"training.learning_rate={args.sft_lr}", f"training.anchored={'true' if arch == 'adlm' else 'false'}",
                f"training.logging_steps={max(1, args.sft_steps // 5)}", f"method.name={args.sft_method}",
                f"training.response_length={args.gen_length}",
            ]
            t0 = time.perf_counter()
            ckpt = train_run("diffusion_sft_prosqa_" + arch, recipe_over)
            train_s = time.perf_counter() - t0
            backend = DiffusionBackend(str(ckpt), sampler="low_confidence", steps=args.gen_length,
                                       block_length=args.gen_length // 2, batch_size=16, device="cpu")
            summary = run_eval("prosqa", backend, method, out_dir=work / f"sft-eval-{arch}-{seed}", examples=heldout,
                               max_new_tokens=args.gen_length, progress=False)
            sft.setdefault(f"{label}_per_seed", []).append(
                {"seed": seed, "accuracy": summary["accuracy"]["mean"], "ci95": [summary["accuracy"]["ci_low"], summary["accuracy"]["ci_high"]],
                 "mean_generated_tokens": summary["tokens"]["mean"], "no_answer": summary["counts"]["no_answer"],
                 "train_seconds": round(train_s, 1)})
            runs = sft[f"{label}_per_seed"]
            sft[label] = {"arch": arch, "accuracy": mean([r["accuracy"] for r in runs]),
                          "mean_generated_tokens": mean([r["mean_generated_tokens"] for r in runs]),
                          "seeds": [r["seed"] for r in runs]}
            log.info("sft %s seed %d: accuracy %.3f", label, seed, summary["accuracy"]["mean"])
            write(out, result)


# ---------------------------------------------------------------------------------------------
# part 3: sampler throughput at equal steps

def part_samplers(args: argparse.Namespace, model: Any, tok: Any, result: dict[str, Any], out: Path) -> None:
    import torch

    from anchored_reasoning.sampling import SamplerConfig, sample

    model.eval()
    prompts = ["The history of the", "In 1998 , the", "The album was released", "He was born in",
               "The game is", "During the war", "The city of", "She later became"]
    enc = [tok(p)["input_ids"] for p in prompts]
    width = max(map(len, enc))
    ids = torch.full((len(enc), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, e in enumerate(enc):
        ids[i, width - len(e):] = torch.tensor(e)
        mask[i, width - len(e):] = 1
    gen = min(args.gen_length, model.config.max_position_embeddings - width)
    samplers: dict[str, Any] = {"setup": {"model": "ADLM seed 0 from the perplexity part", "prompts": len(prompts),
                                          "gen_length": gen, "steps": gen, "block_length": gen // 2, "repeats": args.repeats}}
    result["samplers"] = samplers
    for name in ("ancestral", "low_confidence", "remdm", "threshold"):
        cfg = SamplerConfig(remasking=name, steps=gen, gen_length=gen, block_length=gen // 2, seed=0,
                            temperature=1.0 if name in ("ancestral", "remdm") else 0.0,
                            top_p=0.9 if name == "remdm" else 1.0, threshold=0.9)
        best, nfe = float("inf"), 0
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            _, stats = sample(model, ids, cfg, attention_mask=mask)
            best = min(best, time.perf_counter() - t0)
            nfe = stats.nfe
        samplers[name] = {"tokens_per_s": len(prompts) * gen / best, "seconds": best, "nfe": nfe}
        log.info("sampler %s: %.1f tokens/s (%d model calls)", name, len(prompts) * gen / best, nfe)
        write(out, result)


# ---------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_ppl_arguments(ap)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=200, help="training steps of each model at equal tokens")
    ap.add_argument("--sft-seeds", type=int, nargs="+", default=None, help="default: --seeds")
    ap.add_argument("--sft-steps", type=int, default=150)
    ap.add_argument("--sft-n", type=int, default=2000)
    ap.add_argument("--sft-eval-n", type=int, default=64)
    ap.add_argument("--sft-nodes", type=int, default=6)
    ap.add_argument("--sft-method", default="cot", help="trained-style rendering for SFT: cot or nocot")
    ap.add_argument("--sft-width", type=int, default=64)
    ap.add_argument("--sft-batch", type=int, default=16)
    ap.add_argument("--sft-lr", type=float, default=3e-3)
    ap.add_argument("--gen-length", type=int, default=64, help="SFT response window = eval window; sampler benchmark window")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--skip-sft", action="store_true")
    ap.add_argument("--skip-ppl", action="store_true", help="skip parts 1 and 3 (the sampler part uses a part-1 model)")
    ap.add_argument("--skip-samplers", action="store_true")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    ap.add_argument("--work-dir", default=None, help="checkpoints and eval records (default: a temporary folder)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "adlm_vs_mdlm.json"))
    args = ap.parse_args(argv)
    if args.layers < 2:
        ap.error("--layers must be >= 2 (ADLM's denoiser has half the depth)")

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("transformers", "datasets", "anchored_reasoning.train.data.diffusion_data"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    import tempfile

    import torch

    torch.set_num_threads(args.threads)
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="adlm_vs_mdlm-"))
    out = Path(args.out)
    t0 = time.perf_counter()
    result: dict[str, Any] = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine_info(),
                              "command": "python -m benchmarks.adlm_vs_mdlm " + " ".join(sys.argv[1:] if argv is None else argv)}
    if not args.skip_ppl:
        model, tok = part_ppl(args, work, result, out)
        if not args.skip_samplers:
            part_samplers(args, model, tok, result, out)
    if not args.skip_sft:
        part_sft(args, work, result, out)
    result["wall_seconds"] = round(time.perf_counter() - t0, 1)
    write(out, result)
    print(json.dumps({k: result[k] for k in ("ppl_mdlm", "ppl_adlm", "ppl_ratio", "ppl_mdlm_equal_flops",
                                              "ppl_ratio_equal_flops", "seeds") if k in result}, indent=2))
    if "sft" in result:
        print("sft accuracy:", {k: result["sft"][k]["accuracy"] for k in ("plain", "anchored") if k in result["sft"]})
    if "samplers" in result:
        print("tokens/s:", {k: round(v["tokens_per_s"], 1) for k, v in result["samplers"].items() if k != "setup"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
