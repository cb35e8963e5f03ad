"""The tables behind every chart, from sweep results (pandas, no Streamlit).

Times in these tables are seconds. Several seeds of a point are averaged (summaries) or pooled (requests).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from app.sweep import LATENCY_COLUMNS, PointResult
from runs.results import PARTS

KNEE_RULE = (
    "The knee of a layout is the highest swept QPS up to which every swept rate keeps the p99 end-to-end "
    "latency at or under the SLO (its maximum sustainable rate on this grid); none if even the lowest misses."
)
BEST_RULE = (
    "At each QPS, the best layout is the one with the lowest p99 end-to-end latency among those that meet "
    "the SLO; where none meets it, the lowest p99 is shown, marked as missing the SLO."
)
CDF_POINTS = 400  # points per curve; a curve of more requests is drawn through evenly spaced quantiles


def points_frame(results: Sequence[PointResult]) -> pd.DataFrame:
    """One row per simulated point: layout, qps, seed and every numeric summary value."""
    rows = []
    for r in results:
        numbers = {
            k: v for k, v in r.summary.items() if isinstance(v, int | float) and not isinstance(v, bool)
        }
        rows.append({"layout": r.layout, "qps": r.qps, "seed": r.seed, **numbers})
    return pd.DataFrame(rows)


def averaged(points: pd.DataFrame) -> pd.DataFrame:
    """The mean over seeds of every summary value, one row per (layout, qps), layouts in sweep order."""
    order = list(dict.fromkeys(points["layout"]))
    numeric = points.drop(columns=["seed"]).groupby(["layout", "qps"], sort=False).mean()
    out = numeric.reset_index()
    out.insert(2, "seeds", points.groupby(["layout", "qps"], sort=False).size().to_numpy())
    out["layout"] = pd.Categorical(out["layout"], categories=order, ordered=True)
    return out.sort_values(["layout", "qps"]).reset_index(drop=True)


def latency_frame(avg: pd.DataFrame) -> pd.DataFrame:
    """Mean and p99 end-to-end latency (s) per layout and rate."""
    return pd.DataFrame(
        {
            "layout": avg["layout"].astype(str),
            "qps": avg["qps"],
            "mean_e2e_s": avg["mean_e2el_ms"] / 1000,
            "p99_e2e_s": avg["p99_e2el_ms"] / 1000,
        }
    )


def knees(latency: pd.DataFrame, slo_s: float) -> pd.DataFrame:
    """Per layout, the knee (see KNEE_RULE) and its p99; NaN where no rate meets the SLO."""
    rows = []
    for layout, group in latency.groupby("layout", sort=False):
        knee, p99 = math.nan, math.nan
        for qps, value in zip(group["qps"], group["p99_e2e_s"], strict=True):
            if value > slo_s:
                break
            knee, p99 = qps, value
        rows.append({"layout": layout, "knee_qps": knee, "p99_e2e_s": p99})
    return pd.DataFrame(rows)


def best_layouts(latency: pd.DataFrame, slo_s: float) -> pd.DataFrame:
    """Per rate, the best layout for the SLO (see BEST_RULE)."""
    rows = []
    for qps, group in latency.groupby("qps", sort=True):
        best = group.loc[group["p99_e2e_s"].idxmin()]
        meeting = group[group["p99_e2e_s"] <= slo_s]
        rows.append(
            {
                "qps": qps,
                "best_layout": str(best["layout"]) if not meeting.empty else "none meets the SLO",
                "lowest_p99_layout": str(best["layout"]),
                "p99_e2e_s": best["p99_e2e_s"],
                "meets_slo": not meeting.empty,
                "layouts_meeting_slo": ", ".join(meeting["layout"].astype(str)),
            }
        )
    return pd.DataFrame(rows)


def requests_frame(results: Sequence[PointResult], qps: float) -> pd.DataFrame:
    """Every request of every layout and seed at `qps` (LATENCY_COLUMNS plus layout and seed)."""
    frames = [
        pd.DataFrame(r.latencies, columns=list(LATENCY_COLUMNS)).assign(layout=r.layout, seed=r.seed)
        for r in results
        if r.qps == qps
    ]
    return pd.concat(frames, ignore_index=True)


def cdf_frame(requests: pd.DataFrame, metric: str, by: str = "layout") -> pd.DataFrame:
    """The empirical CDF of `metric` (s) per value of column `by`, at most CDF_POINTS points per curve."""
    frames = []
    for name, group in requests.groupby(by, sort=False):
        values = np.sort(group[metric].to_numpy())
        picks = np.unique(np.linspace(0, len(values) - 1, min(len(values), CDF_POINTS)).round().astype(int))
        frames.append(
            pd.DataFrame({by: name, "seconds": values[picks], "fraction": (picks + 1) / len(values)})
        )
    return pd.concat(frames, ignore_index=True)


def breakdown_frame(avg: pd.DataFrame, qps: float) -> pd.DataFrame:
    """Mean seconds per request in each part of its life, per layout, at `qps` (long format)."""
    at = avg[avg["qps"] == qps]
    rows = [
        {
            "layout": str(row["layout"]),
            "part": part.replace("_", " "),
            "seconds": row[f"mean_{part}_ms"] / 1000,
        }
        for _, row in at.iterrows()
        for part in PARTS
    ]
    return pd.DataFrame(rows)


def series_frame(result: PointResult) -> pd.DataFrame:
    """Waiting prefills and KV pages per worker over time (long format) for one point."""
    times = list(result.series.times)
    frames = [
        pd.DataFrame(
            {
                "time_s": times,
                "worker": worker,
                "waiting_prefills": result.series.queue[worker],
                "kv_pages": result.series.kv_pages[worker],
            }
        )
        for worker in sorted(result.series.queue)
    ]
    return pd.concat(frames, ignore_index=True)
