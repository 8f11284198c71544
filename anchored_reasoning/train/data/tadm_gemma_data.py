"""The ``tadm_gemma`` trainer's recipe value checks and data: (context, canvas) rows and their collator.

A row is what one DiffusionGemma denoising problem needs: the context the encoder reads (token ids)
and one canvas of ``canvas_length`` clean target tokens the decoder must recover. From a task's
examples (``task`` + ``data.train``, a section as in the other trainers): the context is the task's
instruct prompt for ``data.method`` (through the tokenizer's chat template when it has one, as the
``diffusion_gemma`` backend prompts), the target the example's steps and its answer line; a target
longer than a canvas gives the canvas at a random offset (whole canvases), its earlier canvases
joining the context. From a text file (``data.text_file``): each document is cut at a random point.
A target ends with EOS and is padded with the pad token, as ``generate`` leaves a finished canvas.
The context keeps its last ``data.max_context`` tokens.
"""
from __future__ import annotations

import random
import typing
from typing import Any, Mapping, Sequence

import torch

from anchored_reasoning.errors import ConfigError, DataError

TRAINER = "tadm_gemma"
TINY_KEYS = ("hidden_size", "num_layers", "num_heads", "head_dim", "intermediate_size", "num_experts", "top_k_experts",
             "canvas_length", "sliding_window", "max_positions", "tokenizer_vocab")


def _type_ok(value: Any, hint: Any) -> bool:
    """Whether ``value`` fits a dataclass field's type hint (only the plain cases are checked)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return any(_type_ok(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is list:
        return isinstance(value, list) and (not args or all(_type_ok(v, args[0]) for v in value))
    return True  # enums, dicts and other fields: left to the config's own checks


def check_recipe(recipe: Mapping[str, Any], config_cls: type) -> None:
    """Every value of a checkable type, before anything loads (ConfigError naming the key and the value); the
    keys are known already (``recipes.sections.TADMGemmaRecipe``). ``config_cls``: the config of ``training``."""
    if recipe.get("trainer", TRAINER) != TRAINER:
        raise ConfigError(f"recipe trainer is {recipe.get('trainer')!r}; this is the {TRAINER!r} trainer")
    hints = typing.get_type_hints(config_cls)
    for key, value in (recipe.get("training") or {}).items():
        if not _type_ok(value, hints.get(key, Any)):
            raise ConfigError(f"recipe key training.{key}={value!r}: expected {hints[key]}")
    model, data = dict(recipe.get("model") or {}), dict(recipe.get("data") or {})
    if bool(model.get("name")) == bool(model.get("tiny")):
        raise ConfigError("recipe 'model' needs exactly one of name (a DiffusionGemma checkpoint: folder or Hub id) "
                          f"or tiny (a mapping of {', '.join(TINY_KEYS)} for a random small model)")
    if model.get("tiny") is not None:
        for k, v in model["tiny"].items():  # a mapping of TINY_KEYS (recipes.sections checked its keys)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"recipe key model.tiny.{k}={v!r} must be an integer >= 1")
    for key in ("fusion_dim", "fusion_heads"):
        v = model.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ConfigError(f"recipe key model.{key}={v!r} must be an integer >= 1")
    split = model.get("split")
    if split is not None and not (isinstance(split, list) and len(split) == 3
                                  and all(isinstance(p, int) and not isinstance(p, bool) for p in split)):
        raise ConfigError(f"recipe key model.split={split!r} must be three integers [shared, anchor, denoiser], "
                          "e.g. [2, 20, 8] (null: the paper's proportions)")
    if model.get("dtype") not in (None, "auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16"):
        raise ConfigError(f"recipe key model.dtype={model['dtype']!r}: use auto, float32, bfloat16 or float16")
    if bool(data.get("train")) == bool(data.get("text_file")):
        raise ConfigError("recipe 'data' needs exactly one of train (task examples, with task: and data.method) "
                          "or text_file (documents)")
    if data.get("train") and not (recipe.get("task") and isinstance(data.get("method"), str)):
        raise ConfigError("recipe data.train needs task: <name> and data.method: <instruct method, e.g. cot>")
    mc = data.get("max_context", 1)
    if not isinstance(mc, int) or isinstance(mc, bool) or mc < 1:
        raise ConfigError(f"recipe key data.max_context={mc!r} must be an integer >= 1")


# --------------------------------------------------------------------------- rows
def _target_ids(tokenizer, text: str, canvas: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """(earlier canvases' ids, one canvas of ids) for a target text: ends with EOS, padded to the canvas."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
    n_canvases = -(-len(ids) // canvas)
    k = rng.randrange(n_canvases)
    window = ids[k * canvas:(k + 1) * canvas]
    return ids[:k * canvas], window + [tokenizer.pad_token_id] * (canvas - len(window))


def example_rows(examples: Sequence[Any], task_name: str, method_name: str, tokenizer, canvas: int,
                 max_context: int, seed: int) -> list[dict[str, list[int]]]:
    """Rows from task examples (see the module doc)."""
    from anchored_reasoning.methods import get_method
    from anchored_reasoning.methods.answers import answer_line
    from anchored_reasoning.tasks import get_task

    task, method = get_task(task_name), get_method(method_name)
    rng, rows = random.Random(seed), []
    for ex in examples:
        prompt = method.prompt(ex, task)
        if prompt.messages and getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=False)
            context = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        else:
            context = list(tokenizer(prompt.text)["input_ids"])
        target = " ".join(s.strip() for s in (ex.steps or [])) + "\n" + answer_line(ex, task_name)
        before, window = _target_ids(tokenizer, target.strip(), canvas, rng)
        rows.append({"context": (context + before)[-max_context:], "canvas": window})
    if not rows:
        raise DataError("recipe data.train produced no examples")
    return rows


def text_rows(documents: Sequence[str], tokenizer, canvas: int, max_context: int, seed: int) -> list[dict[str, list[int]]]:
    """Rows from documents: a random cut, the context before it (at least one token), a canvas after it."""
    rng, rows = random.Random(seed), []
    for doc in documents:
        ids = list(tokenizer(doc)["input_ids"])
        if len(ids) < 2:
            continue
        cut = rng.randrange(1, len(ids))
        window = ids[cut:cut + canvas]
        if len(window) < canvas:
            window = window + [tokenizer.eos_token_id] + [tokenizer.pad_token_id] * (canvas - len(window) - 1)
        rows.append({"context": ids[:cut][-max_context:], "canvas": window[:canvas]})
    if not rows:
        raise DataError("recipe data.text_file holds no document of two or more tokens")
    return rows


class ContextCanvasCollator:
    """Rows -> ``input_ids`` (contexts, left-padded), ``attention_mask`` and ``canvas`` (B, canvas_length)."""

    def __init__(self, pad_token_id: int):
        self.pad_token_id = pad_token_id

    def __call__(self, rows: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        from anchored_reasoning.backends import left_pad

        input_ids, mask = left_pad([r["context"] for r in rows], self.pad_token_id)
        return {"input_ids": input_ids, "attention_mask": mask,
                "canvas": torch.tensor([r["canvas"] for r in rows], dtype=torch.long)}
