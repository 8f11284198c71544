"""Is a ``checkpoint-<step>`` folder whole? Finding the newest one that is, and moving cut-short
ones aside. Used by :mod:`anchored_reasoning.train.checkpointing`.

The Trainer writes a checkpoint's weights, then optimizer / scheduler / RNG, then
``trainer_state.json``; a process killed during the save leaves the state file absent or one of the
others truncated. A folder that fails the checks is renamed ``incomplete-checkpoint-<step>`` (the
Trainer's rotation and ``get_last_checkpoint`` only see ``checkpoint-<step>``), never deleted.
"""
from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

TRAINER_STATE = "trainer_state.json"
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_problem(folder: Path) -> str | None:
    """Why ``folder`` cannot be resumed from (a file missing, unreadable or cut short), or None."""
    state_path = folder / TRAINER_STATE
    if not state_path.is_file():
        return f"no {TRAINER_STATE} (the save was cut short)"
    try:
        state = json.loads(state_path.read_text())
        step = int(state["global_step"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{TRAINER_STATE} is unreadable ({exc})"
    match = CHECKPOINT_RE.match(folder.name)
    if match and int(match.group(1)) != step:
        return f"{TRAINER_STATE} says step {step}, the folder name says {match.group(1)}"
    # weights: save_pretrained files; FSDP adds pytorch_model_fsdp.bin (full) or pytorch_model_fsdp_0/ (sharded)
    weights = sorted(folder.glob("*.safetensors")) + sorted(folder.glob("pytorch_model*.bin"))
    shards = sorted(p for p in folder.glob("pytorch_model_fsdp_*") if p.is_dir())
    if not weights and not shards:
        return "no model weights"
    # optimizer: optimizer.pt (Trainer), optimizer.bin or optimizer_0/ (FSDP); DeepSpeed keeps its own
    deepspeed = (folder / "latest").is_file()
    optimizer = [folder / n for n in ("optimizer.pt", "optimizer.bin") if (folder / n).is_file()]
    shards += sorted(p for p in folder.glob("optimizer_*") if p.is_dir())
    if not (optimizer or deepspeed or any(p.name.startswith("optimizer_") for p in shards)):
        return "no optimizer.pt (saved with save_only_model? such a checkpoint cannot resume training)"
    if not (folder / "scheduler.pt").is_file() and not deepspeed:
        return "no scheduler.pt (the save was cut short)"
    files = [*weights, *optimizer]
    if (folder / "scheduler.pt").is_file():
        files.append(folder / "scheduler.pt")
    files += sorted(folder.glob("rng_state*.pth"))
    for path in files:
        problem = _safetensors_problem(path) if path.suffix == ".safetensors" else _zip_problem(path)
        if problem:
            return f"{path.name}: {problem}"
    for shard in shards:  # torch.distributed.checkpoint writes .metadata last
        if not (shard / ".metadata").is_file():
            return f"{shard.name}/ has no .metadata (the sharded save was cut short)"
    return None


def _zip_problem(path: Path) -> str | None:
    """torch.save files are zip archives: a truncated one fails the CRC / central-directory check."""
    try:
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        return f"unreadable ({exc})"
    return f"corrupt member {bad}" if bad else None


def _safetensors_problem(path: Path) -> str | None:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n <= 0 or 8 + n > size:
                return "header cut short"
            header = json.loads(f.read(n))
    except (OSError, ValueError) as exc:
        return f"unreadable ({exc})"
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    return None if 8 + n + end <= size else f"{size} bytes, the header promises {8 + n + end}"


def list_checkpoints(output_dir: Path) -> list[Path]:
    """``checkpoint-<step>`` folders, oldest step first."""
    if not output_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in output_dir.iterdir() if p.is_dir() and (m := CHECKPOINT_RE.match(p.name))]
    return [p for _, p in sorted(found)]


def newest_good_checkpoint(output_dir: Path, *, move_aside: bool = True) -> tuple[Path | None, list[str]]:
    """The newest checkpoint that :func:`checkpoint_problem` passes, and a line per newer one that
    failed (each moved aside to ``incomplete-<name>`` when ``move_aside``, so Trainer's rotation never
    counts it; nothing is deleted)."""
    skipped = []
    for folder in reversed(list_checkpoints(output_dir)):
        problem = checkpoint_problem(folder)
        if problem is None:
            return folder, skipped
        line = f"{folder.name}: {problem}"
        if move_aside:
            target = folder.with_name(f"incomplete-{folder.name}")
            k = 1
            while target.exists():
                target = folder.with_name(f"incomplete-{folder.name}.{k}")
                k += 1
            try:
                folder.rename(target)
                line += f" (moved to {target.name})"
            except FileNotFoundError:  # another process of this launch moved it first
                pass
        skipped.append(line)
    return None, skipped
