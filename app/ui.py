"""Streamlit pieces the pages share: the cached point runner, a chart with its data as CSV, and the notice
of a run that a change stopped."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from contextlib import contextmanager

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app.sweep import WORKERS, PointResult, PointSpec, in_pool, run_sweep

# app.sweep.COSTS; the explorer names the profile by its provenance (`app.sweep.profile_label`), here the
# GPU is the live run's, not known until its files are read
COST_LABELS = {
    "profile": "the GPU's profile (measured, or derived from one that was)",
    "analytic": "analytic model",
}


@st.cache_data(max_entries=400, show_spinner=False)
def _cached_point(key: str, _spec: PointSpec, _pool: Executor) -> PointResult:
    """One point's result, cached by `key` (`PointSpec.key`: every value that decides it)."""
    return in_pool(_spec, _pool)


def cached_point(spec: PointSpec, pool: Executor) -> PointResult:
    return _cached_point(spec.key, spec, pool)


def run_points(specs: Sequence[PointSpec]) -> list[PointResult]:
    """Results of `specs` (cached ones at once, the rest on WORKERS processes) under a progress bar."""
    total = len(specs)
    points = f"{total} point{'s' if total > 1 else ''}"
    bar = st.progress(0.0, text=f"Simulating {points} on {WORKERS} processes…")
    started = time.perf_counter()

    def on_done(done: int, total: int) -> None:
        bar.progress(
            done / total, text=f"Simulated {done} of {total} points ({time.perf_counter() - started:.1f} s)"
        )

    results = run_sweep(specs, compute=cached_point, on_done=on_done)
    bar.progress(
        1.0,
        text=f"{points} done in {time.perf_counter() - started:.1f} s (repeats come from the cache)",
    )
    return results


def chart(fig: go.Figure, data: pd.DataFrame, name: str) -> None:
    """Draw `fig` and offer `data`, the table it was drawn from, as `name`.csv."""
    st.plotly_chart(fig, key=f"chart-{name}")
    st.download_button(
        f"Download {name}.csv",
        data.to_csv(index=False).encode(),
        file_name=f"{name}.csv",
        mime="text/csv",
        key=f"csv-{name}",
        on_click="ignore",
    )


@contextmanager
def marked_running(page: str) -> Iterator[None]:
    """Mark `page`'s run under way while the block runs. A widget changed mid-run (those above a form
    act at once) stops the script by a BaseException that is no Exception, and the rerun it starts finds
    the mark: `stopped_notice` then says so, where the run used to vanish without a word."""
    key = f"running-{page}"
    st.session_state[key] = True
    try:
        yield
    except Exception:
        del st.session_state[key]
        raise
    del st.session_state[key]


def stopped_notice(page: str, redo: str, pressed: bool) -> None:
    """A warning if `page`'s last run was stopped before it finished (`marked_running`), unless `redo` was
    `pressed` again (which stopped it, and runs anew)."""
    if st.session_state.pop(f"running-{page}", False) and not pressed:
        st.warning(
            f"The last run was interrupted (a setting above the form changed, or the page was left or "
            f"stopped) before it finished: press **{redo}** again."
        )
