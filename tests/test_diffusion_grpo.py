"""Diffusion GRPO (d1's diffu-GRPO) on a tiny ADLM checkpoint trained here, on CPU in seconds: TRL's loop
calls both overrides, the log-prob pass masks the whole completion and a reproducible share of the prompt,
the result is a diffusion checkpoint the diffusion backend loads; settings that do not apply fail early."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from anchored_reasoning.errors import ConfigError
from anchored_reasoning.train import grpo
from anchored_reasoning.train.diffusion_grpo import DiffusionGRPOTrainer

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def dsft(tmp_path_factory) -> Path:
    from anchored_reasoning.train import diffusion

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
