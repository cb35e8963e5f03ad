"""The sim-vs-live page: a `sangam live` results directory next to the simulation of the same run."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import analysis, charts
from app.inputs import InputError, check_progress
from app.live_data import (
    FILES,
    LiveRun,
    comparison_frame,
    load_directory,
    load_files,
    twin_notes,
    twin_spec,
    twin_testbed,
)
from app.sweep import COSTS, LATENCY_COLUMNS, PointResult, PointSpec
from app.ui import COST_LABELS, chart, run_points
from runs.results import PARTS

STATE = "live_compare"  # session_state key: (LiveRun, sim PointResult)


def read_inputs() -> tuple[LiveRun, PointSpec] | None:
    """The live run the user pointed at and its simulated twin, once they press the button."""
    with st.form("live"):
        folder = st.text_input(
            "Results directory on this machine", key="live_dir", placeholder="runs/live-3p5c"
        )
        uploads = st.file_uploader(
            "…or upload summary.json and requests.csv (blocks.csv too, for the exact forwards per block)",
            type=["json", "csv"],
            accept_multiple_files=True,
            key="live_files",
        )
        progress = st.text_input(
            "Progress model of the live run",
            "",
            key="live_progress",
            placeholder="default for the model and trace",
            help="Used only without blocks.csv; with it, the sim replays every block's forwards.",
        )
        cost = st.selectbox(
            "Iteration times of the sim",
            list(COSTS),
            key="live_cost",
            format_func=COST_LABELS.__getitem__,
        )
        if not st.form_submit_button("Simulate the same run", type="primary"):
            return None
    if uploads:
        run = load_files({f.name: f.getvalue() for f in uploads})
    elif folder.strip():
        run = load_directory(folder.strip())
    else:
        raise InputError(f"give a results directory or upload its files ({', '.join(FILES)})")
    return run, twin_spec(run, check_progress(progress), cost)


def show(run: LiveRun, sim: PointResult) -> None:
    cfg = run.summary["config"]
    forwards = "from blocks.csv" if run.blocks is not None else "drawn by the progress model"
    st.markdown(
        f"**{cfg.get('layout', cfg.get('mode'))}**, {cfg.get('model')} on {cfg.get('gpu')}, "
        f"{len(run.requests)} requests, τ {cfg.get('budget')}, θ {cfg.get('theta')}; forwards per block "
        f"{forwards}; simulated on testbed {twin_testbed(run.summary).name}, iteration times "
        f"{sim.summary['cost_model']}."
    )
    for note in twin_notes(run.summary):
        st.warning(f"Not like for like: {note}.")
    table = comparison_frame(run.summary, sim.summary)
    heads = st.columns(3)
    for col, key, label in zip(
        heads,
        ("mean_e2el_ms", "p99_e2el_ms", "request_throughput"),
        ("mean e2e", "p99 e2e", "throughput"),
        strict=True,
    ):
        row = table[table["metric"] == key]
        if not row.empty:
            scale, unit = (1000, "s") if key.endswith("_ms") else (1, "req/s")
            col.metric(
                f"{label}: live → sim",
                f"{row['live'].iloc[0] / scale:.2f} → {row['sim'].iloc[0] / scale:.2f} {unit}",
                f"{row['sim_vs_live_pct'].iloc[0]:+.1f}%",
                delta_color="off",
            )
    st.dataframe(table, hide_index=True)
    st.download_button(
        "Download sim_vs_live.csv",
        table.to_csv(index=False).encode(),
        "sim_vs_live.csv",
        mime="text/csv",
        key="csv-sim-vs-live",
        on_click="ignore",
    )
    requests = pd.concat(
        [
            run.requests[list(LATENCY_COLUMNS)].assign(source="live"),
            pd.DataFrame(sim.latencies, columns=list(LATENCY_COLUMNS)).assign(source="sim"),
        ],
        ignore_index=True,
    )
    cdf = analysis.cdf_frame(requests, "e2el", by="source")
    colours = charts.layout_colours(["live", "sim"])
    title = "CDF of end-to-end latency, live and sim"
    chart(charts.cdf_figure(cdf, title, colours, by="source", dash=True), cdf, "live_vs_sim_cdf_e2el")
    parts = pd.DataFrame(
        [
            {
                "source": source,
                "part": part.replace("_", " "),
                "seconds": summary.get(f"mean_{part}_ms", 0.0) / 1000,
            }
            for source, summary in (("live", run.summary), ("sim", sim.summary))
            for part in PARTS
        ]
    )
    chart(
        charts.breakdown_figure(parts, float(cfg.get("qps", 0)), by="source"), parts, "live_vs_sim_breakdown"
    )


def main() -> None:
    st.title("Simulated vs live")
    st.caption(
        "Load what `sangam live --out DIR` wrote; the same config and the same requests then run "
        "through the simulator, on the testbed of the run's own model, GPU, weights and KV cache (a run on "
        "CPU workers or of a tiny test model has none, and the page says so)."
    )
    try:
        given = read_inputs()
        if given is not None:
            run, spec = given
            st.session_state[STATE] = (run, run_points([spec])[0])
    except (InputError, ValueError, OSError) as err:
        st.session_state.pop(STATE, None)
        st.error(f"Cannot compare: {err}")
        return
    except Exception as err:  # the page shows a message, never a traceback
        st.session_state.pop(STATE, None)
        st.error(f"The simulation failed: {type(err).__name__}: {err}")
        return
    stored = st.session_state.get(STATE)
    if stored is None:
        st.info(
            "Point at a live results directory, or upload its files, and press **Simulate the same run**."
        )
        return
    show(*stored)


if __name__ == "__main__":
    main()
