"""The PNGs of `sangam reproduce`, laid out as the paper's figures (matplotlib, no display)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from calib.points import PointKey, metric
from calib.reproduce import (
    BREAKDOWN_QPS,
    BUDGETS,
    CDF_POINTS,
    HYBRID_BUDGETS,
    LAYOUTS,
    ONE_GPU_RATES,
    PAIRS,
    RATES,
    PointOutcome,
    key,
)

Results = Mapping[PointKey, PointOutcome]
NAMES = {"8C": "colocated", "5P3D": "disaggregated 5P3D", "5P3C": "hybrid 5P3C", "fastdllm": "Fast-dLLM"}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _curve(ax: Any, results: Results, points: Sequence[PointKey], name: str, label: str) -> None:
    ax.plot(
        [p.qps for p in points], [metric(results[p].summary, name) for p in points], marker="o", label=label
    )


def _save(fig: Any, out: Path, name: str, title: str) -> Path:
    fig.suptitle(title)
    fig.tight_layout()
    path = out / f"{name}.png"
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def figure5(results: Results, out: Path, title: str) -> Path:
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    splits = ("4P4D", "5P3D", "6P2D")
    points = [key(s, "llada-8b", "sharegpt", 1024, 6.5) for s in splits]
    a.boxplot([results[p].rows["e2el"] for p in points], tick_labels=splits, showfliers=False)
    a.set(title="(a) e2e latency", ylabel="seconds")
    width = 0.38
    for i, (part, label) in enumerate(
        (("prefill_queue", "at prefill workers"), ("decode_queue", "at decode workers"))
    ):
        medians = [metric(results[p].summary, f"median_{part}_s") for p in points]
        b.bar([x + (i - 0.5) * width for x in range(3)], medians, width, label=label)
    b.set(title="(b) scheduling delay (median)", xticks=range(3), xticklabels=splits, ylabel="seconds")
    b.legend()
    return _save(fig, out, "fig5", f"Figure 5: LLaDA-8B ShareGPT, 8 GPUs, QPS 6.5 ({title})")


def figure8(results: Results, out: Path, title: str) -> Path:
    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for col, trace in enumerate(("sharegpt", "arxiv")):
        for row, stat in enumerate(("mean", "p99")):
            ax = axes[row][col]
            for policy, label in (("fastdllm", "Fast-dLLM"), ("deficit", "Sangam colocated, tau 1024")):
                points = [key("1C", "llada-8b", trace, 1024, q, policy) for q in ONE_GPU_RATES]
                _curve(ax, results, points, f"{stat}_e2el_s", label)
            ax.set(title=f"{stat}, {trace}", xlabel="QPS", ylabel="e2e latency (s)", yscale="log")
            ax.legend(fontsize=8)
    return _save(fig, out, "fig8", f"Figure 8: LLaDA-8B on one H100-class GPU ({title})")


def figure9(results: Results, out: Path, title: str) -> Path:
    plt = _plt()
    fig, axes = plt.subplots(2, 4, figsize=(16, 7))
    for col, (model, trace) in enumerate(PAIRS):
        for row, stat in enumerate(("mean", "p99")):
            ax = axes[row][col]
            for layout in LAYOUTS:
                points = [key(layout, model, trace, 1024, q) for q in RATES[(model, trace)]]
                _curve(ax, results, points, f"{stat}_e2el_s", NAMES[layout])
            ax.set(title=f"{model}, {trace}, {stat}", xlabel="QPS", ylabel="e2e latency (s)")
            ax.legend(fontsize=7)
    return _save(fig, out, "fig9", f"Figure 9: colocated, 5P3D and 5P3C on 8 GPUs ({title})")


def figure10(results: Results, out: Path, title: str) -> Path:
    plt = _plt()
    fig, axes = plt.subplots(1, 4, figsize=(16, 4))
    panels = [(pair, part) for pair in CDF_POINTS for part in ("prefill_queue", "decode")]
    for ax, ((model, trace), part) in zip(axes, panels, strict=True):
        qps = CDF_POINTS[(model, trace)]
        for layout in LAYOUTS:
            values = sorted(results[key(layout, model, trace, 1024, qps)].rows[part])
            ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=NAMES[layout])
        what = "prefill queueing delay" if part == "prefill_queue" else "request decode time"
        ax.set(title=f"{model} {trace} QPS {qps:g}: {what}", xlabel="seconds", ylabel="CDF")
        ax.legend(fontsize=7)
    return _save(fig, out, "fig10", f"Figure 10: per-request CDFs ({title})")


def figure11(results: Results, out: Path, title: str) -> Path:
    plt = _plt()
    fig, axes = plt.subplots(2, 4, figsize=(16, 8))
    for col, (model, trace) in enumerate(PAIRS):
        ax = axes[0][col]
        for budget in BUDGETS:
            points = [key("8C", model, trace, budget, q) for q in RATES[(model, trace)]]
            _curve(ax, results, points, "p99_e2el_s", f"tau {budget}")
        ax.set(title=f"{model}, {trace}: p99", xlabel="QPS", ylabel="e2e latency (s)")
        ax.legend(fontsize=7)
        ax = axes[1][col]
        qps = BREAKDOWN_QPS[(model, trace)]
        labels, bottoms = [], []
        for who in ("middle", "tail"):
            for budget in BUDGETS:
                labels.append(f"{'p50' if who == 'middle' else 'p99'}\n{budget}")
                bottoms.append(results[key("8C", model, trace, budget, qps)].summary)
        stack = [0.0] * len(labels)
        for part, name in (
            ("prefill_queue", "prefill queueing"),
            ("prefill", "prefill"),
            ("decode", "decode"),
        ):
            who_of = ["middle"] * len(BUDGETS) + ["tail"] * len(BUDGETS)
            heights = [s[f"{w}_{part}_ms"] / 1000 for s, w in zip(bottoms, who_of, strict=True)]
            ax.bar(range(len(labels)), heights, bottom=stack, label=name)
            stack = [a + b for a, b in zip(stack, heights, strict=True)]
        others = [s[f"{w}_e2el_ms"] / 1000 - h for s, w, h in zip(bottoms, who_of, stack, strict=True)]
        ax.bar(range(len(labels)), others, bottom=stack, label="other")
        ax.set(title=f"breakdown at QPS {qps:g}", xticks=range(len(labels)), ylabel="seconds")
        ax.set_xticklabels(labels, fontsize=7)
        ax.legend(fontsize=7)
    return _save(fig, out, "fig11", f"Figure 11: colocated token-budget sweep ({title})")


def figure12(results: Results, out: Path, title: str) -> Path:
    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for row, layout in enumerate(("5P3C", "3P5C")):
        for col, stat in enumerate(("mean", "p99")):
            ax = axes[row][col]
            for budget in HYBRID_BUDGETS:
                points = [
                    key(layout, "llada-8b", "sharegpt", budget, q) for q in RATES[("llada-8b", "sharegpt")]
                ]
                _curve(ax, results, points, f"{stat}_e2el_s", f"tau {budget}")
            ax.set(title=f"{layout}, {stat}", xlabel="QPS", ylabel="e2e latency (s)")
            ax.legend(fontsize=8)
    return _save(fig, out, "fig12", f"Figure 12: hybrid budgets, LLaDA-8B ShareGPT ({title})")


PLOTS = {
    "fig5": figure5,
    "fig8": figure8,
    "fig9": figure9,
    "fig10": figure10,
    "fig11": figure11,
    "fig12": figure12,
}
