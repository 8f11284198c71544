"""Issue 10, item 1, end to end through the trainer: the demo's default backbone (``logic-gpt2-search``),
fine-tuned CoT on the written search by the ``ar`` trainer (TRL's SFTTrainer path, fused LM head) on the
demo's 1-3-hop problems, answers held-out problems right and *reads the asked entity* at every depth: asked
about the other entity, its answer flips on >= 90% of them at 1, 2 and 3 hops (the issue's bar), above the
backbone's own 0.85 at 3 hops. And ``logic-gpt2-shift`` (the backbone before it)
fine-tuned No-CoT on 1-hop problems binds there (200 steps, ~1.5 min of one core).

This also guards the trainer path of the token shift: with the shift outside the backbone TRL calls, the
same run generated garbage and scored ~0.2 (the shift never trained and was missing from training)."""
from __future__ import annotations

import pytest

from anchored_reasoning import demo

pytestmark = pytest.mark.slow

STEPS = 200


def fine_tune_and_probe(method: str, settings, steps: int, tmp_path, max_new_tokens: int):
    """``method`` fine-tuned ``steps`` steps through the trainer on the demo's problems of ``settings``, then
    graded on its held-out problems and under the binding probe: (held-out, hops by id, evaluation, probe)."""
    import torch

    from anchored_reasoning.eval.probes import binding_probe_examples, hops_of
    from anchored_reasoning.train.pipelines import ar

    torch.set_num_threads(1)
    train, held = demo.make_data(settings)
    recipe = demo.method_recipe(method, settings, None, tmp_path / method, 0.0)
    recipe["training"].update(max_steps=steps, max_train_seconds=None)
    ckpt = ar.run_with_examples(recipe, train, [])
    hops = {ex.id: hops_of(ex) for ex in held}
    ev = demo.evaluate(str(ckpt), held, tmp_path / "eval_generated", max_new_tokens, hops=hops)
    pr = demo.probe(str(ckpt), binding_probe_examples(held), tmp_path, max_new_tokens, hops)
    return held, hops, ev, pr


def test_fine_tuned_default_binds_the_asked_entity_at_one_hop(tmp_path):
    settings = demo.DemoSettings(hops=[1], train_n=STEPS * 32, eval_n=60, seed=4, backbone="logic-gpt2-shift")
    _, _, ev, pr = fine_tune_and_probe("nocot", settings, STEPS, tmp_path, 16)
    assert ev["n"] == 60
    assert ev["accuracy"] >= 0.85, ev["accuracy"]
    # the answer follows the asked entity: 0.88 [0.80, 0.95] here (0.88 at 300 steps too; the goal is
    # 0.90, and the misses are answers naming a concept that is not an option); plain logic-gpt2: <= 0.03
    assert pr["flip_rate"]["mean"] >= 0.8, pr["flip_rate"]


SEARCH_STEPS = 400


def test_fine_tuned_default_reads_the_asked_entity_at_every_depth(tmp_path):
    """CoT written as the search (the demo's default trace, steps joined as in pretraining), 400 steps from
    the demo's default backbone at lr 1e-4, 40 held-out problems per depth: the answer flips with the asked
    entity on >= 90% of them at every depth, and nothing the backbone does zero-shot in its own format on the
    same problems is lost. Measured (research/binding/finetune_binding.py, 80 problems per depth, seed 5;
    finetune_binding_cot400.json): right 1.00 / 1.00 / 0.95, flips 1.00 / 0.97 / 0.91; on this test's 40 per depth
    flips 1.00 / 0.95 / 0.925. The backbone zero-shot: right 1.00 / 1.00 / 0.90, flips 0.99 / 0.96 / 0.85.
    120 steps were not enough at 3 hops (right 0.91, flips 0.86: the backbone's own search, made-up steps and
    loops after backing up); 400 steps at lr 3e-4 neither (flips 0.84 at 3 hops), nor the demo's lr 1e-3."""
    from research.binding import finetune_binding  # the archived probe's reading of the backbone, same problems

    settings = demo.DemoSettings(train_n=SEARCH_STEPS * 32, eval_n=120, seed=5, learning_rate=1e-4)
    assert settings.backbone == "logic-gpt2-search" and settings.trace == "dfs"  # the demo's defaults
    held, hops, ev, pr = fine_tune_and_probe("cot", settings, SEARCH_STEPS, tmp_path, 160)
    assert sorted(ev["by_hops"]) == ["1", "2", "3"] and pr["swapped"]["n"] == 120
    right = {h: ev["by_hops"][h]["accuracy"] for h in ("1", "2", "3")}
    flips = {h: pr["by_hops"][h]["flip_rate"]["mean"] for h in ("1", "2", "3")}
    zero_shot = finetune_binding.zero_shot(settings.backbone, held, hops, 160)
    print("right", right, "flips", flips, "zero-shot", {h: (z["right"], z["flips"]) for h, z in zero_shot.items()})
    for h in ("1", "2", "3"):  # nothing the backbone does is lost (4 of 40 problems of slack)
        assert right[h] >= zero_shot[h]["right"] - 0.1, (h, right, zero_shot[h])
        assert flips[h] >= zero_shot[h]["flips"] - 0.1, (h, flips, zero_shot[h])
    assert right["1"] >= 0.9 and right["2"] >= 0.9 and right["3"] >= 0.9, right
    assert flips["1"] >= 0.9 and flips["2"] >= 0.9 and flips["3"] >= 0.9, flips  # issue 10, item 1
