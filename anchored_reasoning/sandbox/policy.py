"""Fail closed: whether programs would be isolated on this machine, and the refusal when they would not.

A run is **isolated** when a model-written program cannot touch the user's files or processes:

* as root: every program runs as a fresh unprivileged uid (any layer; bwrap and unshare add namespaces and a
  read-only root of their own, ``plain`` relies on the uid and Unix permissions alone);
* as a normal user: a namespaced layer (bwrap or unshare), whose filesystem is read-only but for the run's
  own directory and a private /tmp. ``plain`` would run programs as the user's own uid: not isolated.

Anything else (no namespaces as a normal user; root with no way to drop to an unprivileged uid, or with
``drop_privileges=False``) is refused with :class:`~anchored_reasoning.errors.UnisolatedCodeError` before
the first program runs, unless the user opted in explicitly: ``SandboxConfig(allow_unisolated=True)``, the
environment variable ``ANCHORED_REASONING_ALLOW_UNISOLATED_CODE=1``, or ``anchored-reasoning eval
--confirm-run-unsafe-code`` (which sets that variable). Details per layer: ``docs/sandbox.md``.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from anchored_reasoning.errors import UnisolatedCodeError
from anchored_reasoning.sandbox.config import LAYERS, SandboxConfig
from anchored_reasoning.sandbox import layers
from anchored_reasoning.sandbox.layers import detect_layer, fresh_uid_blocker, interpreter, is_root

logger = logging.getLogger(__name__)

ALLOW_ENV = "ANCHORED_REASONING_ALLOW_UNISOLATED_CODE"
_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Isolation:
    """What a run with a given config gets here: ``layer``, whether programs run as a ``fresh_uid``,
    whether that counts as ``isolated``, and if not, the ``problem``; ``tried``: every layer considered,
    with why it was unusable (or "usable")."""

    layer: str
    fresh_uid: bool
    isolated: bool
    problem: str
    tried: tuple[str, ...]


def opted_in(cfg: SandboxConfig) -> bool:
    """Whether the user allowed programs to run without isolation (config field or environment)."""
    return cfg.allow_unisolated or os.environ.get(ALLOW_ENV, "").strip().lower() in _TRUE


def assess(cfg: SandboxConfig) -> Isolation:
    """The layer a run with ``cfg`` would use and whether its programs would be isolated."""
    requested = cfg.isolation
    if requested == "auto":
        requested = os.environ.get("ANCHORED_REASONING_SANDBOX", "auto") or "auto"
    python = interpreter(cfg)
    layer = detect_layer(requested, python)
    tried = []
    for name in LAYERS if requested == "auto" else (layer,):
        ok, why = layers.layer_available(name, python)
        tried.append(f"{name}: {'usable' if ok else why}")
        if ok:
            break
    blocker = fresh_uid_blocker(layer, python, cfg.work_root) if is_root() else ""
    fresh_uid = is_root() and cfg.drop_privileges and not blocker
    if is_root() and not cfg.drop_privileges:
        problem = "SandboxConfig(drop_privileges=False) as root: programs would run as root"
    elif is_root() and not fresh_uid:
        problem = (f"this process runs as root and the {layer!r} layer cannot switch programs to an "
                   f"unprivileged uid ({blocker}): programs would run as root")
    elif not is_root() and layer == "plain":
        problem = (f"the 'plain' layer has no namespaces: programs would run as your own user (uid {os.geteuid()}) "
                   "and could read, write and delete your files")
    else:
        problem = ""
    return Isolation(layer, fresh_uid, not problem, problem, tuple(tried))


_warned: set[tuple] = set()
_warn_lock = threading.Lock()


def require_isolation(cfg: SandboxConfig) -> Isolation:
    """The run's :class:`Isolation`; raises :class:`UnisolatedCodeError` when programs would not be
    isolated and the user has not opted in (logs a warning, once, when they have)."""
    iso = assess(cfg)
    if iso.isolated:
        return iso
    if not opted_in(cfg):
        raise UnisolatedCodeError(refusal_message(iso))
    with _warn_lock:
        key = (iso.layer, iso.problem)
        if key not in _warned:
            _warned.add(key)
            logger.warning("code sandbox: running model-written code WITHOUT isolation on the %r layer, as "
                           "explicitly allowed (%s or SandboxConfig(allow_unisolated=True)): %s",
                           iso.layer, ALLOW_ENV, iso.problem)
    return iso


def refusal_message(iso: Isolation) -> str:
    """The refusal: what is missing, every layer tried, how to isolate, and the three ways to opt in."""
    fixes = ["install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap)",
             "or let this process create namespaces (root, or unprivileged user namespaces enabled; container "
             "runtimes often block them)"]
    if is_root() and iso.layer == "plain":
        fixes.append("or, as root without namespaces, keep the interpreter and the work dir where other users can "
                     "read them (e.g. a virtualenv under /opt) so programs can run as an unprivileged uid")
    return (
        "code sandbox: refusing to run model-written code without isolation: " + iso.problem + ".\n"
        "Layers tried: " + "; ".join(iso.tried) + ".\n"
        "To isolate it: " + "; ".join(fixes) + ".\n"
        "To run it anyway WITHOUT isolation (the code can then do anything this process can: read, change and "
        "delete your files"
        + (", as root" if is_root() else "") + "): pass --confirm-run-unsafe-code to `anchored-reasoning eval`, "
        f"or set {ALLOW_ENV}=1, or use SandboxConfig(allow_unisolated=True). See docs/sandbox.md."
    )


def sandbox_info(config: SandboxConfig | None = None) -> dict[str, Any]:
    """What a run with ``config`` would use, for run metadata and logs (no program is run)."""
    cfg = config or SandboxConfig()
    iso = assess(cfg)
    return {
        "layer": iso.layer,
        "drop_privileges": iso.fresh_uid,
        "isolated": iso.isolated,
        "problem": iso.problem,
        "allow_unisolated": opted_in(cfg),
        "timeout_s": cfg.timeout_s,
        "cpu_s": cfg.cpu_limit_s,
        "memory_mb": cfg.memory_mb,
        "file_size_mb": cfg.file_size_mb,
        "max_processes": cfg.max_processes,
        "max_open_files": cfg.max_open_files,
        "max_output_bytes": cfg.max_output_bytes,
        "network_guard": cfg.network_guard,
        "python": interpreter(cfg),
    }
