"""Issue 10, item 1, end to end through the trainer: the shipped default backbone (logic-gpt2-shift),
fine-tuned No-CoT by the ``ar`` trainer (TRL's SFTTrainer path, fused LM head) on 1-hop problems, answers
held-out problems right and *reads the asked entity*: asked about the other entity, its answer flips
(200 steps, ~1.5 min of one core).

This also guards the trainer path of the token shift: with the shift outside the backbone TRL calls, the
same run generated garbage and scored ~0.2 (the shift never trained and was missing from training)."""
from __future__ import annotations

import pytest

from anchored_reasoning import demo

pytestmark = pytest.mark.slow

STEPS = 200


def test_fine_tuned_default_binds_the_asked_entity_at_one_hop(tmp_path):
    import torch

    from anchored_reasoning.eval.probes import binding_probe_examples, hops_of
    from anchored_reasoning.train import ar

    torch.set_num_threads(1)
    settings = demo.DemoSettings(hops=[1], train_n=STEPS * 32, eval_n=60, seed=4)
    assert settings.backbone == "logic-gpt2-shift"  # the shipped default
    train, held = demo.make_data(settings)
    recipe = demo.method_recipe("nocot", settings, None, tmp_path / "nocot", 0.0)
    recipe["training"].update(max_steps=STEPS, max_train_seconds=None)
    ckpt = ar.run_with_examples(recipe, train, [])

    hops = {ex.id: hops_of(ex) for ex in held}
    ev = demo.evaluate(str(ckpt), held, tmp_path / "eval_generated", 16, hops=hops)
    pr = demo.probe(str(ckpt), binding_probe_examples(held), tmp_path, 16, hops)
    assert ev["n"] == 60
    assert ev["accuracy"] >= 0.85, ev["accuracy"]
    # the answer follows the asked entity: 0.88 [0.80, 0.95] here (0.88 at 300 steps too; the goal is
    # 0.90, and the misses are answers naming a concept that is not an option); plain logic-gpt2: <= 0.03
    assert pr["flip_rate"]["mean"] >= 0.8, pr["flip_rate"]
