"""The explorer page: compare layouts over a QPS range, then look at one rate in detail."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from app import analysis, charts
from app.inputs import InputError, Setup, UploadedTrace, build_setup, default_mask_len, read_uploaded_trace
from app.sweep import COSTS, PointResult, profile_label
from app.ui import COST_LABELS, chart, marked_running, run_points, stopped_notice
from profiles.testbeds import known_testbeds
from runs.config import DATASETS, RunConfig
from sangam.budget import Policy
from sangam.hardware import GPUS, MODELS
from sangam.layout import parse_mode
from sangam.progress import DEFAULT_PROGRESS
from sangam.workload import MAX_ARRIVAL_CV

DEFAULTS = RunConfig()
UPLOAD = "upload"
STATE = "explore"  # session_state key of the last comparison: (Setup, results)


def sidebar() -> dict[str, Any] | None:
    """The comparison form; its values once 'Run comparison' is pressed, else None.

    Model, trace and GPU sit above the form: changing one redraws the fields that depend on it (the mask
    buffer's default, the profile's provenance) at once, not only when the form is submitted."""
    st.sidebar.header("What to compare")
    model = st.sidebar.selectbox("Model", list(MODELS), index=list(MODELS).index(DEFAULTS.model), key="model")
    trace = st.sidebar.selectbox(
        "Trace",
        [*DATASETS, UPLOAD],
        key="trace",
        format_func=lambda t: "upload a trace file" if t == UPLOAD else f"{t} (synthetic)",
    )
    testbed = st.sidebar.selectbox(
        "Testbed",
        ["", *known_testbeds()],
        key="testbed",
        format_func=lambda t: t or "the GPU profile below",
        help="As `sangam sim --testbed`: GPU, profiles, KV pages, forwards per block, KV link, control "
        "delay and arrivals of a named testbed (profiles/data/testbeds); a progress model given below "
        "overrides its forwards per block",
    )
    gpu = st.sidebar.selectbox(
        "GPU profile",
        list(GPUS),
        index=list(GPUS).index(DEFAULTS.gpu),
        key="gpu",
        format_func=lambda g: profile_label(model, g),
    )
    with st.sidebar.form("setup"):
        uploaded = st.file_uploader(
            "Trace file (.csv or .jsonl: prompt_len, output_len[, steps])",
            type=["csv", "jsonl", "json"],
            key="upload",
        )
        cost = st.selectbox(
            "Iteration times",
            list(COSTS),
            key="cost",
            format_func=lambda c: profile_label(model, gpu) if c == "profile" else COST_LABELS[c],
            help="As `sangam sim --cost`: the profile measured on this GPU (or derived from one that was), "
            "else the analytic model",
        )
        gpus = st.number_input("GPUs", min_value=0, max_value=256, value=DEFAULTS.gpus, step=1, key="gpus")
        layouts = st.text_input(
            "Layouts to compare",
            "colocated, 5P3D, 3P5C",
            key="layouts",
            help="colocated, <n>P<m>D (disaggregated) or <n>P<m>C (hybrid); each must use every GPU",
        )
        st.subheader("Load")
        low, high, count = st.columns(3)
        qps_min = low.number_input("QPS min", min_value=0.0, value=4.0, step=0.5, key="qps_min")
        qps_max = high.number_input("QPS max", min_value=0.0, value=13.0, step=0.5, key="qps_max")
        qps_count = count.number_input(
            "points", min_value=0, max_value=100, value=10, step=1, key="qps_count"
        )
        num_requests = st.number_input(
            "Requests per point", min_value=1, max_value=50_000, value=2000, step=500, key="num_requests"
        )
        mask_len = st.number_input(
            "Mask buffer (tokens)",
            min_value=32,
            max_value=8192,
            value=default_mask_len(trace),
            step=32,
            key=f"mask_len_{trace}",  # a new trace starts the field afresh at its own default
            help="A multiple of 32; a new trace starts at its default (1024 ShareGPT and trace files, "
            "512 arXiv)",
        )
        seeds = st.text_input("Seeds (averaged)", "0", key="seeds", help="one or several, e.g. 0, 1, 2")
        st.subheader("Scheduler")
        budget = st.number_input(
            "τ colocated / decode-role workers (tokens)",
            min_value=1,
            value=DEFAULTS.budget,
            step=128,
            key="budget",
        )
        prefill_budget = st.number_input(
            "τ prefill-role workers (tokens)",
            min_value=1,
            value=DEFAULTS.prefill_budget,
            step=128,
            key="prefill_budget",
        )
        theta = st.number_input(
            "θ hybrid overflow threshold (tokens)", min_value=1, value=DEFAULTS.theta, step=1024, key="theta"
        )
        with st.expander("More knobs"):
            policy = st.selectbox(
                "Batching policy",
                [p.value for p in Policy],
                key="policy",
                help="deficit: Algorithm 1; prefill-first: τ = ∞ (Orca, vLLM); fastdllm: one at a time",
            )
            arrival_cv = st.number_input(
                "Arrival CV (0: Poisson)",
                min_value=0.0,
                max_value=MAX_ARRIVAL_CV,
                value=0.0,
                step=0.5,
                key="arrival_cv",
                help="gamma inter-arrival gaps with this coefficient of variation; above 1 is burstier",
            )
        progress = st.text_input(
            "Progress model (forwards per block)",
            "",
            key="progress",
            placeholder="default for the model and trace",
            help="blank: "
            + "; ".join(f"{m} {t}: betabinom:{a:g}:{s:g}" for (m, t), (a, s) in DEFAULT_PROGRESS.items())
            + ". Or fixed:D, uniform:LO:HI, betabinom:MEAN:STD.",
        )
        if not st.form_submit_button("Run comparison", type="primary"):
            return None
    return {
        "model": model,
        "gpu": gpu,
        "gpus": int(gpus),
        "layouts": layouts,
        "trace": trace,
        "uploaded": uploaded,
        "qps_min": float(qps_min),
        "qps_max": float(qps_max),
        "qps_count": int(qps_count),
        "budget": int(budget),
        "prefill_budget": int(prefill_budget),
        "theta": int(theta),
        "progress": progress,
        "seeds": seeds,
        "num_requests": int(num_requests),
        "mask_len": int(mask_len),
        "cost": cost,
        "policy": policy,
        "arrival_cv": float(arrival_cv) or None,
        "testbed": testbed,
    }


def run(values: dict[str, Any]) -> None:
    """Check the form, run the comparison and keep it in the session; problems become one st.error."""
    uploaded = values.pop("uploaded")
    try:
        upload: UploadedTrace | None = None
        if values["trace"] == UPLOAD and uploaded is not None:
            upload = read_uploaded_trace(uploaded.name, uploaded.getvalue())
        setup = build_setup(**values, upload=upload)
        with marked_running(STATE):
            results = run_points(setup.specs())
    except (InputError, ValueError, OSError) as err:  # a request too long for the KV pool comes from a worker
        st.session_state.pop(STATE, None)
        st.error(f"Cannot run this comparison: {err}")
        return
    except Exception as err:  # the page shows a message, never a traceback
        st.session_state.pop(STATE, None)
        st.error(f"The simulation failed: {type(err).__name__}: {err}")
        return
    st.session_state[STATE] = (setup, results)


def describe(setup: Setup, results: list[PointResult]) -> str:
    cfg = setup.base
    trace = setup.trace.text() if setup.trace else cfg.trace
    arrivals = "Poisson" if cfg.arrival_cv is None else f"gamma (CV {cfg.arrival_cv:g})"
    if cfg.arrival_clip is not None:
        arrivals += f" (gaps clipped at {cfg.arrival_clip:g} mean gaps)"
    arrivals += f", testbed {setup.resolved.testbed.name}"
    return (
        f"**{cfg.model}** on {cfg.gpus} **{cfg.gpu}** GPUs, trace {trace}, "
        f"{cfg.num_requests} requests per point, τ {cfg.budget} (prefill role {cfg.prefill_budget}), "
        f"θ {cfg.theta}, policy {cfg.policy.value}, "
        f"{arrivals} arrivals, "
        f"mask buffer {cfg.mask_tokens}, progress {setup.resolved.progress}, "
        f"seeds {', '.join(map(str, setup.seeds))}; iteration times {results[0].summary['cost_model']}."
    )


def knee_text(knee: float, top: float) -> str:
    if pd.isna(knee):
        return "none"
    return f"≥ {knee:g} QPS (every rate)" if knee == top else f"{knee:g} QPS"


def show(setup: Setup, results: list[PointResult]) -> None:
    st.markdown(describe(setup, results))
    if setup.trace and setup.trace.had_arrivals:
        cv = setup.base.arrival_cv
        arrivals = "Poisson arrivals" if cv is None else f"gamma arrivals (CV {cv:g})"
        st.info(f"The uploaded file's arrival times are replaced by {arrivals} at each QPS of the sweep.")
    avg = analysis.averaged(analysis.points_frame(results))
    latency = analysis.latency_frame(avg)
    slo_col, log_col = st.columns([3, 1])
    slo = slo_col.number_input(
        "SLO: p99 end-to-end latency (s)", min_value=0.01, value=8.0, step=0.5, key="slo"
    )
    log_y = log_col.toggle("log latency axis", key="log_y")

    st.header("Latency against load")
    colours = charts.layout_colours(setup.layouts)
    knees = analysis.knees(latency, slo)
    for col, (_, knee) in zip(st.columns(len(knees)), knees.iterrows(), strict=True):
        col.metric(f"{knee['layout']} knee", knee_text(knee["knee_qps"], max(setup.rates)))
    chart(
        charts.latency_figure(latency, knees, slo, colours, log_y),
        latency.merge(knees[["layout", "knee_qps"]], on="layout"),
        "latency_vs_qps",
    )
    st.caption(analysis.KNEE_RULE + " Mean: dashed; p99: solid; both averaged over seeds.")

    st.header("Best layout per QPS")
    best = analysis.best_layouts(latency, slo)
    chart(charts.best_figure(best, slo, colours), best, "best_layout_per_qps")
    st.caption(analysis.BEST_RULE)

    st.header("One rate in detail")
    sweep_id = f"{setup.layouts}{setup.rates}"  # detail widgets start afresh for a new comparison
    qps = st.select_slider(
        "QPS", options=list(setup.rates), value=setup.rates[len(setup.rates) // 2], key=f"qps-{sweep_id}"
    )
    requests = analysis.requests_frame(results, qps)
    for metric, label in (
        ("e2el", "end-to-end latency"),
        ("queue", "queueing delay"),
        ("decode", "decode time"),
    ):
        cdf = analysis.cdf_frame(requests, metric)
        chart(
            charts.cdf_figure(cdf, f"CDF of {label} at {qps:g} QPS", colours), cdf, f"cdf_{metric}_qps{qps:g}"
        )
    breakdown = analysis.breakdown_frame(avg, qps)
    chart(charts.breakdown_figure(breakdown, qps), breakdown, f"breakdown_qps{qps:g}")

    layout = st.selectbox("Layout over time", list(setup.layouts), key=f"layout-{sweep_id}")
    point = next(r for r in results if r.layout == layout and r.qps == qps and r.seed == setup.seeds[0])
    series = analysis.series_frame(point)
    suffix = f"{layout} at {qps:g} QPS, seed {point.seed}"
    roles = [role.value for role in parse_mode(layout).roles]
    chart(
        charts.series_figure(
            series, "waiting_prefills", f"Prefills waiting per worker, {suffix}", "blocks", roles
        ),
        series[["time_s", "worker", "waiting_prefills"]],
        f"queue_{layout}_qps{qps:g}",
    )
    pool = point.summary["config"]["kv_pages"]
    title = f"KV pages in use per worker, {suffix} (pool {pool} pages per worker)"
    chart(
        charts.series_figure(series, "kv_pages", title, "pages", roles),
        series[["time_s", "worker", "kv_pages"]],
        f"kv_{layout}_qps{qps:g}",
    )
    st.caption(
        "Derived from the blocks: a block waits on its prefill worker from dispatch to prefill start, and "
        "holds ceil(S/16) pages there from prefill start to transfer end (block end if not moved) and on its "
        "decode worker from transfer start to block end. Each cell shows the peak within its time bin."
    )

    st.header("Every point")
    st.dataframe(avg, hide_index=True)
    st.download_button(
        "Download points.csv",
        analysis.points_frame(results).to_csv(index=False).encode(),
        "points.csv",
        mime="text/csv",
        key="csv-points",
        on_click="ignore",
    )


def main() -> None:
    st.title("Sangam what-if explorer")
    st.caption(
        "Which layout, budget and threshold for my model, my traffic and my GPUs? Simulated, not measured."
    )
    values = sidebar()
    stopped_notice(STATE, "Run comparison", pressed=values is not None)
    if values is not None:
        run(values)
    stored = st.session_state.get(STATE)
    if stored is None:
        if values is None:
            st.info("Pick the model, trace, GPUs and layouts in the sidebar, then press **Run comparison**.")
        return
    show(*stored)


if __name__ == "__main__":
    main()
