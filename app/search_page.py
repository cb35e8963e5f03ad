"""The search page: the highest QPS at which each configuration meets an SLO (`sangam search` in the
explorer), ranked, with every probe the bisection made."""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from app.capacity import (
    Capacity,
    CapacityQuery,
    config_label,
    probes_frame,
    ranking_frame,
    run_query,
    slo_limit,
)
from app.inputs import InputError
from app.sweep import COSTS, WORKERS, profile_label
from app.ui import COST_LABELS, chart, marked_running, stopped_notice
from runs.config import DATASETS
from runs.tally import Tally
from sangam.hardware import GPUS, MODELS
from sim.search import MARKS, legend

SYMBOLS = {"+": ("circle", "●"), "-": ("x", "✕"), "^": ("triangle-up", "▲")}  # a mark's marker, its glyph
DEFAULTS = CapacityQuery()
STATE = "capacity"  # session_state key of the last search: a Capacity


def sidebar() -> CapacityQuery | None:
    """The search form; its query once 'Find the capacity' is pressed, else None."""
    st.sidebar.header("What to search")
    model = st.sidebar.selectbox(
        "Model", list(MODELS), index=list(MODELS).index(DEFAULTS.model), key="s_model"
    )
    gpu = st.sidebar.selectbox(
        "GPU profile", list(GPUS), index=list(GPUS).index(DEFAULTS.gpu), key="s_gpu",
        format_func=lambda g: profile_label(model, g),
    )  # fmt: skip
    with st.sidebar.form("search"):
        trace = st.selectbox("Trace", list(DATASETS), key="s_trace", format_func=lambda t: f"{t} (synthetic)")
        cost = st.selectbox(
            "Iteration times", list(COSTS), key="s_cost",
            format_func=lambda c: profile_label(model, gpu) if c == "profile" else COST_LABELS[c],
        )  # fmt: skip
        gpus = st.number_input("GPUs", min_value=1, max_value=256, value=DEFAULTS.gpus, step=1, key="s_gpus")
        layouts = st.text_input(
            "Layouts", DEFAULTS.layouts, key="s_layouts",
            help="all: colocated and every <n>P<m>D and <n>P<m>C split of the GPUs; or a list (8C, 5P3C)",
        )  # fmt: skip
        budgets = st.text_input("τ (tokens, several allowed)", DEFAULTS.budgets, key="s_budgets")
        thetas = st.text_input("θ (tokens, several allowed)", DEFAULTS.thetas, key="s_thetas")
        slos = st.text_input(
            "SLOs", DEFAULTS.slos, key="s_slos",
            help="METRIC=LIMIT, several separated by commas: <mean|median|p90|p99>_<e2el|queue|prefill|"
            "decode|...>_<s|ms>, overflow_rate, kv_transferred_gb",
        )  # fmt: skip
        low, high, step = st.columns(3)
        start_qps = low.number_input("start QPS", min_value=0.01, value=DEFAULTS.start_qps, key="s_start",
                                     placeholder="1 per GPU")  # fmt: skip
        max_qps = high.number_input("max QPS", min_value=0.01, value=DEFAULTS.max_qps, key="s_max")
        granularity = step.number_input(
            "precision", min_value=0.01, value=DEFAULTS.granularity, step=0.05, key="s_granularity",
            placeholder="resolved by the runs",
            help="QPS; by default one the runs resolve: the steadiness test's resolution bound at the start "
            "QPS, rounded up to 1, 2 or 5 times a power of 10",
        )  # fmt: skip
        num_requests = st.number_input(
            "Requests per probe", min_value=1, max_value=50_000, value=DEFAULTS.num_requests, step=500,
            key="s_requests", help="the paper's points have 4000; fewer are faster and noisier",
        )  # fmt: skip
        seeds = st.text_input("Seeds (a probe's metric is their mean)", DEFAULTS.seeds, key="s_seeds")
        if not st.form_submit_button("Find the capacity", type="primary"):
            return None
    return CapacityQuery(
        model=model, trace=trace, gpu=gpu, gpus=int(gpus), layouts=layouts, budgets=budgets, thetas=thetas,
        slos=slos, granularity=None if granularity is None else float(granularity), max_qps=float(max_qps),
        num_requests=int(num_requests), start_qps=None if start_qps is None else float(start_qps),
        seeds=seeds, cost=cost,
    )  # fmt: skip


def run(query: CapacityQuery) -> None:
    """Run the search under a progress bar and keep it in the session; problems become one st.error."""
    bar = st.progress(0.0, text=f"Searching on {WORKERS} processes…")

    def watch(tally: Tally) -> None:
        share = tally.done / tally.total if tally.total else 0.0
        bar.progress(min(share, 1.0), text=f"{tally.done} of about {tally.total} points ({tally.note})")

    try:
        with marked_running(STATE):
            capacity = run_query(query, watch)
    except (InputError, ValueError, OSError) as err:
        st.session_state.pop(STATE, None)
        st.error(f"Cannot run this search: {err}")
        return
    except Exception as err:  # the page shows a message, never a traceback
        st.session_state.pop(STATE, None)
        st.error(f"The search failed: {type(err).__name__}: {err}")
        return
    finally:
        bar.empty()
    st.session_state[STATE] = capacity


def capacity_figure(capacity: Capacity) -> go.Figure:
    """The answer per configuration, best at the top; a capped answer (the SLO held at max QPS) is hatched."""
    ranking = ranking_frame(capacity).iloc[::-1]
    labels = [config_label(a) for a in capacity.answers][::-1]
    fig = go.Figure(
        go.Bar(
            x=ranking["max_qps_under_slo"], y=labels, orientation="h",
            marker_pattern_shape=["/" if c else "" for c in ranking["capped"]],
        )
    )  # fmt: skip
    fig.update_layout(
        title="Highest QPS under the SLOs", xaxis_title="QPS (requests/s)", height=120 + 24 * len(labels)
    )
    return fig


def probes_figure(capacity: Capacity, slo_index: int) -> go.Figure:
    """Each configuration's probes: the SLO's metric (mean over seeds) against the rate, each marked as
    `sangam search` marks it (`SYMBOLS`)."""
    slo = capacity.slos[slo_index]
    probes = probes_frame(capacity)
    fig = go.Figure()
    for label, group in probes.groupby("configuration", sort=False):
        fig.add_scatter(
            x=group["qps"], y=group[slo.text], name=str(label), mode="markers+lines",
            marker_symbol=[SYMBOLS[mark][0] for mark in group["mark"]],
        )  # fmt: skip
    fig.add_hline(y=slo_limit(slo), line_dash="dot", annotation_text=slo.text)
    key = ", ".join(f"{SYMBOLS[mark][1]} {mark} {meaning}" for mark, meaning in MARKS.items())
    fig.update_layout(title=f"Probes: {slo.text}<br><sup>{key}</sup>", xaxis_title="QPS",
                      yaxis_title=slo.text.partition("=")[0])  # fmt: skip
    return fig


def show(capacity: Capacity) -> None:
    query = capacity.query
    best = capacity.answers[0]
    st.markdown(
        f"**{query.model}** on {query.gpus} **{query.gpu}** GPUs, {query.trace}, {query.num_requests} "
        f"requests per probe, seeds {query.seeds}; SLOs {', '.join(s.text for s in capacity.slos)}; "
        f"precision {capacity.granularity:g} QPS."
    )
    bound = "≥ " if best.capped else ""
    st.metric("Best configuration", config_label(best), f"{bound}{best.max_qps:g} QPS", delta_color="off")
    ranking = ranking_frame(capacity)
    chart(capacity_figure(capacity), ranking, "max_qps_under_slo")
    for i in range(len(capacity.slos)):
        chart(probes_figure(capacity, i), probes_frame(capacity), f"probes_{i}")
    st.caption(
        "From the start QPS the search doubles while every SLO holds, then bisects between the last rate "
        "that met them and the first that missed, down to the precision: the answer met every SLO and the "
        "answer plus one step missed one. A probe's metric is its mean over the seeds, and it passes "
        f"only if its runs kept up with their arrivals. Probes: {legend()}."
    )
    st.dataframe(ranking, hide_index=True)


def main() -> None:
    st.title("Capacity under an SLO")
    st.caption("The highest load each layout, budget and threshold serves within a latency target.")
    query = sidebar()
    stopped_notice(STATE, "Find the capacity", pressed=query is not None)
    if query is not None:
        run(query)
    stored = st.session_state.get(STATE)
    if stored is None:
        if query is None:
            st.info("Set the grid and the SLOs in the sidebar, then press **Find the capacity**.")
        return
    show(stored)


if __name__ == "__main__":
    main()
