"""TADM:Post-train on a small DiffusionGemma that knows something, measured on a CPU (issue 51 item 4).

    OMP_NUM_THREADS=1 python -m benchmarks.tadm_gemma --workdir runs/tadm_gemma_bench \\
        --out benchmarks/results/tadm_gemma.json

A random DiffusionGemma is at chance, so first one learns a task here, with DiffusionGemma's own training
objective (uniform-noise corruption t ~ U(0.001, 1), cross-entropy on every canvas position,
self-conditioning on half the rows): the context is a marker and a start word w_a of a cycle of
``--words`` words; the canvas continues w_{a+s}, w_{a+2s}, ... for a step s in {1, 2, 3} that the context
does not give, so the canvas tokens must agree with each other on s -- what a denoiser reads from the
canvas itself, and what a stale anchor no longer reflects. A canvas is *valid* when all of it follows one s.
Then the library's ``tadm_gemma`` trainer (``TADMGemmaTrainer``, the paper's loss) trains the fusion on
the same rows with the base frozen. Both models are saved under ``--workdir`` and reused by a rerun.

Measured side by side in one process (one thread; the CPU is shared, so ratios, interleaved):

* on the base model's own sampling trajectories (fresh anchors decide every step): per K in 1..4, the
  KL(fresh || stale) and argmax agreement of naive stale reuse (fusion off) and of the trained fusion, with
  the anchor refreshed every K steps -- the same canvases for both, a paired comparison (bootstrap CI of
  the per-prompt difference);
* generating with each variant (same seeds): the share of valid canvases and of tokens that follow the
  canvas's first step;
* wall time per ``generate`` call on all prompts at once, each variant repeated, interleaved, the order rotated
  each round; tokens/s ratios (medians) to the model's own ``generate`` and to the staged K = 1 path (naive
  K = 1: the base's numbers through the cached sampler's code), and the decoder layer calls from the counters.

``--fusion-ce-weight 0`` trains a second fusion on the KL term alone (saved beside the first), to separate what
the CE term to the data does from what staleness does. ``--fusion-kind paired`` trains the paper's paired-attention
fusion instead (``fusion_paired`` beside the others; 4 heads) -- the committed results used ``attention``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from anchored_reasoning.machine import machine_info
from benchmarks.common import write_result

logger = logging.getLogger("tadm_gemma")
FIRST_WORD = 10  # token ids FIRST_WORD .. FIRST_WORD + words - 1 are the cycle's words; FIRST_WORD - 1 the marker


def task_rows(n: int, words: int, canvas: int, seed: int) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        a, s = int(torch.randint(words, (1,), generator=g)), int(torch.randint(1, 4, (1,), generator=g))
        rows.append({"context": [FIRST_WORD - 1, FIRST_WORD + a],
                     "canvas": [FIRST_WORD + (a + i * s) % words for i in range(1, canvas + 1)], "step": s})
    return rows


def canvas_scores(context: torch.Tensor, out: torch.Tensor, words: int) -> tuple[list[float], list[float]]:
    """Per row: valid (all of the canvas follows one step from the start word) and the share of tokens that
    follow the step its first token took."""
    valid, follow = [], []
    for ctx, toks in zip(context.tolist(), out.tolist()):
        a, seq = ctx[-1] - FIRST_WORD, [t - FIRST_WORD for t in toks]
        ok = [all(seq[i] == (a + (i + 1) * s) % words for i in range(len(seq))) for s in (1, 2, 3)]
        s0 = (seq[0] - a) % words
        follow.append(sum(seq[i] == (a + (i + 1) * s0) % words for i in range(len(seq))) / len(seq))
        valid.append(float(any(ok)))
    return valid, follow


def train_base(model, rows, minutes: float, batch: int, lr: float, seed: int) -> dict[str, Any]:
    """DiffusionGemma's objective: uniform-noise corruption, CE on every canvas position, self-conditioning 0.5."""
    from anchored_reasoning.train.data.tadm_gemma_data import ContextCanvasCollator

    torch.manual_seed(seed)
    collate = ContextCanvasCollator(0)
    vocab = model.config.get_text_config().vocab_size
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    t0, step, losses = time.monotonic(), 0, []
    while time.monotonic() - t0 < 60 * minutes:
        idx = torch.randint(len(rows), (batch,))
        b = collate([rows[i] for i in idx])
        x = b["canvas"]
        t = 1e-3 + (1 - 1e-3) * torch.rand(batch)
        z = torch.where(torch.rand(x.shape) < t[:, None], torch.randint(0, vocab, x.shape), x)
        on = torch.rand(batch) < 0.5
        sc = None
        if bool(on.any()):
            with torch.no_grad():
                sc = model(input_ids=b["input_ids"], decoder_input_ids=z).logits
        logits = model(input_ids=b["input_ids"], decoder_input_ids=z, self_conditioning_logits=sc,
                       self_conditioning_mask=on if sc is not None else None).logits
        loss = F.cross_entropy(logits.reshape(-1, vocab), x.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
        step += 1
        if step % 50 == 0:
            logger.info("base step %d: loss %.3f (%.0fs)", step, statistics.mean(losses[-50:]), time.monotonic() - t0)
    model.eval()
    return {"steps": step, "seconds": round(time.monotonic() - t0, 1), "final_loss": round(statistics.mean(losses[-50:]), 4)}


class TrajectoryProbe:
    """Installed as the model's forward during its own ``generate``: returns the fresh (base) logits, so the
    trajectory is the base model's, and scores at each step what a stale anchor would give, per K and with /
    without the fusion: KL(fresh || variant) and argmax agreement, accumulated per row."""

    def __init__(self, naive, tadm, ks: list[int]):
        self.naive, self.tadm, self.ks = naive, tadm, ks
        self.cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.step = 0
        self.kl = {(k, m): 0.0 for k in ks for m in ("naive", "fusion")}
        self.agree = dict.fromkeys(self.kl, 0.0)
        self.steps_seen = 0

    def reset(self):
        self.cache, self.step = {}, 0

    def __call__(self, input_ids=None, decoder_input_ids=None, past_key_values=None, **kw):
        from transformers.models.diffusion_gemma.modeling_diffusion_gemma import DiffusionGemmaBlockDiffusionOutputWithPast

        kw.pop("self_conditioning_mask", None)
        current, st = self.naive.stages(decoder_input_ids, past_key_values, **kw)
        fresh_anchor = self.naive.anchor(current, st)
        fresh = self.naive.denoise(current, fresh_anchor, st)
        log_f = F.log_softmax(fresh, -1)
        for k in self.ks:
            if self.step % k == 0:
                self.cache[k] = (fresh_anchor, current)  # H0 and C0 (the paired fusion reads C0)
            for mode, runner in (("naive", self.naive), ("fusion", self.tadm)):
                other = runner.denoise(current, self.cache[k][0], st, anchor_current=self.cache[k][1])
                log_o = F.log_softmax(other, -1)
                self.kl[(k, mode)] = self.kl[(k, mode)] + (log_f.exp() * (log_f - log_o)).sum(-1).mean(-1)
                self.agree[(k, mode)] = self.agree[(k, mode)] + (fresh.argmax(-1) == other.argmax(-1)).float().mean(-1)
        self.step += 1
        self.steps_seen += 1
        return DiffusionGemmaBlockDiffusionOutputWithPast(logits=fresh, past_key_values=past_key_values)


def _paired(a: torch.Tensor, b: torch.Tensor) -> dict[str, Any]:
    from anchored_reasoning.eval.metrics import mean_ci

    c = mean_ci((a - b).tolist())
    return {"mean_diff": round(c["mean"], 5), "ci95": [round(c["ci_low"], 5), round(c["ci_high"], 5)]}


@torch.no_grad()
def measure(model, fusion, rows, args) -> dict[str, Any]:
    from anchored_reasoning.models.diffusion_gemma import paper_generation_kwargs
    from anchored_reasoning.models.tadm_gemma import TADMDiffusionGemma
    from anchored_reasoning.train.data.tadm_gemma_data import ContextCanvasCollator

    batch = ContextCanvasCollator(0)(rows)
    ctx = batch["input_ids"]
    gen = dict(max_new_tokens=model.config.canvas_length, **paper_generation_kwargs(args.steps))
    ks = [1, 2, 3, 4]
    naive = {k: TADMDiffusionGemma(model, None, split=fusion.config.split, anchor_refresh_every=k) for k in ks}
    tadm = {k: TADMDiffusionGemma(model, fusion, anchor_refresh_every=k) for k in ks}
    out: dict[str, Any] = {}

    probe = TrajectoryProbe(naive[1], tadm[1], ks)  # 1. the base model's trajectories, stale variants scored
    model.forward = probe
    try:
        torch.manual_seed(args.seed)
        model.generate(ctx, **gen)
    finally:
        del model.forward
    n = probe.steps_seen
    out["on_base_trajectories"] = {
        f"K={k}": {m: {"kl_to_fresh": round(float((probe.kl[(k, m)] / n).mean()), 5),
                       "argmax_agreement": round(float((probe.agree[(k, m)] / n).mean()), 4)} for m in ("naive", "fusion")}
        | {"kl_fusion_minus_naive": _paired(probe.kl[(k, "fusion")] / n, probe.kl[(k, "naive")] / n)} for k in ks}

    def run(kind: str, k: int):
        torch.manual_seed(args.seed)
        if kind == "base":
            return model.generate(ctx, **gen).sequences[:, ctx.shape[1]:], None
        runner = (naive if kind == "naive" else tadm)[k]
        seq = runner.generate(ctx, **gen).sequences[:, ctx.shape[1]:]
        return seq, runner.counters.to_dict()

    variants = [("base", 1)] + [(kind, k) for k in ks for kind in ("naive", "fusion")]  # naive K=1: base's numbers, staged
    scores = {}
    for kind, k in variants:  # 2. generating with each variant: does the canvas hold together?
        seq, counters = run(kind, k)
        valid, follow = canvas_scores(ctx, seq, args.words)
        scores[f"{kind} K={k}"] = {"valid_canvas": _share(valid), "tokens_following_first_step": _share(follow),
                                   "counters": counters}
    out["generated"] = scores

    times: dict[str, list[float]] = {f"{kind} K={k}": [] for kind, k in variants}
    for r in range(args.repeats):  # 3. wall time, interleaved, the order rotated each round
        for kind, k in variants[r % len(variants):] + variants[:r % len(variants)]:
            t0 = time.perf_counter()
            run(kind, k)
            times[f"{kind} K={k}"].append(time.perf_counter() - t0)
    base_t, staged_t = statistics.median(times["base K=1"]), statistics.median(times["naive K=1"])
    n_tok = ctx.shape[0] * model.config.canvas_length
    out["speed"] = {name: {"median_seconds": round(statistics.median(ts), 4), "tokens_per_s": round(n_tok / statistics.median(ts), 1),
                           "speedup_vs_base": round(base_t / statistics.median(ts), 3),
                           "speedup_vs_staged_k1": round(staged_t / statistics.median(ts), 3),
                           "seconds_each_round": [round(t, 3) for t in ts],
                           "decoder_layer_calls": (scores[name]["counters"] or {}).get("decoder_layer_calls",
                                                                                         args.steps * fusion.config.split.total)}
                    for name, ts in times.items()}
    return out


def _share(values: list[float]) -> dict[str, Any]:
    from benchmarks.common import accuracy_ci

    return accuracy_ci(values)


def build_models(args, workdir: Path):
    """The trained base (``workdir/base``) and fusion (``workdir/fusion``): loaded when there, else trained."""
    from datasets import Dataset

    from anchored_reasoning.models.diffusion_gemma import load_diffusion_gemma, make_tiny_diffusion_gemma
    from anchored_reasoning.models.tadm_gemma import TADMDiffusionGemma, load_fusion, make_fusion
    from anchored_reasoning.train.callbacks.curriculum import TimeBudgetCallback
    from anchored_reasoning.train.trainers.tadm_gemma_trainer import TADMGemmaConfig, TADMGemmaTrainer
    from anchored_reasoning.train.data.tadm_gemma_data import ContextCanvasCollator

    rows = task_rows(args.train_rows, args.words, args.canvas, args.seed)
    info: dict[str, Any] = {}
    base_dir = workdir / "base"
    fusion_dir = workdir / ("fusion" + ("" if args.fusion_kind == "attention" else f"_{args.fusion_kind}")
                            + ("" if args.fusion_ce_weight == 1.0 else f"_ce{args.fusion_ce_weight:g}"))
    if not (base_dir / "model.safetensors").is_file():
        make_tiny_diffusion_gemma(base_dir, seed=args.seed, hidden_size=args.hidden, num_layers=args.layers, num_heads=4,
                                  head_dim=32, intermediate_size=2 * args.hidden, canvas_length=args.canvas)
        model, _ = load_diffusion_gemma(str(base_dir))
        info["base_training"] = train_base(model, rows, args.base_minutes, args.batch, args.base_lr, args.seed)
        model.save_pretrained(base_dir)
        (base_dir / "base_training.json").write_text(json.dumps(info["base_training"]) + "\n")
    info["base_training"] = json.loads((base_dir / "base_training.json").read_text())
    model, tok = load_diffusion_gemma(str(base_dir))
    model.requires_grad_(False)
    if not (fusion_dir / "model.safetensors").is_file():
        tadm = TADMDiffusionGemma(model)
        fusion = make_fusion(model, tadm.split, fusion_kind=args.fusion_kind, fusion_dim=args.fusion_dim,
                             num_heads=2 if args.fusion_kind == "attention" else 4, base_model=str(base_dir.resolve()),
                             seed=args.seed)
        cfg = TADMGemmaConfig(output_dir=str(workdir / "fusion_run"), max_steps=100000, max_train_seconds=60 * args.fusion_minutes,
                              per_device_train_batch_size=args.batch, denoising_steps=args.steps, warmup_steps=20,
                              learning_rate=args.fusion_lr, ce_weight=args.fusion_ce_weight, save_strategy="no", logging_steps=50, disable_tqdm=True,
                              seed=args.seed)
        trainer = TADMGemmaTrainer(model=fusion, args=cfg, train_dataset=Dataset.from_list(
            [{"context": r["context"], "canvas": r["canvas"]} for r in rows]),
            data_collator=ContextCanvasCollator(tok.pad_token_id), tadm=tadm,
            callbacks=[TimeBudgetCallback(cfg.max_train_seconds)])
        t0 = time.monotonic()
        trainer.train()
        fusion.save_pretrained(fusion_dir)
        info["fusion_training"] = {"steps": trainer.state.global_step, "seconds": round(time.monotonic() - t0, 1),
                                   "log": [h for h in trainer.state.log_history if "loss" in h][-3:]}
        (fusion_dir / "fusion_training.json").write_text(json.dumps(info["fusion_training"]) + "\n")
    info["fusion_training"] = json.loads((fusion_dir / "fusion_training.json").read_text())
    return model, load_fusion(str(fusion_dir)), info


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", default="runs/tadm_gemma_bench")
    p.add_argument("--out", default="benchmarks/results/tadm_gemma.json")
    p.add_argument("--hidden", type=int, default=96)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--canvas", type=int, default=16)
    p.add_argument("--words", type=int, default=24)
    p.add_argument("--steps", type=int, default=12, help="denoising steps per canvas (T)")
    p.add_argument("--train-rows", type=int, default=4000)
    p.add_argument("--eval-prompts", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--base-minutes", type=float, default=10.0)
    p.add_argument("--base-lr", type=float, default=1e-3)
    p.add_argument("--fusion-minutes", type=float, default=5.0)
    p.add_argument("--fusion-lr", type=float, default=1e-3)
    p.add_argument("--fusion-dim", type=int, default=64)
    p.add_argument("--fusion-kind", choices=("attention", "paired"), default="attention",
                   help="attention (the committed results'); paired: the paper's paired attention (4 heads)")
    p.add_argument("--fusion-ce-weight", type=float, default=1.0, help="the paper: CE + KL (1.0); 0: KL to the teacher only")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(1)
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model, fusion, info = build_models(args, workdir)
    rows = task_rows(args.eval_prompts, args.words, args.canvas, args.seed + 1)
    result = {
        "benchmark": "tadm_gemma", "command": "OMP_NUM_THREADS=1 python -m benchmarks.tadm_gemma "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
        "started": started, "machine": machine_info(), "settings": vars(args),
        "split": fusion.config.split.__dict__, "fusion_parameters": sum(p.numel() for p in fusion.parameters()),
        "base_parameters": sum(p.numel() for p in model.parameters()),
        "layer_calls_per_canvas_formula": {f"K={k}": args.steps * (fusion.config.split.shared + fusion.config.split.denoiser)
                                           + math.ceil(args.steps / k) * fusion.config.split.anchor for k in (1, 2, 3, 4)},
        **info, **measure(model, fusion, rows, args),
        "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
