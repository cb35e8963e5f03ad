"""The figures of `sangam reproduce`, laid out as the paper's, each a PNG and a PDF (`runs.plotting`)."""

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
from runs.plotting import (
    COLORS,
    Style,
    cap_latency,
    figure,
    house_style,
    legend_handles,
    line,
    log_latency,
    save,
    styled,
)

Results = Mapping[PointKey, PointOutcome]
NAMES = {"8C": "colocated", "5P3D": "disaggregated 5P3D", "5P3C": "hybrid 5P3C", "fastdllm": "Fast-dLLM"}
BREAKDOWN = (("prefill_queue", "prefill queueing"), ("prefill", "prefill"), ("decode", "decode"))
HEADROOM = 1.12  # a bar axis ends this far above its tallest bar


def _curve(
    ax: Any, results: Results, points: Sequence[PointKey], name: str, style: Style, label: str
) -> None:
    line(ax, [p.qps for p in points], [metric(results[p].summary, name) for p in points], style, label)


def _legend_below(fig: Any, style_of: Mapping[str, Style], beyond: bool = False) -> None:
    handles, labels = legend_handles(style_of, beyond)
    fig.legend(handles, labels, loc="outside lower center", ncols=len(handles), frameon=False)


def _save(fig: Any, out: Path, name: str, title: str) -> list[Path]:
    fig.suptitle(title)
    return save(fig, out / name)


def figure5(results: Results, out: Path, title: str) -> list[Path]:
    with house_style():
        fig = figure(8.0, 3.4)
        a, b = fig.subplots(1, 2)
        splits = ("4P4D", "5P3D", "6P2D")
        points = [key(s, "llada-8b", "sharegpt", 1024, 6.5) for s in splits]
        a.boxplot([results[p].rows["e2el"] for p in points], tick_labels=splits, showfliers=False)
        a.set(title="(a) e2e latency (whiskers: 1.5 IQR)", ylabel="seconds")
        width = 0.38
        tallest = 0.0
        for i, (part, label) in enumerate(
            (("prefill_queue", "at prefill workers"), ("decode_queue", "at decode workers"))
        ):
            medians = [metric(results[p].summary, f"median_{part}_s") for p in points]
            b.bar([x + (i - 0.5) * width for x in range(3)], medians, width, label=label, color=COLORS[i])
            tallest = max(tallest, *medians)
        b.set(title="(b) scheduling delay (median)", xticks=range(3), xticklabels=splits, ylabel="seconds")
        b.set_ylim(0, HEADROOM * tallest)
        b.legend(loc="upper right", frameon=False)
        return _save(fig, out, "fig5", f"Figure 5: LLaDA-8B ShareGPT, 8 GPUs, QPS 6.5 ({title})")


def figure8(results: Results, out: Path, title: str) -> list[Path]:
    with house_style():
        fig = figure(8.0, 5.6)
        axes = fig.subplots(2, 2, sharex=True)
        style_of = styled(("Fast-dLLM", "Sangam colocated, tau 1024"))
        for col, trace in enumerate(("sharegpt", "arxiv")):
            for row, stat in enumerate(("mean", "p99")):
                ax = axes[row][col]
                for policy, label in zip(("fastdllm", "deficit"), style_of, strict=True):
                    points = [key("1C", "llada-8b", trace, 1024, q, policy) for q in ONE_GPU_RATES]
                    _curve(ax, results, points, f"{stat}_e2el_s", style_of[label], label)
                ax.set(title=f"{trace}: {stat}", ylabel="e2e latency (s)")
                log_latency(ax)
        for ax in axes[-1]:
            ax.set_xlabel("QPS")
        _legend_below(fig, style_of)
        return _save(fig, out, "fig8", f"Figure 8: LLaDA-8B on one H100-class GPU ({title})")


def figure9(results: Results, out: Path, title: str) -> list[Path]:
    with house_style():
        fig = figure(13.0, 5.8)
        axes = fig.subplots(2, 4)
        style_of = styled(NAMES[layout] for layout in LAYOUTS)
        beyond = False
        for col, (model, trace) in enumerate(PAIRS):
            for row, stat in enumerate(("mean", "p99")):
                ax = axes[row][col]
                for layout in LAYOUTS:
                    points = [key(layout, model, trace, 1024, q) for q in RATES[(model, trace)]]
                    _curve(ax, results, points, f"{stat}_e2el_s", style_of[NAMES[layout]], NAMES[layout])
                ax.set(title=f"{model}, {trace}: {stat}", xlabel="QPS", ylabel="e2e latency (s)")
                beyond = bool(cap_latency([ax])) or beyond
        _legend_below(fig, style_of, beyond)
        return _save(fig, out, "fig9", f"Figure 9: colocated, 5P3D and 5P3C on 8 GPUs ({title})")


def figure10(results: Results, out: Path, title: str) -> list[Path]:
    with house_style():
        fig = figure(13.0, 3.6)
        axes = fig.subplots(1, 4)
        style_of = styled(NAMES[layout] for layout in LAYOUTS)
        panels = [(pair, part) for pair in CDF_POINTS for part in ("prefill_queue", "decode")]
        for ax, ((model, trace), part) in zip(axes, panels, strict=True):
            qps = CDF_POINTS[(model, trace)]
            for layout in LAYOUTS:
                values = sorted(results[key(layout, model, trace, 1024, qps)].rows[part])
                label = NAMES[layout]
                fractions = [(i + 1) / len(values) for i in range(len(values))]
                line(ax, values, fractions, style_of[label], label, markevery=0.1)
            what = "prefill queueing delay" if part == "prefill_queue" else "request decode time"
            ax.set(title=f"{model}, {trace}, QPS {qps:g}", xlabel=f"{what} (s)", ylabel="CDF")
        _legend_below(fig, style_of)
        return _save(fig, out, "fig10", f"Figure 10: per-request CDFs ({title})")


def figure11(results: Results, out: Path, title: str) -> list[Path]:
    with house_style():
        fig = figure(14.0, 6.6)
        axes = fig.subplots(2, 4)
        style_of = styled(f"tau {budget}" for budget in BUDGETS)
        beyond = False
        for col, (model, trace) in enumerate(PAIRS):
            ax = axes[0][col]
            for budget in BUDGETS:
                points = [key("8C", model, trace, budget, q) for q in RATES[(model, trace)]]
                _curve(ax, results, points, "p99_e2el_s", style_of[f"tau {budget}"], f"tau {budget}")
            ax.set(title=f"{model}, {trace}: p99", xlabel="QPS", ylabel="e2e latency (s)")
            beyond = bool(cap_latency([ax])) or beyond
            _breakdown(axes[1][col], results, model, trace)
        handles, labels = legend_handles(style_of, beyond)
        axes[0][-1].legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
        axes[1][-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
        return _save(fig, out, "fig11", f"Figure 11: colocated token-budget sweep ({title})")


def _breakdown(ax: Any, results: Results, model: str, trace: str) -> None:
    """Stacked bars of the parts of the median and the tail request's latency at each budget."""
    qps = BREAKDOWN_QPS[(model, trace)]
    bars = [(who, budget) for who in ("middle", "tail") for budget in BUDGETS]
    whos = [who for who, _ in bars]
    summaries = [results[key("8C", model, trace, budget, qps)].summary for _, budget in bars]
    labels = [f"{'p50' if who == 'middle' else 'p99'}\n{budget}" for who, budget in bars]
    stack = [0.0] * len(labels)
    for i, (part, name) in enumerate(BREAKDOWN):
        heights = [s[f"{w}_{part}_ms"] / 1000 for s, w in zip(summaries, whos, strict=True)]
        ax.bar(range(len(labels)), heights, bottom=stack, label=name, color=COLORS[i])
        stack = [a + b for a, b in zip(stack, heights, strict=True)]
    others = [s[f"{w}_e2el_ms"] / 1000 - h for s, w, h in zip(summaries, whos, stack, strict=True)]
    ax.bar(range(len(labels)), others, bottom=stack, label="other", color=COLORS[len(BREAKDOWN)])
    tops = [a + max(b, 0.0) for a, b in zip(stack, others, strict=True)]
    ax.set(title=f"breakdown at QPS {qps:g}", xticks=range(len(labels)), ylabel="seconds",
           xlabel="request and tau", ylim=(0, HEADROOM * max(tops)))  # fmt: skip
    ax.set_xticklabels(labels, fontsize=7)


def figure12(results: Results, out: Path, title: str) -> list[Path]:
    with house_style():
        fig = figure(8.0, 5.6)
        axes = fig.subplots(2, 2, sharex=True)
        style_of = styled(f"tau {budget}" for budget in HYBRID_BUDGETS)
        beyond = False
        for row, layout in enumerate(("5P3C", "3P5C")):
            for col, stat in enumerate(("mean", "p99")):
                ax = axes[row][col]
                for budget in HYBRID_BUDGETS:
                    points = [
                        key(layout, "llada-8b", "sharegpt", budget, q)
                        for q in RATES[("llada-8b", "sharegpt")]
                    ]
                    _curve(ax, results, points, f"{stat}_e2el_s", style_of[f"tau {budget}"], f"tau {budget}")
                ax.set(title=f"{layout}: {stat}", ylabel="e2e latency (s)")
                beyond = bool(cap_latency([ax])) or beyond
        for ax in axes[-1]:
            ax.set_xlabel("QPS")
        _legend_below(fig, style_of, beyond)
        return _save(fig, out, "fig12", f"Figure 12: hybrid budgets, LLaDA-8B ShareGPT ({title})")


PLOTS = {
    "fig5": figure5,
    "fig8": figure8,
    "fig9": figure9,
    "fig10": figure10,
    "fig11": figure11,
    "fig12": figure12,
}
