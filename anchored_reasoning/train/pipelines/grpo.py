"""The ``grpo`` trainer: RL from verifiable rewards with TRL's ``GRPOTrainer``, optionally anchored.

    anchored-reasoning train grpo_prosqa_logic_cpu model.name=runs/prosqa_logic_cpu_acot
    anchored-reasoning train grpo_gsm8k_smollm2 training.use_vllm=true training.vllm_mode=colocate

A recipe (YAML, see ``train/grpo_*.yaml``)::

    trainer: grpo
    task: prosqa                      # default: the checkpoint's task (anchored_reasoning.json)
    model: {name: runs/prosqa-acot}   # a checkpoint trained here, an instruct model (path / Hub id / alias)
    method: {name: cot}               # instruct models only (nocot | cot); checkpoints use their own format
    data:  {train: {generator: prosqa, n: 2000}}    # or {split: train, limit: ...}
    rewards: {correctness: 1.0, format: 0.1, anchor_coverage: 0.0}   # train/rewards.py; weight 0 = off
    training: {max_steps: 50, num_generations: 8, max_completion_length: 128, gamma: 1.0}  # AnchoredGRPOConfig

**Which format.** A checkpoint written by our trainers carries ``anchored_reasoning.json``: its method and
options are read from it and every prompt is rendered by that method's own render code (an ACoT
checkpoint keeps its ``[BoA] [ANT]... [EoA]`` slots in the prompt). Any other model is prompted like the
evals prompt it (the task's instruct template, as chat turns when the tokenizer has a chat template).
A diffusion checkpoint (``"backend": "diffusion"``) is trained by :mod:`.diffusion_grpo` instead.

**Anchored GRPO.** With ``gamma > 0`` and prompts holding ``[ANT]`` slots the loss adds ``gamma x`` the
anchor cross-entropy at the slots, scored in the same forward pass (:mod:`.grpo_trainer`).

Checkpoints and resume work as in every trainer (:mod:`.checkpointing`): the transformers Trainer's own
``checkpoint-N`` folders (recipes save by default); rerunning the same command resumes from the newest.
"""
from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, NoReturn, Sequence

import torch

from anchored_reasoning.checkpoints import CHECKPOINT_META
from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning.train import peft_setup
from anchored_reasoning.train import recipes as recipes_mod
from anchored_reasoning.train.pipelines.grpo_prompts import Prompting, build_rows, choose_method
from anchored_reasoning.train.trainers.grpo_trainer import AnchoredGRPOConfig, AnchoredGRPOTrainer, AnchorTable
from anchored_reasoning.train.pipelines.skeleton import Pipeline, Run, execute, start
from anchored_reasoning.types import Example

__all__ = ["AnchoredGRPOConfig", "AnchoredGRPOTrainer", "AnchorTable", "GRPOPipeline", "Prompting", "build_rows",
           "choose_method", "prepare", "build_trainer", "run"]

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# recipe

def resolve_recipe(recipe: Mapping[str, Any] | str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Load, apply dotted overrides, build the grpo recipe's sections (every trainer-config field is known
    here: the diffusion config's are a superset) and check them."""
    return recipes_mod.resolve(recipe, overrides, trainer="grpo")


def make_config(recipe: Mapping[str, Any], output_dir: Path, config_cls: type | None = None):
    """The trainer config, with the shared save defaults (train/checkpointing.py) under the recipe's values.
    ``config_cls`` defaults to what the recipe itself implies (a ``sampler`` section: a diffusion recipe);
    :func:`prepare` passes the one the start checkpoint needs."""
    from anchored_reasoning.train.checkpointing import with_save_defaults

    if config_cls is None:
        from anchored_reasoning.train.trainers.diffusion_grpo import DiffusionGRPOConfig

        config_cls = DiffusionGRPOConfig if recipe.get("sampler") else AnchoredGRPOConfig

    training = with_save_defaults(recipe.get("training") or {})
    training.setdefault("seed", int(recipe.get("seed", 0)))
    training["output_dir"] = str(output_dir)
    training.pop("resume_from_checkpoint", None)  # read by checkpointing.plan_resume
    try:
        config = config_cls(**training)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"recipe 'training' section: {exc}") from None
    return config


def check_generation_backend(config: Any) -> None:
    """``use_vllm`` needs vLLM and a CUDA GPU; a CPU recipe never touches vLLM."""
    if not getattr(config, "use_vllm", False):
        return
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError("training.use_vllm=true needs vLLM installed (pip install vllm) on a CUDA machine; "
                          "set training.use_vllm=false to generate with transformers")
    if not torch.cuda.is_available():
        raise ConfigError("training.use_vllm=true needs a CUDA GPU, and none is visible; "
                          "set training.use_vllm=false on a CPU")
    if config.vllm_mode not in ("server", "colocate"):
        raise ConfigError(f"training.vllm_mode must be 'server' or 'colocate', got {config.vllm_mode!r}")


def start_meta(name: str | None) -> dict[str, Any] | None:
    """The start model's ``anchored_reasoning.json`` (method, options, task, backend), None for other models."""
    from anchored_reasoning.checkpoints import read_checkpoint_meta
    from anchored_reasoning.models.zoo import resolve_model

    return read_checkpoint_meta(resolve_model(str(name))) if name else None


def _no_task(model_cfg: Mapping[str, Any]) -> NoReturn:
    """Raise the reason a recipe without ``task`` has none: no start model, a start that is no local checkpoint
    (not trained yet, or a mistyped path), or a checkpoint whose metadata names no task."""
    from anchored_reasoning.models.zoo import ALIASES

    name = model_cfg.get("name")
    if not name and not model_cfg.get("preset"):
        why = "model.name is not set; give the start checkpoint, e.g. model.name=runs/<your SFT run>"
    elif name and str(name) not in ALIASES and not Path(str(name)).expanduser().is_dir():
        why = (f"the start checkpoint {name!r} does not exist here ({Path(str(name)).expanduser().absolute()}), so "
               f"there is no {CHECKPOINT_META} to read the task from; train it first or fix model.name "
               "(a Hub model needs task=<name>)")
    else:
        why = f"the start model {name or 'model.preset'!r} has no {CHECKPOINT_META} naming one; set task=<name>"
    raise ConfigError(f"recipe needs 'task': {why}")


def load_policy(model_cfg: Mapping[str, Any], texts: Sequence[str], work_dir: Path, seed: int,
                extra_tokens: Sequence[str] = (), load_kwargs: Mapping[str, Any] | None = None):
    """(model, tokenizer) for an AR policy; instruct models keep their vocabulary (vLLM loads them as is).
    ``extra_tokens``: the method's own (``TrainedMethod.added_tokens``), for a policy built from a preset; a
    checkpoint's tokenizer already holds its method's."""
    from transformers import AutoTokenizer

    from anchored_reasoning.models.zoo import resolve_model
    from anchored_reasoning.train.pipelines import ar

    if model_cfg.get("preset"):
        model, tokenizer = ar.build_model_and_tokenizer(model_cfg, texts, work_dir, seed, extra_tokens=extra_tokens)
    else:
        if not model_cfg.get("name"):
            raise ConfigError("recipe 'model' needs 'name' (a checkpoint, Hub id or alias) or 'preset'")
        path = resolve_model(str(model_cfg["name"]))
        tok = model_cfg.get("tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(str(tok)) if tok else path)
        kwargs = {"dtype": getattr(torch, str(model_cfg["dtype"]))} if model_cfg.get("dtype") else {}
        from anchored_reasoning.models.adapters import load_causal_lm  # a LoRA SFT run: merged onto its base

        model = load_causal_lm(path, **kwargs, **dict(load_kwargs or {}))
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    tokenizer.padding_side = "left"
    return model, tokenizer


@dataclass
class Plan:
    """Everything a GRPO run needs, validated, before any model is loaded (see :func:`prepare`)."""

    recipe: dict[str, Any]
    config: Any
    meta: dict[str, Any] | None
    task: Any
    prompting: Prompting
    examples: list[Example]
    rewards: Any
    resume: Any = None  # the checkpointing.ResumePlan: where this run resumes from, or that it is finished

    @property
    def diffusion(self) -> bool:
        return bool(self.meta and self.meta.get("backend") == "diffusion")


class GRPOPipeline(Pipeline):
    """The ``grpo`` kind's hooks on the run skeleton (:mod:`.skeleton`). The start checkpoint's metadata
    picks the config class (diffusion or causal LM) and the prompting; every bad key or row fails before
    any model loads."""

    kind = "grpo"

    def configure(self, recipe, output_dir):
        self.start = start_meta((recipe.get("model") or {}).get("name"))
        self.task_name = recipe.get("task") or (self.start or {}).get("task") or _no_task(recipe.get("model") or {})
        if self.start and self.start.get("backend") == "diffusion":
            from anchored_reasoning.train.trainers.diffusion_grpo import DiffusionGRPOConfig

            config = make_config(recipe, output_dir, DiffusionGRPOConfig)
            if config.use_vllm:
                raise ConfigError("training.use_vllm does not apply to a diffusion model (its samplers generate)")
        else:
            if recipe.get("sampler"):
                raise ConfigError("recipe 'sampler' applies to diffusion checkpoints only; this start model is a causal LM")
            config = make_config(recipe, output_dir, AnchoredGRPOConfig)  # bad values fail before any data or model work
        check_generation_backend(config)
        peft_setup.check_runtime(recipe.get("peft"), diffusion=bool(self.start and self.start.get("backend") == "diffusion"))
        return config

    def prepare(self, run: Run) -> Mapping[str, Any]:
        from anchored_reasoning.tasks import get_task
        from anchored_reasoning.train.checkpointing import examples_fingerprint
        from anchored_reasoning.train.data.data_sources import load_split
        from anchored_reasoning.train.rewards import build_rewards, check_gold

        recipe, config = run.recipe, run.config
        task = get_task(self.task_name)
        prompting = choose_method(recipe, self.start)
        examples = load_split(dict(recipe.get("data") or {}).get("train"), self.task_name, int(recipe.get("seed", 0)))
        if not examples:
            raise DataError("recipe data.train produced no examples")
        check_gold(examples, task)  # an unreadable gold answer fails here, naming the row
        rewards_cfg = dict(recipe.get("rewards") or {}) or None
        timeout = rewards_cfg.pop("tests_timeout_s", None) if rewards_cfg else None
        rewards = build_rewards(rewards_cfg, task, prompting.style, tests_timeout_s=timeout)
        config.reward_weights = rewards.weights
        run.state["plan"] = Plan(recipe, config, self.start, task, prompting, list(examples), rewards)
        return {"_examples": examples_fingerprint(examples)}

    def build(self, run: Run) -> None:
        plan = run.state["plan"]
        plan.resume = run.resume
        run.trainer, run.tokenizer = build_trainer(plan, [run.budget])

    def meta(self, run: Run) -> dict[str, Any] | None:
        plan, recipe = run.state["plan"], run.recipe
        if plan.prompting.style != "trained":
            return None
        meta = dict(plan.meta or {"style": "trained", "task": recipe.get("task")})  # prompted exactly as trained
        meta.update({"method": plan.prompting.method.name, "method_options": plan.prompting.method.options,
                     "grpo": self.facts(run)})
        adapter = peft_setup.adapter_meta(run.trainer.model, (recipe.get("model") or {}).get("name"))
        meta.update({"peft": adapter} if adapter else {})
        meta.setdefault("task", recipe.get("task"))
        return meta

    def facts(self, run: Run) -> dict[str, Any]:
        trainer, rewards, model_cfg = run.trainer, run.state["plan"].rewards, run.recipe.get("model", {})
        return {"start": model_cfg.get("name") or model_cfg.get("preset"), "steps": trainer.state.global_step,
                "gamma": float(getattr(trainer.args, "gamma", 0.0)),
                "rewards": dict(zip([f.name for f in rewards.funcs], rewards.weights)),
                "loss_type": trainer.args.loss_type, "max_completion_length": trainer.args.max_completion_length}

    def summary(self, run: Run) -> dict[str, Any]:
        plan = run.state["plan"]
        return {"grpo": self.facts(run), "style": plan.prompting.style, "reward_failures": plan.rewards.failures(),
                **trainer_facts(run.trainer)}


def prepare(recipe: Mapping[str, Any] | str, overrides: Sequence[str] = ()) -> Plan:
    """Resolve the recipe, build the trainer config, read the start checkpoint's metadata, load and
    gold-check the data, build the rewards and plan the resume (the skeleton's steps 1-2). Every bad key or
    row fails here."""
    run = start(GRPOPipeline(), recipe, overrides)
    plan = run.state["plan"]
    plan.resume = run.resume
    return plan


def build_trainer(plan: Plan, callbacks: Sequence[Any] = ()):
    """(trainer, tokenizer) for a prepared plan: :class:`AnchoredGRPOTrainer` for a causal LM,
    :class:`~.diffusion_grpo.DiffusionGRPOTrainer` for a diffusion checkpoint."""
    from datasets import Dataset

    from anchored_reasoning.train.pipelines.ar import training_texts

    if plan.diffusion:
        from anchored_reasoning.train.trainers.diffusion_grpo import build_trainer as build_diffusion

        return build_diffusion(plan, callbacks)
    config, model_cfg = plan.config, dict(plan.recipe.get("model") or {})
    Path(config.output_dir).mkdir(parents=True, exist_ok=True)
    needs_texts = model_cfg.get("preset") and model_cfg.get("tokenizer") in (None, "train")
    texts = training_texts(plan.examples[:5000], plan.prompting.method, plan.task.name) if needs_texts else []
    model, tokenizer = load_policy(model_cfg, texts, Path(config.output_dir), int(plan.recipe.get("seed", 0)),
                                   getattr(plan.prompting.method, "added_tokens", ()), peft_setup.load_kwargs(plan.recipe.get("peft")))
    added = getattr(plan.prompting.method, "added_tokens", ())
    model = peft_setup.wrap(model, peft_setup.lora_config(plan.recipe.get("peft"), model, tokenizer, added), seed=config.seed)
    table = AnchorTable(tokenizer, config.ant_token) if getattr(plan.prompting.method, "anchored", False) else None
    rows = build_rows(plan.examples, plan.prompting, plan.task, tokenizer, table)
    if table is not None:
        logger.info("anchored GRPO: %d prompts carry anchor labels (gamma=%s)", len(table), config.gamma)
    trainer = AnchoredGRPOTrainer(model=model, reward_funcs=plan.rewards.funcs, args=config,
                                  train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                                  callbacks=list(callbacks), anchor_table=table)
    return trainer, tokenizer


def run(recipe: Mapping[str, Any] | str, overrides: Sequence[str] = ()) -> Path:
    """Train from a recipe (dict, name or path) with dotted overrides. Returns the checkpoint folder."""
    return execute(GRPOPipeline(), recipe, overrides)


def trainer_facts(trainer) -> dict[str, Any]:
    """What the summary records about the trainer: anchored prompts (AR) or the sampler (diffusion)."""
    if hasattr(trainer, "sampler_config"):
        return {"sampler": trainer.sampler_config.remasking, "prompt_mask_ratio": trainer.args.prompt_mask_ratio}
    return {"anchor_prompts": len(trainer.anchor_table or ())}
