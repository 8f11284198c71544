"""What the demo shows: one live line per method while methods train side by side, then the table
(Markdown) and plot (PNG) from its ``summary.json`` dict.

    nocot  train [######----------]  1.6/4.3 min  step 431  loss 0.512
    cot    eval  [##############--]  418/486 samples
    pause  done  accuracy 0.81, 1203 steps, 5.1 min
    acot   waiting
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Iterable

#: A method's status file (in ``<out>/<method>/``), written by its worker, read by the parent's board.
STATUS = "status.json"


def _fmt(acc: float, ci: list[float] | None = None) -> str:
    if ci is None or any(isinstance(v, float) and math.isnan(v) for v in ci):
        return f"{acc:.2f}"
    return f"{acc:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"


def _ci(r: dict[str, Any]) -> list[float]:
    return [r["ci_low"], r["ci_high"]]


def verdict(summary: dict[str, Any]) -> list[str]:
    """One line per finding the numbers support (or do not), in plain words."""
    m = summary["methods"]
    lines = []
    if "anchor_chain" in m and "cot" in m:
        lines.append(anchors_vs_cot(m["anchor_chain"]["generated"], m["cot"]["generated"]))
    best = max(m, key=lambda n: m[n]["generated"]["accuracy"])
    g = m[best]["generated"]
    lines.append(f"Best method: {best} at {g['accuracy']:.2f} (chance {summary['chance']}); "
                 f"{'beyond' if g['accuracy_ci95'][0] > summary['chance'] else 'within'} noise of chance.")
    if all("probe" in r for r in m.values()):
        flips = {n: r["probe"]["flip_rate"]["mean"] for n, r in m.items()}
        reads = [n for n, f in flips.items() if f >= 0.9]
        depths = sorted(set.intersection(*(set(r["probe"].get("by_hops", {})) for r in m.values())), key=int)
        per_depth = "".join(
            f"; at {d} hop{'s' if int(d) > 1 else ''}: "
            + ", ".join(f"{n} {r['probe']['by_hops'][d]['flip_rate']['mean']:.2f}" for n, r in m.items())
            for d in (depths[:1] + depths[-1:] if len(depths) > 1 else depths))
        lines.append("Binding probe (asked about the other entity, the answer must flip): "
                     + ", ".join(f"{n} {f:.2f}" for n, f in flips.items()) + per_depth
                     + (f"; {', '.join(reads)} read the asked entity." if reads else "; no method reads the asked entity reliably."))
    if "cot" in m and "nocot" in m:
        deepest = max(m["cot"]["generated"].get("by_hops", {"0": None}), key=int)
        c = m["cot"]["generated"].get("by_hops", {}).get(deepest)
        n = m["nocot"]["generated"].get("by_hops", {}).get(deepest)
        if c and n:
            above, below = c["accuracy_ci95"][0] > n["accuracy_ci95"][1], c["accuracy_ci95"][1] < n["accuracy_ci95"][0]
            lines.append(f"At {deepest} hops CoT {c['accuracy']:.2f} vs No-CoT {n['accuracy']:.2f}: "
                         + ("CoT above, beyond both 95% intervals." if above else
                            "CoT below, beyond both 95% intervals." if below else "not separated by their 95% intervals."))
    if "acot" in m and "pause" in m:
        a, p = m["acot"]["generated"], m["pause"]["generated"]
        sep = a["accuracy_ci95"][0] > p["accuracy_ci95"][1]
        lines.append(f"ACoT {a['accuracy']:.2f} ({a['mean_generated_tokens']:.1f} tokens) vs pause {p['accuracy']:.2f}: "
                     + ("ACoT above pause beyond the intervals." if sep else "ACoT does not beat pause at this size."))
    return lines


def anchors_vs_cot(a: dict[str, Any], c: dict[str, Any]) -> str:
    """The demo's one-line take-away: the written anchors against CoT, accuracy (with whether their 95% intervals
    separate them) and tokens generated."""
    above, below = a["accuracy_ci95"][0] > c["accuracy_ci95"][1], a["accuracy_ci95"][1] < c["accuracy_ci95"][0]
    ratio = a["mean_generated_tokens"] / c["mean_generated_tokens"] if c["mean_generated_tokens"] else float("nan")
    where = ("above CoT beyond both 95% intervals" if above else "below CoT beyond both 95% intervals" if below
             else "level with CoT within their 95% intervals")
    return (f"Written anchors vs CoT: {a['accuracy']:.2f} vs {c['accuracy']:.2f} ({where}) at "
            f"{a['mean_generated_tokens']:.1f} vs {c['mean_generated_tokens']:.1f} tokens ({ratio:.2f}x CoT's).")


def render_table(summary: dict[str, Any]) -> str:
    methods = summary["methods"]
    hop_keys = sorted({h for r in methods.values() for h in r["generated"].get("by_hops", {})}, key=int)
    probe = any("probe" in r for r in methods.values())
    head = ["method", "accuracy [95% CI]"] + [f"{h} hop" for h in hop_keys]
    if probe:
        head += ["swapped entity acc", "answer flips"]
    head += ["tokens", "steps", "[ANT] top-1"]
    lines = [
        f"ProsQA demo: {summary['scale']['problems']}; {summary['scale']['model']}; "
        f"{summary['scale']['train_seconds_per_method']} s of training per method; "
        f"{summary['scale'].get('held_out', '?')} held-out problems",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for name, r in methods.items():
        g = r["generated"]
        row = [name, _fmt(g["accuracy"], g["accuracy_ci95"])]
        row += [_fmt(g["by_hops"][h]["accuracy"]) if h in g.get("by_hops", {}) else "-" for h in hop_keys]
        if probe:
            pr = r.get("probe")
            row += [_fmt(pr["swap_accuracy"]["mean"], _ci(pr["swap_accuracy"])), f"{pr['flip_rate']['mean']:.2f}"] if pr else ["-", "-"]
        anchor = r.get("final_anchor_accuracy")
        row += [f"{g['mean_generated_tokens']:.1f}", str(r["steps"]), f"{anchor:.2f}" if anchor is not None else "-"]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    rules = summary.get("surface_rules_on_held_out")
    if rules:
        worst = max(rules, key=rules.get)
        lines.append(f"Surface rules on the held-out problems (no reasoning): best is \"{worst}\" at {rules[worst]:.2f}; "
                     f"chance {summary['chance']}.")
    lines += [f"- {v}" for v in verdict(summary)]
    lines.append("")
    lines.append("A random pick between the two options scores 0.5; answer flips: share of problems whose answer changes "
                 "when the question asks about the other entity (a model that reads the question: 1.0). Intervals: 95% "
                 "bootstrap over problems. [ANT] top-1: last logged training value.")
    return "\n".join(lines)


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = summary["methods"]
    names = list(methods)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    hop_keys = sorted({h for r in methods.values() for h in r["generated"].get("by_hops", {})}, key=int)
    for name in names:
        bh = methods[name]["generated"].get("by_hops", {})
        xs = [int(h) for h in hop_keys if h in bh]
        ys = [bh[h]["accuracy"] for h in hop_keys if h in bh]
        lo = [max(0.0, bh[h]["accuracy"] - bh[h]["accuracy_ci95"][0]) for h in hop_keys if h in bh]
        hi = [max(0.0, bh[h]["accuracy_ci95"][1] - bh[h]["accuracy"]) for h in hop_keys if h in bh]
        ax1.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=f"{name} ({methods[name]['generated']['mean_generated_tokens']:.0f} tok)")
    ax1.axhline(summary["chance"], color="grey", linestyle="--", linewidth=1, label="chance")
    ax1.set_xlabel("hops (entity -> answer)")
    ax1.set_ylabel("accuracy (95% CI)")
    ax1.set_ylim(0, 1.05)
    ax1.set_xticks([int(h) for h in hop_keys])
    ax1.set_title("held-out accuracy by depth")
    ax1.legend(fontsize=8)
    xs = range(len(names))
    flips = [methods[n].get("probe", {}).get("flip_rate", {}).get("mean", 0.0) for n in names]
    ax2.bar(list(xs), flips, 0.6, color="#55A868")
    ax2.axhline(0.9, color="grey", linestyle=":", linewidth=1, label="0.9: reads the asked entity")
    ax2.set_xticks(list(xs), names)
    ax2.set_ylim(0, 1.05)
    ax2.set_ylabel("share of answers that flip")
    ax2.set_title("binding probe: asked about the other entity")
    ax2.legend(fontsize=8)
    fig.suptitle(f"{summary['scale']['model']}, {summary['scale']['train_seconds_per_method']} s training per method", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# the live board: workers run without bars and write their status; the parent draws one line each


class MethodStatus:
    """A worker's side: the method's phase now, written whole to ``<folder>/status.json``
    (``train``: since, limit_s, log; ``eval``: done, total; ``done``: accuracy, steps, minutes).
    :meth:`count` adds evaluated samples, written at most every ``interval`` seconds."""

    def __init__(self, folder: Path, interval: float = 1.0) -> None:
        self.path = Path(folder) / STATUS
        self.interval = interval
        self.fields: dict[str, Any] = {}
        self._written = 0.0

    def set(self, **fields: Any) -> None:
        self.fields = dict(fields)
        self._write()

    def count(self, done: int, _tokens: int = 0) -> None:
        self.fields["done"] = self.fields.get("done", 0) + done
        if time.monotonic() - self._written >= self.interval or self.fields["done"] >= self.fields.get("total", 0):
            self._write()

    def watch(self, backend: Any) -> Any:
        """``backend`` as the eval runner sees it, its progress reports (per finished sample) also counted here."""
        return _Counted(backend, self)

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{STATUS}.{os.getpid()}")
        tmp.write_text(json.dumps(self.fields))
        os.replace(tmp, self.path)  # the parent never reads half a file
        self._written = time.monotonic()


class _Counted:
    """A backend whose ``generate`` also reports finished samples to a :class:`MethodStatus`."""

    def __init__(self, backend: Any, status: MethodStatus) -> None:
        self._backend, self._status = backend, status

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def generate(self, prompts, spec, *, on_progress=None):
        from anchored_reasoning.backends import generate_with_progress, takes_progress

        if not takes_progress(self._backend):  # no reports from inside: the samples count when the call ends
            out = self._backend.generate(prompts, spec)
            self._status.count(len(prompts) * spec.n)
            return out

        def both(done: int, tokens: int) -> None:
            self._status.count(done)
            if on_progress is not None:
                on_progress(done, tokens)
        return generate_with_progress(self._backend, prompts, spec, both)


def _last_logged(path: str | None) -> dict[str, Any]:
    """The last training log line of ``train_log.jsonl`` with a step (the end of the file only)."""
    if not path or not os.path.isfile(path):
        return {}
    with open(path, "rb") as f:
        f.seek(max(0, os.path.getsize(path) - 4096))
        lines = f.read().decode("utf-8", "replace").splitlines()
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "loss" in record or record.get("event") == "train_begin":
            return record
    return {}


def _bar(fraction: float, width: int = 16) -> str:
    filled = int(round(max(0.0, min(fraction, 1.0)) * width))
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def status_line(name: str, status: dict[str, Any] | None, now: float, width: int = 6) -> str:
    """One method's line: ``train`` shows minutes spent / the budget (the run is time-boxed: its step
    ceiling means nothing), the step and loss of its latest log line; ``eval`` samples done / total."""
    head = f"{name:<{width}}"
    phase = (status or {}).get("phase")
    if phase == "train":
        limit = float(status["limit_s"])
        spent = min(max(now - float(status["since"]), 0.0), limit)
        line = f"{head}  train {_bar(spent / limit if limit else 1.0)}  {spent / 60:.1f}/{limit / 60:.1f} min"
        logged = _last_logged(status.get("log"))
        if logged.get("step"):
            line += f"  step {logged['step']}"
        if isinstance(logged.get("loss"), (int, float)):
            line += f"  loss {logged['loss']:.3g}"
        return line
    if phase == "eval":
        done, total = int(status.get("done", 0)), int(status["total"])
        return f"{head}  eval  {_bar(done / total if total else 1.0)}  {done}/{total} samples"
    if phase == "done":
        return (f"{head}  done  accuracy {status['accuracy']:.2f}, {status['steps']} steps, "
                f"{status['minutes']:.1f} min")
    return f"{head}  waiting"


class StatusBoard:
    """The parent's side: one tqdm line per method (fixed positions), redrawn from the status files by
    :meth:`follow` until the workers' futures are done. Old status files are removed at the start."""

    def __init__(self, out: Path, methods: list[str], *, show: bool = True) -> None:
        from tqdm.auto import tqdm

        self.paths = {name: Path(out) / name / STATUS for name in methods}
        for path in self.paths.values():
            path.unlink(missing_ok=True)
        self.width = max(len(m) for m in methods)
        self.lines = {name: tqdm(total=1, position=i, bar_format="{desc}", disable=not show, leave=True,
                                 dynamic_ncols=True) for i, name in enumerate(methods)}

    def refresh(self) -> None:
        now = time.time()
        for name, line in self.lines.items():
            try:
                status = json.loads(self.paths[name].read_text())
            except (OSError, ValueError):
                status = None
            text = status_line(name, status, now, self.width)
            if text != line.desc:
                line.set_description_str(text)

    def follow(self, futures: Iterable[Any], every: float = 1.0) -> None:
        """Redraw every ``every`` seconds until all ``futures`` are done (a failed one's ``result()``
        raises afterwards, in the caller)."""
        from concurrent.futures import wait

        pending = set(futures)
        while pending:
            _, pending = wait(pending, timeout=every)
            self.refresh()

    def close(self) -> None:
        self.refresh()
        for line in self.lines.values():
            line.close()

    def __enter__(self) -> "StatusBoard":
        self.refresh()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
