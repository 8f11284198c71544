"""Why the WikiText TADM bounds are flat in K: do the models of ``benchmarks.tadm_speed`` use context at all?

    python -m research.diffusion.tadm_diagnosis --workdir runs/tadm_bench --pretrain-steps 300
        # -> research/diffusion/results/tadm_diagnosis.json (formerly ``tadm_speed.py --diagnose``)

Takes every option of ``benchmarks.tadm_speed`` (the same options find the same models in ``--workdir``, or
train them), and probes its ADLM, post-trained TADM and T-ANELBO TADM (``--pretrain-steps``) on held-out
WikiText-2 blocks: the NELBO bound with a fresh anchor, with the anchor network reading all-mask tokens and with
every part reading them (``benchmarks.tadm_stale_contrast.context_use``), the stale bounds at K = 1, 8, 64 and the
fusion's gate and correction size. A model whose bound does not move when its input is masked uses no context,
so no anchor, fresh or stale, can matter to it: the reason the contrast moved to logic text
(``benchmarks.tadm_stale_contrast``).
"""
from __future__ import annotations

import datetime as dt
import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch

from anchored_reasoning.machine import machine_info
from benchmarks import tadm_speed
from benchmarks.common import write_result
from benchmarks.tadm_stale_contrast import context_use, fusion_stats

logger = logging.getLogger("tadm_diagnosis")


def diagnose(args) -> dict[str, Any]:
    """The WikiText models of ``benchmarks.tadm_speed`` (trained or reused in
    ``--workdir``), probed with :func:`context_use` over whole blocks (every input token masked),
    the stale bounds at K = 1, 8, 64 and the fusion's gate and correction size."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from anchored_reasoning.objectives_tadm import stale_perplexity_bound
    from anchored_reasoning.train.pipelines.diffusion import data_path
    from anchored_reasoning.train.pipelines.tadm import text_blocks

    adlm_dir, tadm_dir = tadm_speed.train_models(args)
    dirs = {"adlm": adlm_dir, "tadm_posttrained": tadm_dir, "tadm_pretrained": tadm_speed.pretrain_tadm(args)}
    tok = AutoTokenizer.from_pretrained(adlm_dir)
    x = text_blocks(tok, data_path("corpora/wikitext2_test.txt"), args.seq_len, args.diagnose_blocks)
    am, lm = torch.ones_like(x), torch.ones_like(x, dtype=torch.bool)
    out = {}
    for name, d in dirs.items():
        model = AutoModelForMaskedLM.from_pretrained(d).eval()
        row = {"checkpoint": str(d), "context_use_ppl": context_use(model, x, am, lm, args.steps, blind_last=x.shape[1]),
               "fusion": fusion_stats(model, x[:16], am[:16])}
        row["stale_ppl"] = {str(k): stale_perplexity_bound(model, x, refresh_every=k, sampling_steps=args.steps,
                                                           num_t_samples=4, seed=0).perplexity for k in (1, 8, 64)}
        logger.info("%s: %s", name, row["context_use_ppl"])
        out[name] = row
    return {"setup": {"data": f"wikitext2_test, {x.shape[0]} blocks of {x.shape[1]} tokens, 4 t-samples",
                      "probe": "context_use_ppl: the bound with a fresh anchor, with the anchor network reading all-mask "
                               "tokens, and with every part reading all-mask tokens",
                      "pretrain_steps": args.pretrain_steps, "base_steps": args.base_steps, "post_steps": args.post_steps},
            "results": out}


def main(argv: list[str] | None = None) -> int:
    p = tadm_speed.build_parser()
    p.description = __doc__.split("\n")[0]
    p.add_argument("--diagnose-out", default=str(Path(__file__).resolve().parent / "results" / "tadm_diagnosis.json"))
    p.add_argument("--diagnose-blocks", type=int, default=48, help="held-out WikiText-2 blocks the probe scores")
    args = p.parse_args(argv)
    if args.pretrain_steps < 1:
        p.error("the probe reads the T-ANELBO TADM too: pass --pretrain-steps (300 in tadm_speed.json)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    import anchored_reasoning.models  # noqa: F401  (Auto registration)

    t0 = time.monotonic()
    result = {"benchmark": "tadm_diagnosis", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "machine": machine_info(note="shared 2-core CPU; other jobs ran at the same time"),
              "command": "python -m research.diffusion.tadm_diagnosis " + " ".join(argv if argv is not None else sys.argv[1:]),
              **diagnose(args)}
    result["wall_seconds"] = round(time.monotonic() - t0, 1)
    write_result(args.diagnose_out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
