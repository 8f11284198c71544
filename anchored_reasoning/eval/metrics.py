"""Metrics with uncertainty: bootstrap confidence intervals, unbiased pass@k, paired differences.

All resampling is seeded, so the same inputs give the same intervals.

>>> mean_ci([1, 0, 1, 1])["mean"]
0.75
>>> round(pass_at_k(10, 3, 1), 3)
0.3
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np

DEFAULT_RESAMPLES = 2000


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    *,
    confidence: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    statistic: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic`` (default: the mean) over ``values``.

    ``values`` are per-unit scores (one per example); resampling draws units with replacement.
    ``statistic`` maps an array of shape (resamples, n) to (resamples,). Returns (low, high);
    (nan, nan) for no values, (v, v) for a single one.
    """
    x = np.asarray(values, dtype=float)
    if x.ndim != 1:
        raise ValueError("bootstrap_ci expects a 1-D sequence of per-unit scores")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    n = len(x)
    if n == 0:
        return (math.nan, math.nan)
    stat = statistic or (lambda a: a.mean(axis=1))
    if n == 1:
        v = float(stat(x[None, :])[0])
        return (v, v)
    rng = np.random.default_rng(seed)
    stats = np.empty(n_resamples)
    chunk = max(1, 2_000_000 // n)  # bound memory at ~16 MB of indices
    for start in range(0, n_resamples, chunk):
        size = min(chunk, n_resamples - start)
        idx = rng.integers(0, n, size=(size, n))
        stats[start : start + size] = stat(x[idx])
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(stats, [alpha, 1.0 - alpha])
    return (float(lo), float(hi))


def mean_ci(
    values: Sequence[float] | np.ndarray, *, confidence: float = 0.95, n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> dict[str, float]:
    """``{"mean", "ci_low", "ci_high", "n"}`` for per-unit scores (bootstrap percentile interval)."""
    x = np.asarray(values, dtype=float)
    lo, hi = bootstrap_ci(x, confidence=confidence, n_resamples=n_resamples, seed=seed)
    return {"mean": float(x.mean()) if len(x) else math.nan, "ci_low": lo, "ci_high": hi, "n": int(len(x))}


def per_problem_over_seeds(correct_by_seed: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each problem's correctness averaged over seeds (``{id: 0/1}`` per seed), on the problems every seed
    graded: the unit the 95% intervals and paired tests of a multi-seed comparison are taken over (a
    seed is a re-run of the same problems, not new problems, so the interval stays one over problems)."""
    if not correct_by_seed:
        raise ValueError("per_problem_over_seeds: no seeds")
    ids = sorted(set.intersection(*(set(c) for c in correct_by_seed)))
    return {i: sum(float(c[i]) for c in correct_by_seed) / len(correct_by_seed) for i in ids}


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator (Chen et al., 2021): ``1 - C(n-c, k) / C(n, k)`` for ``n``
    samples of which ``c`` are correct, computed as a stable product."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return float(1.0 - prod)


def pass_at_k_per_problem(ns: Sequence[int], cs: Sequence[int], k: int) -> np.ndarray:
    """pass@k of each problem (``ns[i]`` samples, ``cs[i]`` correct)."""
    return np.array([pass_at_k(int(n), int(c), k) for n, c in zip(ns, cs)], dtype=float)


def sensible_ks(n: int) -> list[int]:
    """The k values worth reporting for ``n`` samples per problem: 1, 5, 10, 20, 50, 100 up to n, and n."""
    return sorted({k for k in (1, 5, 10, 20, 50, 100) if k <= n} | ({n} if n >= 1 else set()))


def paired_bootstrap_diff(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    *,
    confidence: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> dict[str, float]:
    """Mean of ``a - b`` over paired units (the same examples scored by two systems), its
    bootstrap interval, and the share of resamples where the difference is <= 0
    (a one-sided bootstrap p-value for "a is better")."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"paired_bootstrap_diff: {x.shape} vs {y.shape}; pair the same examples")
    d = x - y
    if len(d) == 0:
        return {"diff": math.nan, "ci_low": math.nan, "ci_high": math.nan, "p_le_0": math.nan, "n": 0}
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(d), size=(n_resamples, len(d)))
    stats = d[idx].mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(stats, [alpha, 1.0 - alpha])
    return {"diff": float(d.mean()), "ci_low": float(lo), "ci_high": float(hi), "p_le_0": float((stats <= 0).mean()), "n": int(len(d))}


def denoiser_counters(records: Sequence[Mapping]) -> dict[str, dict[str, float]]:
    """``{"denoiser": {...}}`` for records whose ``meta`` carries ``nfe`` (diffusion backends), else ``{}``.

    ``nfe_mean``: denoiser (model) calls per sample; ``tokens_per_forward``: generated tokens over
    denoiser calls, summed over samples (the dllm leaderboard's TPF). A record's tokens are its
    ``meta["decoded_tokens"]`` when the backend counted them (the positions the model decoded, EOS
    fill excluded), else its ``tokens``. ``batch_rows_mean``: rows per batch, where the backend batches."""
    metas = [(r, r.get("meta")) for r in records]
    counted = [(r, m) for r, m in metas if isinstance(m, Mapping) and isinstance(m.get("nfe"), (int, float))]
    if not counted:
        return {}
    nfe = [float(m["nfe"]) for _, m in counted]
    tokens = [float(m.get("decoded_tokens", r.get("tokens") or 0)) for r, m in counted]
    rows = [float(m["batch_rows"]) for _, m in counted if isinstance(m.get("batch_rows"), (int, float))]
    out = {
        "samples": len(counted),
        "nfe_mean": float(np.mean(nfe)),
        "nfe_total": float(sum(nfe)),
        "tokens_per_forward": (sum(tokens) / sum(nfe)) if sum(nfe) > 0 else math.nan,
    }
    if rows:
        out["batch_rows_mean"] = float(np.mean(rows))
    return {"denoiser": out}
