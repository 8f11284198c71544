"""lm-eval's own command line with the ``anchored_diffusion`` model class registered::

    python -m anchored_reasoning.eval.lm_eval_cli run --model anchored_diffusion \\
        --model_args pretrained=<checkpoint>,sampler=low_confidence,steps=32,mc_num=64 --tasks <tasks>

Every argument is lm-eval's (``lm-eval run --help``); lm-eval's built-in models stay available.
"""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    import lm_eval.models  # noqa: F401  (built-in models: lm-eval imports them only into an empty registry)
    from lm_eval.__main__ import cli_evaluate

    import anchored_reasoning.eval.lm_eval_model  # noqa: F401  (registers "anchored_diffusion")

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    cli_evaluate()


if __name__ == "__main__":
    main()
