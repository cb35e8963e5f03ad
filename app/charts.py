"""Plotly figures for the explorer, each drawn from one table of `app.analysis` (which is its CSV)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

PALETTE = px.colors.qualitative.Plotly
PART_COLOURS = {  # queues in greys, work in colours
    "prefill queue": "#b0b0b0",
    "prefill": "#1f77b4",
    "decode queue": "#7f7f7f",
    "transfer": "#ff7f0e",
    "decode": "#2ca02c",
}


def layout_colours(names: Sequence[str]) -> dict[str, str]:
    """One colour per name, the same in every chart of a comparison."""
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(dict.fromkeys(names))}


def latency_figure(
    latency: pd.DataFrame, knees: pd.DataFrame, slo_s: float, colours: dict[str, str], log_y: bool = False
) -> go.Figure:
    """Mean (dashed) and p99 (solid) end-to-end latency against QPS per layout, the SLO and each knee."""
    fig = go.Figure()
    for layout, group in latency.groupby("layout", sort=False):
        colour = colours[str(layout)]
        fig.add_scatter(
            x=group["qps"],
            y=group["p99_e2e_s"],
            mode="lines+markers",
            name=f"{layout} p99",
            line={"color": colour},
            legendgroup=str(layout),
        )
        fig.add_scatter(
            x=group["qps"],
            y=group["mean_e2e_s"],
            mode="lines+markers",
            name=f"{layout} mean",
            line={"color": colour, "dash": "dash"},
            marker={"symbol": "circle-open"},
            legendgroup=str(layout),
        )
    for _, knee in knees.iterrows():
        if not math.isnan(knee["knee_qps"]):
            fig.add_scatter(
                x=[knee["knee_qps"]],
                y=[knee["p99_e2e_s"]],
                mode="markers",
                name=f"{knee['layout']} knee",
                marker={
                    "symbol": "star",
                    "size": 16,
                    "color": colours[str(knee["layout"])],
                    "line": {"color": "black", "width": 1},
                },
                legendgroup=str(knee["layout"]),
                hovertemplate=f"{knee['layout']} knee: %{{x:g}} QPS<extra></extra>",
            )
    fig.add_hline(y=slo_s, line={"color": "red", "dash": "dot"}, annotation_text=f"SLO p99 ≤ {slo_s:g} s")
    fig.update_layout(
        title="End-to-end latency against load",
        xaxis_title="offered load (QPS)",
        yaxis_title="end-to-end latency (s)",
        yaxis_type="log" if log_y else "linear",
        legend_title="layout",
    )
    return fig


def best_figure(best: pd.DataFrame, slo_s: float, colours: dict[str, str]) -> go.Figure:
    """The best layout per QPS: its p99 as a bar, coloured by layout; hatched where none meets the SLO."""
    fig = go.Figure()
    for layout, group in best.groupby("lowest_p99_layout", sort=False):
        meets = group["meets_slo"]
        fig.add_bar(
            x=group["qps"],
            y=group["p99_e2e_s"],
            name=str(layout),
            marker_color=colours[str(layout)],
            marker_pattern_shape=["" if m else "/" for m in meets],
            text=[str(layout) if m else f"{layout} (misses)" for m in meets],
            textposition="outside",
        )
    fig.add_hline(y=slo_s, line={"color": "red", "dash": "dot"}, annotation_text=f"SLO p99 ≤ {slo_s:g} s")
    fig.update_layout(
        title="Best layout per QPS (lowest p99 meeting the SLO; hatched: none meets it)",
        xaxis_title="offered load (QPS)",
        yaxis_title="p99 end-to-end latency (s)",
        legend_title="layout",
    )
    return fig


def cdf_figure(
    cdf: pd.DataFrame, title: str, colours: dict[str, str], by: str = "layout", dash: bool = False
) -> go.Figure:
    """Empirical CDFs, one line per value of `by` (each dashed differently if `dash`, so overlaps show)."""
    fig = px.line(
        cdf,
        x="seconds",
        y="fraction",
        color=by,
        title=title,
        line_shape="hv",
        color_discrete_map=colours,
        line_dash=by if dash else None,
    )
    fig.update_layout(xaxis_title="seconds", yaxis_title="fraction of requests", yaxis_range=[0, 1.02])
    return fig


def breakdown_figure(breakdown: pd.DataFrame, qps: float, by: str = "layout") -> go.Figure:
    """Stacked mean time per request in each part of its life, one bar per value of `by`."""
    fig = px.bar(
        breakdown,
        x=by,
        y="seconds",
        color="part",
        color_discrete_map=PART_COLOURS,
        title=f"Where a request's time goes at {qps:g} QPS (mean per request)",
    )
    fig.update_layout(barmode="stack", yaxis_title="seconds per request", legend_title="part")
    return fig


def series_figure(
    series: pd.DataFrame, column: str, title: str, scale_title: str, roles: Sequence[str]
) -> go.Figure:
    """A heat map of `column` per worker (rows, labelled with their role) over time."""
    table = series.pivot(index="worker", columns="time_s", values=column).sort_index()
    labels = [f"w{w} {roles[w]}" for w in table.index]
    fig = go.Figure(
        go.Heatmap(
            z=table.to_numpy(),
            x=table.columns,
            y=labels,
            colorscale="Viridis",
            colorbar={"title": scale_title},
            hovertemplate="%{y}<br>t = %{x:.1f} s<br>%{z:g}<extra></extra>",
        )
    )
    fig.update_layout(
        title=title,
        xaxis_title="simulated time (s)",
        yaxis_title="worker",
        yaxis={"autorange": "reversed", "tickmode": "array", "tickvals": labels},
        height=max(300, 120 + 30 * len(labels)),
    )
    return fig
