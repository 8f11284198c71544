"""Held-out accuracy of a diffusion-SFT'd model on generated ladder ProsQA, and a forced choice.

    python -m research.diffusion.diffusion_sft_check runs/dmdlm_arinit_cot --hops 1 --gen-length 16 --method trained:cot

Generates ``--n`` problems at the ladder size of ``--hops`` (seed 4242, unseen by the SFT recipes,
which draw from seeds 0-2), runs them through the evaluation runner and the diffusion backend
(low-confidence greedy, as many steps as window tokens) and prints the accuracy with its 95% bootstrap
interval (chance 0.5). ``--forced``: also score the two options at a masked object of the first
derivation step (``<entity> is a <mask>.`` for cot, ``### <entity> is a <mask>.`` for nocot), which
reads the lookup without any decoding (:func:`anchored_reasoning.eval.choice.masked_choice`; the prompt
as the trained format renders it). Writes the runner's records under ``<model>/_check_h<hops>``.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    import anchored_reasoning.models  # noqa: F401  (Auto registration)
    from anchored_reasoning import generators
    from anchored_reasoning.backends.diffusion import DiffusionBackend
    from anchored_reasoning.eval.runner import run_eval
    from anchored_reasoning.generators.prosqa import ladder_size

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--hops", type=int, default=1)
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--gen-length", type=int, default=8)
    p.add_argument("--method", default="trained:nocot")
    p.add_argument("--forced", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    model = AutoModelForMaskedLM.from_pretrained(a.model).eval()
    tok = AutoTokenizer.from_pretrained(a.model)
    examples = generators.generate_dataset("prosqa", a.n, seed=4242, split="check", **ladder_size(a.hops))
    backend = DiffusionBackend(model, tokenizer=tok, sampler="low_confidence", steps=a.gen_length, gen_length=a.gen_length,
                               batch_size=20, device="cpu")
    out = Path(a.model) / f"_check_h{a.hops}"
    shutil.rmtree(out, ignore_errors=True)
    s = run_eval("prosqa", backend, a.method, out_dir=out, examples=examples, max_new_tokens=a.gen_length, progress=False)
    res = {"model": a.model, "hops": a.hops, "n": a.n, "method": a.method, "accuracy": s["accuracy"], "chance": 0.5}
    if a.forced:
        from anchored_reasoning.eval.choice import masked_choice

        res["forced_choice"] = masked_choice(model, tok, examples, method="nocot" if a.method.endswith("nocot") else "cot")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
