"""The task registry: reasoning benchmarks declared in YAML files.

```python
from anchored_reasoning.tasks import get_task, list_tasks
task = get_task("gsm8k")
examples = task.load("test")                  # local files if data_dir / $ANCHORED_REASONING_DATA, else the Hub
grade = task.grade(completion, examples[0])   # Grade(correct, extracted, details)
```

Each task is one YAML file (``tasks/<name>.yaml`` in a checkout, a copy inside the wheel
when installed). Folders are searched in the order of
``anchored_reasoning.resources.search_dirs("tasks")``: ``$ANCHORED_REASONING_TASKS_DIR``
first, then the built-in folder, so a user adds or overrides a task by dropping a YAML
file there. The keys are documented in docs/tasks.md; Python hooks (row loader,
extractor, grader) are referenced by registered name or ``"package.module:function"``.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning.resources import data_dir as resolve_data_dir
from anchored_reasoning.resources import search_dirs
from anchored_reasoning.tasks import loaders
from anchored_reasoning.tasks.extract import EXTRACTORS, Extractor
from anchored_reasoning.tasks.graders import BATCH_GRADERS, GRADERS, accepts_keyword
from anchored_reasoning.types import Example, Grade

logger = logging.getLogger(__name__)

__all__ = ["Task", "get_task", "list_tasks", "format_choices", "task_files"]

_TOP_KEYS = {
    "name", "description", "splits", "data", "extractor", "grader", "grader_options",
    "prompts", "generation", "metrics", "is_code", "license", "citation",
}
_DATA_KEYS = {"loader", "options", "local", "hub"}
_HUB_KEYS = {"kind", "path", "name", "revision", "splits", "message"}
_GENERATION_KEYS = {"max_new_tokens", "stop", "methods"}


def format_choices(choices: list[str] | None) -> str:
    """``["x", "y"]`` -> ``"A) x\\nB) y"`` (empty string for no choices)."""
    if not choices:
        return ""
    return "\n".join(f"{loaders.LETTERS[i]}) {choice}" for i, choice in enumerate(choices))


_TEMPLATE_FIELDS = ("question", "choices", "entry_point")


def _fill(template: str, fields: dict[str, str]) -> str:
    # Python format strings: {question} etc. are fields, literal braces are doubled ({{ }}).
    return template.format(**fields)


@dataclass
class Task:
    """One benchmark: where its data lives, how to prompt for it, and how to grade answers."""

    name: str
    splits: list[str]
    loader: str
    prompts: dict[str, str]
    extractor: str
    grader: str
    description: str = ""
    loader_options: dict[str, Any] = field(default_factory=dict)
    local: dict[str, str] = field(default_factory=dict)
    hub: dict[str, Any] = field(default_factory=dict)
    grader_options: dict[str, Any] = field(default_factory=dict)
    generation: dict[str, Any] = field(default_factory=dict)
    metrics: list[str] = field(default_factory=lambda: ["accuracy"])
    is_code: bool = False
    license: str = ""
    path: Path | None = None

    # ------------------------------------------------------------------ data

    def load(self, split: str, data_dir: str | os.PathLike | None = None, limit: int | None = None) -> list[Example]:
        """Examples of ``split``, every row validated.

        ``data_dir`` (or ``$ANCHORED_REASONING_DATA``) selects local files laid out like the
        project's shared/data folder; without either the pinned Hub source is used.
        ``limit`` keeps the first ``limit`` examples (all rows are still validated).
        """
        if split not in self.splits:
            raise ConfigError(f"task {self.name!r} has no split {split!r}; splits: {', '.join(self.splits)}")
        if limit is not None and limit < 0:
            raise ConfigError(f"limit must be >= 0, got {limit}")
        hook = loaders.resolve_hook(self.loader, loaders.ROW_HOOKS, "row loader")
        root = resolve_data_dir(data_dir)
        if root is not None:
            relative = self.local.get(split)
            if relative is None:
                raise DataError(
                    f"task {self.name!r}: split {split!r} has no local file (data.local in {self.path}); "
                    "unset data_dir/$ANCHORED_REASONING_DATA to load it from the Hub"
                )
            path = root / relative
            if not path.is_file():
                raise DataError(
                    f"task {self.name!r}: local file {path} for split {split!r} not found "
                    f"(data directory {root}); unset data_dir/$ANCHORED_REASONING_DATA to load it from the Hub"
                )
            rows = loaders.read_rows(path)
        else:
            rows = loaders.hub_rows(self.name, self.hub, split)
        examples = loaders.load_examples(self.name, rows, hook, split, self.loader_options)
        logger.debug("task %s split %s: %d examples", self.name, split, len(examples))
        return examples[:limit] if limit is not None else examples

    # ------------------------------------------------------------------ prompting

    @staticmethod
    def format_choices(choices: list[str] | None) -> str:
        """The lettered options as prompts show them (:func:`format_choices`)."""
        return format_choices(choices)

    def render_question(self, example: Example) -> str:
        """The question text, followed by the lettered choices for multiple-choice tasks."""
        if example.choices:
            return f"{example.question}\n\n{format_choices(example.choices)}"
        return example.question

    def format_prompt(self, method: str, example: Example) -> str:
        """Fill the template ``prompts[method]`` (a Python format string, literal braces doubled).

        ``{question}`` is :meth:`render_question` (the question, then the lettered choices of a
        multiple-choice task); a template that places ``{choices}`` ("A) ...\\nB) ...") itself
        gets the bare question in ``{question}``. ``{entry_point}`` is HumanEval's function name.
        """
        try:
            template = self.prompts[method]
        except KeyError:
            raise ConfigError(
                f"task {self.name!r} has no prompt template for method {method!r}; has: {', '.join(self.prompts)}"
            ) from None
        uses_choices = "{choices}" in template
        fields = {
            "question": example.question if uses_choices else self.render_question(example),
            "choices": format_choices(example.choices),
            "entry_point": str(example.meta.get("entry_point", "")),
        }
        return _fill(template, fields)

    def generation_for(self, method: str | None = None) -> dict[str, Any]:
        """Generation defaults (``max_new_tokens``, ``stop``), with per-method overrides applied."""
        base = {k: v for k, v in self.generation.items() if k != "methods"}
        base.setdefault("max_new_tokens", 512)
        base["stop"] = list(base.get("stop") or [])
        if method:
            base.update((self.generation.get("methods") or {}).get(method) or {})
        return base

    # ------------------------------------------------------------------ grading

    def _extractor(self) -> Extractor:
        return loaders.resolve_hook(self.extractor, EXTRACTORS, "extractor")

    def _grader_options(self) -> dict[str, Any]:
        options = dict(self.grader_options)
        for key, value in list(options.items()):
            if key.endswith("_extractor") and isinstance(value, str):
                options[key] = loaders.resolve_hook(value, EXTRACTORS, "extractor")
        return options

    def extract(self, completion: str, example: Example) -> str | None:
        """The answer ``completion`` commits to, by the task's extractor; None when it gives none."""
        return self._extractor()(completion, example)

    def gold(self, example: Example) -> str | None:
        """The answer a completion is graded against, in the form ``extract`` returns: the
        ``grader_options.gold_field`` of ``example.meta`` when the task names one (ProsQA's
        ``answer_concept``), else ``example.answer``. None for code tasks, which are graded by
        running tests, not against an answer (HumanEval's reference solution stays in the data)."""
        if self.is_code:
            return None
        gold_field = self.grader_options.get("gold_field")
        if gold_field is not None and gold_field in example.meta:
            return str(example.meta[gold_field])
        return example.answer

    def grade(self, completion: str, example: Example, finish_reason: str | None = None) -> Grade:
        """Grade one completion. No answer -> ``Grade(False, None)``; timeouts -> graded wrong.
        ``finish_reason`` (``"length"``: cut by the token cap) reaches graders that take it (GSM8K)."""
        if not isinstance(completion, str):
            raise TypeError(f"completion must be a str, got {type(completion).__name__}")
        grader = loaders.resolve_hook(self.grader, GRADERS, "grader")
        options = self._grader_options()
        if finish_reason is not None and accepts_keyword(grader, "finish_reason"):
            options["finish_reason"] = finish_reason
        return grader(completion, example, self._extractor(), **options)

    def grade_batch(
        self, completions: list[str], examples: list[Example], finish_reasons: list[str | None] | None = None
    ) -> list[Grade]:
        """Grade many (parallel for code tasks: programs run in sandbox workers)."""
        if len(completions) != len(examples):
            raise ValueError(f"{len(completions)} completions for {len(examples)} examples")
        reasons = list(finish_reasons) if finish_reasons is not None else [None] * len(completions)
        if len(reasons) != len(completions):
            raise ValueError(f"{len(reasons)} finish reasons for {len(completions)} completions")
        batch = BATCH_GRADERS.get(self.grader)
        if batch is not None:
            return batch(completions, examples, **self._grader_options())
        return [self.grade(c, e, r) for c, e, r in zip(completions, examples, reasons)]

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary (for listings and run configs)."""
        return {
            "name": self.name,
            "description": self.description,
            "splits": list(self.splits),
            "hub": {k: self.hub.get(k) for k in ("kind", "path", "name", "revision") if k in self.hub},
            "local": dict(self.local),
            "metrics": list(self.metrics),
            "methods": sorted(self.prompts),
            "is_code": self.is_code,
            "file": str(self.path) if self.path else None,
        }


# ---------------------------------------------------------------------------- YAML -> Task


def _require(spec: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in spec:
        raise ConfigError(f"{where}: missing key {key!r}")
    value = spec[key]
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ConfigError(f"{where}: key {key!r} must be {names}, got {type(value).__name__}")
    return value


def _unknown(spec: dict[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(spec) - allowed)
    if extra:
        raise ConfigError(f"{where}: unknown key(s) {extra}; allowed: {sorted(allowed)}")


def task_from_spec(spec: dict[str, Any], path: Path | None = None) -> Task:
    """Build and validate a :class:`Task` from a parsed YAML mapping."""
    where = str(path) if path else "task spec"
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: a task file must be a YAML mapping")
    _unknown(spec, _TOP_KEYS, where)
    name = _require(spec, "name", str, where)
    splits = _require(spec, "splits", list, where)
    if not splits or not all(isinstance(s, str) for s in splits):
        raise ConfigError(f"{where}: 'splits' must be a non-empty list of names")
    data = _require(spec, "data", dict, where)
    _unknown(data, _DATA_KEYS, f"{where}: data")
    loader = _require(data, "loader", str, f"{where}: data")
    local = data.get("local") or {}
    hub = data.get("hub") or {"kind": "none", "message": "this task declares no remote source"}
    if not isinstance(local, dict) or not isinstance(hub, dict):
        raise ConfigError(f"{where}: data.local and data.hub must be mappings")
    _unknown(hub, _HUB_KEYS, f"{where}: data.hub")
    for split in local:
        if split not in splits:
            raise ConfigError(f"{where}: data.local names split {split!r}, which is not in splits {splits}")
    prompts = _require(spec, "prompts", dict, where)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise ConfigError(f"{where}: prompts must map method names to template strings")
    for method, template in prompts.items():
        if "{question}" not in template:
            raise ConfigError(f"{where}: prompts.{method} does not contain {{question}}")
        try:
            _fill(template, {k: "" for k in _TEMPLATE_FIELDS})
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(
                f"{where}: prompts.{method} is not a valid template ({type(exc).__name__}: {exc}); "
                f"fields are {{{'}, {'.join(_TEMPLATE_FIELDS)}}} and literal braces are doubled ({{{{ }}}})"
            ) from None
    generation = spec.get("generation") or {}
    if not isinstance(generation, dict):
        raise ConfigError(f"{where}: 'generation' must be a mapping")
    _unknown(generation, _GENERATION_KEYS, f"{where}: generation")
    grader_options = spec.get("grader_options") or {}
    if not isinstance(grader_options, dict):
        raise ConfigError(f"{where}: 'grader_options' must be a mapping")
    metrics = spec.get("metrics") or ["accuracy"]
    task = Task(
        name=name,
        description=str(spec.get("description", "")).strip(),
        splits=list(splits),
        loader=loader,
        loader_options=dict(data.get("options") or {}),
        local=dict(local),
        hub=dict(hub),
        prompts=dict(prompts),
        extractor=str(spec.get("extractor", "none")),
        grader=_require(spec, "grader", str, where),
        grader_options=dict(grader_options),
        generation=dict(generation),
        metrics=list(metrics),
        is_code=bool(spec.get("is_code", False)),
        license=str(spec.get("license", "")),
        path=path,
    )
    # Resolve every hook now, so a typo fails when the task is loaded, not mid-run.
    loaders.resolve_hook(task.loader, loaders.ROW_HOOKS, "row loader")
    task._extractor()
    loaders.resolve_hook(task.grader, GRADERS, "grader")
    task._grader_options()
    return task


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            spec = yaml.safe_load(handle)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from exc
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: a task file must be a YAML mapping")
    return spec


def task_files() -> dict[str, Path]:
    """Task name -> YAML file, the first folder of the search path winning."""
    found: dict[str, Path] = {}
    for folder in search_dirs("tasks"):
        if not folder.is_dir():
            continue
        here: dict[str, Path] = {}
        for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
            spec = _read_yaml(path)
            name = spec.get("name", path.stem)
            if not isinstance(name, str):
                raise ConfigError(f"{path}: 'name' must be a string")
            if name in here:
                raise ConfigError(f"task {name!r} is declared twice in {folder}: {here[name].name} and {path.name}")
            here[name] = path
        for name, path in here.items():
            found.setdefault(name, path)
    return found


_CACHE: dict[tuple[str, int], Task] = {}


def _load_file(path: Path) -> Task:
    key = (str(path.resolve()), path.stat().st_mtime_ns)
    if key not in _CACHE:
        _CACHE[key] = task_from_spec(_read_yaml(path), path)
    return _CACHE[key]


def list_tasks() -> list[str]:
    """Names of every task on the search path, sorted."""
    return sorted(task_files())


def get_task(name: str) -> Task:
    """The task called ``name`` (or the task in a YAML file, given its path)."""
    if name.endswith((".yaml", ".yml")) and Path(name).is_file():
        return _load_file(Path(name))
    files = task_files()
    if name not in files:
        raise ConfigError(
            f"unknown task {name!r}; known: {', '.join(sorted(files)) or '(none)'}. "
            "Add a YAML file to $ANCHORED_REASONING_TASKS_DIR to declare a new one"
        )
    return _load_file(files[name])
