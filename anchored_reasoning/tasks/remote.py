"""Remote sources of benchmark rows: the Hugging Face Hub (``datasets`` or data-set files) and
plain downloads at a pinned SHA-256, cached under ``$ANCHORED_REASONING_CACHE``.

:func:`hub_rows` reads a task YAML's ``data.hub`` and yields the same ``(where, row)`` pairs as the
local readers (:mod:`anchored_reasoning.tasks.readers`); every failure (no network, gated data, a
changed file) is a :class:`~anchored_reasoning.errors.DataError` that says how to load locally instead.
"""
from __future__ import annotations

import hashlib
import logging
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from anchored_reasoning.errors import ConfigError, DataError
from anchored_reasoning.tasks.readers import read_rows

# the name these messages had before the loaders were split, so existing log filters keep working
logger = logging.getLogger("anchored_reasoning.tasks.loaders")


def _cache_root() -> Path:
    base = os.environ.get("ANCHORED_REASONING_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "anchored_reasoning"
    )
    return Path(base) / "downloads"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download_url(url: str, sha256: str | None = None) -> Path:
    """Download ``url`` once into the cache; check its SHA-256 when one is pinned."""
    key = hashlib.sha256(url.encode()).hexdigest()[:16]
    target = _cache_root() / key / url.rsplit("/", 1)[-1]
    if not target.is_file() or (sha256 and _sha256(target) != sha256):
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".part")
        logger.info("downloading %s", url)
        try:
            request = urllib.request.Request(url, headers={"User-Agent": "anchored-reasoning"})
            with urllib.request.urlopen(request, timeout=60) as response, open(tmp, "wb") as out:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
        except OSError as exc:
            raise DataError(
                f"cannot download {url}: {exc}. Without network, set $ANCHORED_REASONING_DATA "
                "(or pass data_dir=) to a folder of local copies"
            ) from exc
        tmp.replace(target)
    if sha256 and _sha256(target) != sha256:
        raise DataError(f"{url}: SHA-256 {_sha256(target)} differs from the pinned {sha256}; the source changed")
    return target


def _hub_hint(task: str) -> str:
    return (
        f"loading task {task!r} from the Hugging Face Hub failed. Without network, set "
        "$ANCHORED_REASONING_DATA (or pass data_dir=) to a folder laid out like the project's "
        "shared/data; for gated data sets (GPQA) accept the terms on the Hub and run `hf auth login`"
    )


def hub_rows(task: str, hub: dict[str, Any], split: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Rows of ``split`` from the task's remote source (``data.hub`` in the YAML).

    ``kind: datasets``  -> ``datasets.load_dataset(path, name, split=..., revision=...)``;
    ``kind: hub_files`` -> ``huggingface_hub.hf_hub_download`` of data-set files at a revision;
    ``kind: urls``      -> plain downloads (e.g. raw GitHub files at a commit), SHA-256 checked;
    ``kind: none``      -> no public source; the YAML's ``message`` says how to get the data.
    """
    kind = hub.get("kind", "datasets")
    if kind == "none":
        raise DataError(f"task {task!r} has no remote source: {hub.get('message', 'use local files (data_dir)')}")
    splits = hub.get("splits") or {}
    if split not in splits:
        raise DataError(f"task {task!r}: split {split!r} is not available from the Hub source (has: {', '.join(splits)})")
    spec = splits[split]
    revision = hub.get("revision")
    if kind == "datasets":
        try:
            import datasets
        except ImportError as exc:  # pragma: no cover - datasets is a dependency
            raise DataError("the 'datasets' package is needed to load from the Hub") from exc
        try:
            dataset = datasets.load_dataset(hub["path"], hub.get("name"), split=spec, revision=revision)
        except Exception as exc:  # network, auth, missing revision: all end here
            raise DataError(f"{_hub_hint(task)} ({hub['path']}@{revision}: {type(exc).__name__}: {exc})") from exc
        label = f"{hub['path']}@{(revision or 'main')[:12]} split {spec}"
        for index, row in enumerate(dataset):
            yield f"{label} row {index}", dict(row)
        return
    files = [spec] if isinstance(spec, str) else list(spec)
    for entry in files:
        if kind == "hub_files":
            try:
                from huggingface_hub import hf_hub_download

                local = Path(hf_hub_download(repo_id=hub["path"], filename=entry, repo_type="dataset", revision=revision))
            except Exception as exc:
                raise DataError(f"{_hub_hint(task)} ({hub['path']}/{entry}@{revision}: {type(exc).__name__}: {exc})") from exc
        elif kind == "urls":
            url, sha = (entry["url"], entry.get("sha256")) if isinstance(entry, dict) else (entry, None)
            local = download_url(url, sha)
        else:
            raise ConfigError(f"task {task!r}: data.hub.kind {kind!r} is not one of datasets, hub_files, urls, none")
        yield from read_rows(local)
