"""`sangam reproduce`: the paper's Figures 5 and 8-12 re-run in the simulator on a testbed, and every
number of sections 3.3 and 6 beside the simulated one (`calib.claims`).

Each figure is a set of points (`FIGURES`); all points, the claims' included, run once each on a
local process pool. Beside the summary, each point records its tail request (the one whose e2e is
nearest the p99) and, where a figure plots distributions, its per-request rows.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calib.points import PointKey, PointRunner
from profiles.testbeds import load_testbed
from runs.options import nonempty_path, option
from runs.results import percentile, request_row

PAIRS = (("llada-8b", "sharegpt"), ("llada-8b", "arxiv"), ("dream-7b", "sharegpt"), ("dream-7b", "arxiv"))
# Rates of each pair's load curves: the paper's x-axes (Figures 9, 11), over the loaded region
RATES = {
    ("llada-8b", "sharegpt"): (5.0, 5.5, 6.0, 6.5, 7.0, 7.5),
    ("llada-8b", "arxiv"): (5.0, 6.0, 7.0, 7.5, 8.0),
    ("dream-7b", "sharegpt"): (6.0, 7.0, 7.5, 8.0, 8.5),
    ("dream-7b", "arxiv"): (6.0, 7.0, 8.0, 8.5, 9.0, 9.5),
}
ONE_GPU_RATES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.2)  # Figure 8
LAYOUTS = ("8C", "5P3D", "5P3C")  # Figures 9 and 10
BUDGETS = (512, 1024, 2048, 16384)  # Figure 11
BREAKDOWN_QPS = {  # Figure 11's breakdowns: the paper names no rate, these are ours in each stable regime
    ("llada-8b", "sharegpt"): 7.0,
    ("llada-8b", "arxiv"): 7.0,
    ("dream-7b", "sharegpt"): 8.0,
    ("dream-7b", "arxiv"): 8.5,
}
CDF_POINTS = {("llada-8b", "sharegpt"): 6.5, ("dream-7b", "arxiv"): 8.5}  # Figure 10
HYBRID_BUDGETS = (1024, 4096)  # Figure 12
ROW_FIELDS = ("e2el", "prefill_queue", "decode_queue", "decode", "prefill", "transfer")
PARTS = ("e2el", "queue", "prefill_queue", "decode_queue", "prefill", "decode", "transfer")


def key(layout: str, model: str, trace: str, budget: int, qps: float, policy: str = "deficit") -> PointKey:
    return PointKey(layout, policy, model, trace, budget, qps)


def figure5() -> list[PointKey]:
    return [key(split, "llada-8b", "sharegpt", 1024, 6.5) for split in ("4P4D", "5P3D", "6P2D")]


def figure8() -> list[PointKey]:
    return [
        key("1C", "llada-8b", trace, 1024, q, policy)
        for trace in ("sharegpt", "arxiv")
        for policy in ("fastdllm", "deficit")
        for q in ONE_GPU_RATES
    ]


def figure9() -> list[PointKey]:
    return [key(layout, m, t, 1024, q) for m, t in PAIRS for layout in LAYOUTS for q in RATES[(m, t)]]


def figure10() -> list[PointKey]:
    return [key(layout, m, t, 1024, q) for (m, t), q in CDF_POINTS.items() for layout in LAYOUTS]


def figure11() -> list[PointKey]:
    return [key("8C", m, t, b, q) for m, t in PAIRS for b in BUDGETS for q in RATES[(m, t)]] + [
        key("8C", m, t, b, BREAKDOWN_QPS[(m, t)]) for m, t in PAIRS for b in BUDGETS
    ]


def figure12() -> list[PointKey]:
    rates = RATES[("llada-8b", "sharegpt")]
    return [key(layout, "llada-8b", "sharegpt", b, q) for layout in ("5P3C", "3P5C") for b in HYBRID_BUDGETS
            for q in rates]  # fmt: skip


FIGURES: dict[str, Callable[[], list[PointKey]]] = {
    "fig5": figure5,
    "fig8": figure8,
    "fig9": figure9,
    "fig10": figure10,
    "fig11": figure11,
    "fig12": figure12,
}
WITH_ROWS = ("fig5", "fig10")  # figures that plot per-request distributions


@dataclass(frozen=True, slots=True)
class Task:
    testbed: str  # a name or a file, loaded in the worker process
    key: PointKey
    num_requests: int
    seed: int
    keep_rows: bool


@dataclass(frozen=True, slots=True)
class PointOutcome:
    key: PointKey
    summary: dict[str, Any]
    rows: dict[str, list[float]] = field(default_factory=dict)  # per-request seconds by ROW_FIELDS


@functools.cache  # one runner per testbed per worker process: profiles load once
def _runner(testbed: str) -> PointRunner:
    return PointRunner(load_testbed(testbed))


def tail_request(rows: Sequence[dict[str, Any]], label: str, q: float) -> dict[str, float]:
    """The parts (ms) of the request whose e2e is nearest the run's `q`-th percentile (`label_<part>_ms`)."""
    target = percentile(sorted(r["e2el"] for r in rows), q)
    chosen = min(rows, key=lambda r: (abs(r["e2el"] - target), r["request_id"]))
    return {f"{label}_{part}_ms": 1000 * float(chosen[part]) for part in PARTS}


def run_task(task: Task) -> PointOutcome:
    """One point in this process."""
    result = _runner(task.testbed).run(task.key.config(task.num_requests, task.seed))
    rows = [request_row(r) for r in result.requests if r.finished]
    summary = dict(result.summary)
    summary.update(tail_request(rows, "tail", 99))
    summary.update(tail_request(rows, "middle", 50))
    kept = {name: [float(r[name]) for r in rows] for name in ROW_FIELDS} if task.keep_rows else {}
    return PointOutcome(task.key, summary, kept)


def tasks(
    testbed: str, figures: Iterable[str], extra: Iterable[PointKey], num_requests: int, seed: int
) -> list[Task]:
    """Every point once: the figures' and `extra` (the claims'), rows kept where a figure plots them."""
    keep: dict[PointKey, bool] = {}
    for name in figures:
        for point in FIGURES[name]():
            keep[point] = keep.get(point, False) or name in WITH_ROWS
    for point in extra:
        keep.setdefault(point, False)
    return [Task(testbed, point, num_requests, seed, rows) for point, rows in keep.items()]


def run_tasks(
    work: Sequence[Task], jobs: int, on_done: Callable[[int, int], None] | None = None
) -> dict[PointKey, PointOutcome]:
    """All tasks on `jobs` processes (1: in this one); `on_done(done, total)` after each."""
    out: dict[PointKey, PointOutcome] = {}
    if jobs <= 1:
        for i, task in enumerate(work, start=1):
            out[task.key] = run_task(task)
            if on_done:
                on_done(i, len(work))
        return out
    ordered = sorted(work, key=lambda t: -t.key.qps)  # the loaded 8-GPU points first: no long tail at the end
    # spawned, as sim.engines' pool: a forked worker would inherit this process's signal handlers and state
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for i, outcome in enumerate(pool.map(run_task, ordered), start=1):
            out[outcome.key] = outcome
            if on_done:
                on_done(i, len(work))
    return out


def figure_list(text: str) -> list[str]:
    """`fig8,fig9` or `8,9`: figures of `FIGURES` (an empty name, as in `8,,9` or ``, is refused)."""
    if not all(text.split(",")):
        raise argparse.ArgumentTypeError(f"an empty figure name in {text!r}")
    names = []
    for given in text.split(","):
        name = given.lower() if given.lower().startswith("fig") else f"fig{given}"  # FIG8 too
        if name not in FIGURES:
            raise argparse.ArgumentTypeError(f"no figure {given!r} (known: {', '.join(FIGURES)})")
        names.append(name)
    return names


@dataclass(frozen=True, slots=True)
class ReproduceOptions:
    """Where `sangam reproduce` writes and which figures it runs (its processes: `EngineOptions.jobs`)."""

    out: Path | None = option(
        None, "write the figures' PNGs, claims.csv and points.csv here", parse=nonempty_path, metavar="DIR",
        default_text="results/reproduce-TESTBED",
    )  # fmt: skip
    figures: tuple[str, ...] = option(
        tuple(FIGURES), "only these figures (and the paper's numbers they hold)", parse=figure_list,
        many=True, default_text="all: " + " ".join(FIGURES),
    )  # fmt: skip
