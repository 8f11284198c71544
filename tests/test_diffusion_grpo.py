"""Diffusion GRPO (d1's diffu-GRPO) on a tiny ADLM checkpoint trained here, on CPU in seconds: TRL's loop
calls both overrides, the log-prob pass masks the whole completion and a reproducible share of the prompt,
the result is a diffusion checkpoint the diffusion backend loads; settings that do not apply fail early."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.train.pipelines import grpo
from anchored_reasoning.train.trainers.diffusion_grpo import DiffusionGRPOTrainer

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def dsft(tmp_path_factory) -> Path:
    from anchored_reasoning.train.pipelines import diffusion

    return diffusion.run("diffusion_tiny_test", [f"output_dir={tmp_path_factory.mktemp('dsft')}"])


def test_trls_loop_calls_every_override(dsft, tmp_path, monkeypatch):
    calls = {"_generate_single_turn": 0, "_get_per_token_logps_and_entropies": 0}
    for name in calls:
        original = getattr(DiffusionGRPOTrainer, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(DiffusionGRPOTrainer, name, counted)
    # num_iterations=2: one generation serves 2 steps, so TRL also asks for old-policy log-probs; beta > 0
    # adds the reference model's. 2 steps = 1 generation, 1 old + 1 reference + 2 loss log-prob passes.
    out = grpo.run("grpo_diffusion_tiny_test", [f"model.name={dsft}", f"output_dir={tmp_path}",
                                                "training.num_iterations=2", "training.beta=0.04"])
    assert calls == {"_generate_single_turn": 1, "_get_per_token_logps_and_entropies": 4}
    summary = json.loads((out / "train_summary.json").read_text())
    steps = [h for h in summary["log_history"] if "loss" in h]
    assert len(steps) == 2 and all(torch.isfinite(torch.tensor(h["loss"])) for h in steps)
    assert steps[0]["completions/max_length"] <= 16 and "kl" in steps[0]
    meta = json.loads((out / "anchored_reasoning.json").read_text())
    assert meta["backend"] == "diffusion" and meta["method"] == "cot" and meta["grpo"]["steps"] == 2

    from anchored_reasoning.sampling.adapters import load_masked_diffusion_model

    assert type(load_masked_diffusion_model(str(out))).__name__ == "ADLM"  # what the diffusion backend loads


def test_the_log_prob_pass_masks_the_completion_and_a_fixed_share_of_the_prompt(dsft, tmp_path):
    plan = grpo.prepare("grpo_diffusion_tiny_test", [f"model.name={dsft}", f"output_dir={tmp_path}",
                                                     "training.prompt_mask_ratio=0.5"])
    trainer, tok = grpo.build_trainer(plan)
    model = trainer.model
    seen = []
    original = model.forward

    def spy(*args, **kwargs):
        seen.append(kwargs["input_ids"].clone())
        return original(*args, **kwargs)

    model.forward = spy
    prompt = tok(trainer.train_dataset[0]["prompt"])["input_ids"]
    ids = torch.tensor([prompt + [5, 6, 7, 8]] * 2)
    ids[1, -1] = 9  # another completion: another row seed
    mask = torch.ones_like(ids)
    trainer.generation_rounds = 1
    logps, entropies, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, 4, compute_entropy=True)
    assert logps.shape == (2, 4) and entropies.shape == (2, 4) and bool((logps <= 0).all())
    noisy = seen[-1]
    mask_id = trainer.mask_token_id
    assert bool((noisy[:, -4:] == mask_id).all())  # the whole completion is masked
    masked_prompt = noisy[:, :-4] == mask_id
    assert 0.2 < masked_prompt.float().mean().item() < 0.8  # about half of the prompt at ratio 0.5
    again, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, 4)
    torch.testing.assert_close(again, logps)  # same row, same round: the same mask (old = new policy)
    assert torch.equal(seen[-1], noisy)
    trainer.generation_rounds = 2
    trainer._get_per_token_logps_and_entropies(model, ids, mask, 4)
    assert not torch.equal(seen[-1], noisy)  # a new generation round draws a new prompt mask


def test_settings_that_do_not_apply_fail_before_training(dsft, tmp_path):
    base = [f"model.name={dsft}", f"output_dir={tmp_path}"]
    with pytest.raises(ConfigError, match="AR models only"):
        grpo.run("grpo_diffusion_tiny_test", base + ["training.gamma=1.0"])
    with pytest.raises(ConfigError, match="use_vllm"):
        grpo.run("grpo_diffusion_tiny_test", base + ["training.use_vllm=true"])
    with pytest.raises(ConfigError, match="prompt_mask_ratio"):
        grpo.run("grpo_diffusion_tiny_test", base + ["training.prompt_mask_ratio=1.5"])
    with pytest.raises(ConfigError, match="positions"):
        grpo.run("grpo_diffusion_tiny_test", base + ["training.max_completion_length=400"])
    assert not (tmp_path / "train_summary.json").exists()


def test_a_policy_step_raises_the_advantage_weighted_log_likelihood(dsft, tmp_path):
    """The gradient through the masked log-prob pass points the right way: after one small SGD step on
    the GRPO loss, completions with a positive advantage gained log-likelihood relative to the others."""
    from anchored_reasoning.train.rewards import RewardSet

    plan = grpo.prepare("grpo_diffusion_tiny_test", [f"model.name={dsft}", f"output_dir={tmp_path}"])

    def vowels(prompts, completions, **_):  # any reward that differs inside a group
        return [sum(c in "aeiou" for c in text) / max(len(text), 1) for text in completions]

    plan.rewards, plan.config.reward_weights = RewardSet([vowels], [1.0]), [1.0]
    trainer, _ = grpo.build_trainer(plan)
    model = trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    rows = [dict(trainer.train_dataset[i]) for i in range(2) for _ in range(4)]
    torch.manual_seed(0)
    inputs = trainer._generate_and_score_completions(rows)
    adv = inputs["advantages"]
    assert bool((adv != 0).any())
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    width, keep = inputs["completion_ids"].size(1), inputs["completion_mask"].float()

    def objective() -> float:
        with torch.no_grad():
            logps, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, width)
        return float((adv * (logps * keep).sum(1)).sum())

    before = objective()
    model.zero_grad()
    trainer.compute_loss(model, inputs).backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= 1e-3 * p.grad
    assert objective() > before


@pytest.mark.parametrize("arch", ["mdlm", "tadm"])
def test_mdlm_and_tadm_checkpoints_train_too(dsft, tmp_path, arch):
    import shutil

    from anchored_reasoning.models import TADM
    from anchored_reasoning.sampling.adapters import load_masked_diffusion_model
    from anchored_reasoning.train.pipelines import diffusion

    if arch == "mdlm":
        start = diffusion.run("diffusion_tiny_test", [f"output_dir={tmp_path / 'mdlm'}", "model.arch=mdlm",
                                                      "training.anchored=false", "training.max_steps=1"])
    else:  # a TADM built from the ADLM (the post-training starting point), with the SFT's tokenizer and metadata
        start = tmp_path / "tadm"
        TADM.from_diffusion_model(load_masked_diffusion_model(str(dsft))).save_pretrained(start)
        for f in dsft.iterdir():
            if f.is_file() and not f.name.startswith(("model", "config", "train_summary")):
                shutil.copy(f, start / f.name)
    out = grpo.run("grpo_diffusion_tiny_test", [f"model.name={start}", f"output_dir={tmp_path / 'out'}",
                                                "training.max_steps=1"])
    assert json.loads((out / "train_summary.json").read_text())["global_steps"] == 1
    assert type(load_masked_diffusion_model(str(out))).__name__ == arch.upper()
