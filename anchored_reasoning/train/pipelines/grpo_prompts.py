"""How a GRPO policy is prompted: the method (the checkpoint's own trained format, or the task's instruct
template) and the dataset rows rendered with it. Shared by the causal-LM path (:mod:`.grpo`) and the
diffusion one (:mod:`.diffusion_grpo`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from anchored_reasoning.checkpoints import CHECKPOINT_META
from anchored_reasoning.errors import ConfigError
from anchored_reasoning.train.trainers.grpo_trainer import AnchorTable
from anchored_reasoning.types import Example


@dataclass
class Prompting:
    """How the policy is prompted: the method object, its style and the checkpoint metadata to carry on."""

    method: Any
    style: str
    meta: dict[str, Any] | None


def choose_method(recipe: Mapping[str, Any], meta: Mapping[str, Any] | None) -> Prompting:
    from anchored_reasoning.methods import get_method

    cfg = dict(recipe.get("method") or {})
    options = dict(cfg.get("options") or {})
    if meta and meta.get("style", "trained") == "trained" and meta.get("method") not in (None, "text"):
        if cfg.get("name") and cfg["name"] != meta["method"]:
            raise ConfigError(f"the checkpoint was trained with method {meta['method']!r} ({CHECKPOINT_META}); "
                              f"method.name={cfg['name']!r} would prompt it in a format it never saw")
        method = get_method(meta["method"], style="trained", **{**dict(meta.get("method_options") or {}), **options})
        return Prompting(method, "trained", dict(meta))
    if recipe.get("model", {}).get("preset"):  # a from-scratch model (tests): trained style by definition
        if not cfg.get("name"):
            raise ConfigError("a model.preset recipe needs method.name")
        return Prompting(get_method(cfg["name"], style="trained", **options), "trained", None)
    return Prompting(get_method(cfg.get("name") or "cot", **options), "instruct", None)


def build_rows(examples: Sequence[Example], prompting: Prompting, task: Any, tokenizer,
               anchor_table: AnchorTable | None = None) -> list[dict[str, Any]]:
    """Dataset rows: ``prompt`` (text, or chat turns for an instruct model with a chat template) and
    ``example`` (the gold, for the rewards); fills ``anchor_table`` from the rendered anchors."""
    from anchored_reasoning.train.data.collate import example_to_row

    chat = prompting.style == "instruct" and getattr(tokenizer, "chat_template", None)
    rows = []
    for i, ex in enumerate(examples):
        if prompting.style == "trained":
            rendered = prompting.method.render(ex, task)
            prompt: Any = rendered.prompt
            if anchor_table is not None:
                anchor_table.add(rendered.prompt, rendered.anchors, where=f"row {i} (id {ex.id!r})")
        else:
            p = prompting.method.prompt(ex, task)
            prompt = p.messages if chat else p.text
        rows.append({"prompt": prompt, **example_to_row(ex)})
    return rows
