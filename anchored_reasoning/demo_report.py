"""The demo's table (Markdown) and plot (PNG), from its ``summary.json`` dict."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any


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
