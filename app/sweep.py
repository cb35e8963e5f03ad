"""Layout-by-rate sweeps over the simulator, one process per point at a time (no Streamlit here).

A point is one `RunConfig` (layout, rate, seed, ...) plus the progress model and trace rows it runs on.
`run_point` simulates it in whatever process calls it and keeps what the charts need, small enough to
cache and to send between processes: the summary, the per-request rows and binned per-worker series.
`run_sweep` runs points in worker processes; its `compute` hook lets the app put a cache in front.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from typing import Any

from app.series import WorkerSeries, record_table, worker_series
from profiles.analytic import AnalyticCostModel
from profiles.store import Profile, default_cost_model
from profiles.testbeds import load_testbed, testbed_cost_model
from runs.config import CONTROL_MS, RunConfig, synthetic_rows, with_arrival_times
from runs.results import REQUEST_COLUMNS, request_row
from sangam.cost import CostModel
from sangam.hardware import lookup_gpu, lookup_model
from sangam.progress import parse_progress
from sangam.workload import TraceRow
from sim.cluster import LinkSpec
from sim.run import simulate

WORKERS = 2  # processes per sweep: the cores of the machine the explorer was sized on
THREADS = 64  # points handed out at once (a thread each, mostly waiting on the pool or the cache)
COSTS = ("profile", "analytic")  # as `sangam sim --cost`


@dataclass(frozen=True, slots=True)
class PointSpec:
    """One simulation: the config, the progress model spec ('' = the model and trace's default), for a
    trace file its rows (arrival times missing ones drawn at `cfg.qps`) and their digest, and which
    iteration-time model prices it (see `cost_model`)."""

    cfg: RunConfig
    progress: str = ""
    rows: tuple[TraceRow, ...] | None = None  # None: the synthetic trace `cfg.trace`
    trace_digest: str = ""  # names `rows` in `key`
    cost: str = "profile"  # one of COSTS
    testbed: str = ""  # a testbed prices the iterations ('': the profile of cfg.gpu, `sangam-<gpu>`'s)
    link: LinkSpec = LinkSpec()  # the KV link of disaggregated and hybrid layouts
    control_s: float = CONTROL_MS / 1000  # the control plane's delay on every dispatch

    @property
    def key(self) -> str:
        """Everything that decides the result, as text: the cache key."""
        config = self.cfg.resolved()  # its "layout" names the workers whichever way the mode was spelt
        link = [self.link.gb_per_s, self.link.latency_s]
        parts = [config, self.progress, self.trace_digest, self.cost, link, self.control_s]
        if self.testbed:
            parts.append(self.testbed)
        return json.dumps(parts, sort_keys=True, default=str)


@dataclass(frozen=True, slots=True)
class PointResult:
    layout: str  # the layout's name, e.g. 8C, 5P3D
    qps: float
    seed: int
    summary: dict[str, Any]  # runs.results.summarize, plus the resolved config
    requests: tuple[tuple[Any, ...], ...]  # one row per request, columns REQUEST_COLUMNS
    series: WorkerSeries
    sim_wall_s: float


@functools.cache  # once per process: loading a profile reads and hashes its data
def _priced(model: str, gpu: str, cost: str) -> tuple[CostModel, str, Profile | None]:
    if cost == "profile":
        return default_cost_model(model, gpu)
    return AnalyticCostModel(lookup_model(model), lookup_gpu(gpu)), "analytic", None


@functools.cache
def _on_testbed(testbed: str, model: str, cost: str) -> tuple[CostModel, str, Profile | None]:
    return testbed_cost_model(load_testbed(testbed), model, cost)


def cost_model(cfg: RunConfig, cost: str = "profile", testbed: str = "") -> tuple[CostModel, str]:
    """The iteration-time model `sangam sim --cost` picks for `cfg`, and its name: with 'profile', the
    measured (or derived) profile of the model on the GPU (on `testbed`'s, if given) where one exists,
    else the analytic model."""
    model, name, _ = _on_testbed(testbed, cfg.model, cost) if testbed else _priced(cfg.model, cfg.gpu, cost)
    return model, name


def profile_pages(model: str, gpu: str, cost: str = "profile", testbed: str = "") -> int | None:
    """KV pages per worker of the live worker a profile was measured on (None: from GPU memory), as
    `sangam sim` defaults them (on `testbed`, if given: its pages, else its profile's)."""
    if testbed:
        pages = load_testbed(testbed).pages(model)
        return pages if pages is not None else profile_pages_of(_on_testbed(testbed, model, cost)[2])
    return profile_pages_of(_priced(model, gpu, cost)[2])


def profile_pages_of(profile: Profile | None) -> int | None:
    return profile.kv_pages if profile is not None else None


def profile_label(model: str, gpu: str) -> str:
    """The GPU profile `--cost profile` prices `model` on `gpu` with, named by where it comes from (as
    `profiles.store` records it): 'h200 profile, measured', 'h100 profile, derived from h200', or, for a
    GPU without one, 'h100, no profile (analytic model)'."""
    source = _priced(model, gpu, "profile")[1]
    return f"{gpu}, no profile (analytic model)" if source == "analytic" else f"{gpu} profile, {source}"


def point_rows(spec: PointSpec) -> list[TraceRow]:
    """The requests of a point, with arrival times, as `sangam sim` builds them."""
    if spec.rows is None:
        return synthetic_rows(spec.cfg)
    return with_arrival_times(spec.cfg, spec.rows[: spec.cfg.num_requests])


def run_point(spec: PointSpec) -> PointResult:
    """Simulate one point in this process."""
    progress = parse_progress(spec.progress) if spec.progress else None
    cost, cost_name = cost_model(spec.cfg, spec.cost, spec.testbed)
    result = simulate(
        spec.cfg, point_rows(spec), cost, progress=progress, link=spec.link, control_s=spec.control_s
    )
    result.summary["cost_model"] = cost_name
    rows = [request_row(r) for r in result.requests]
    series = worker_series(record_table(result.requests), spec.cfg.layout.num_workers)
    return PointResult(
        layout=spec.cfg.layout.name,
        qps=spec.cfg.qps,
        seed=spec.cfg.seed,
        summary=result.summary,
        requests=tuple(tuple(row[c] for c in REQUEST_COLUMNS) for row in rows),
        series=series,
        sim_wall_s=result.wall_s,
    )


def point_specs(
    base: RunConfig,
    layouts: Iterable[str],
    rates: Iterable[float],
    seeds: Iterable[int],
    *,
    progress: str = "",
    rows: tuple[TraceRow, ...] | None = None,
    trace_digest: str = "",
    cost: str = "profile",
    testbed: str = "",
    link: LinkSpec = LinkSpec(),
    control_s: float = CONTROL_MS / 1000,
) -> list[PointSpec]:
    """Every (layout, rate, seed) combination of `base`, in that order."""
    return [
        PointSpec(
            replace(base, mode=mode, qps=qps, seed=seed),
            progress,
            rows,
            trace_digest,
            cost,
            testbed,
            link,
            control_s,
        )
        for mode in layouts
        for qps in rates
        for seed in seeds
    ]


def in_pool(spec: PointSpec, pool: Executor) -> PointResult:
    """Run one point in a worker process of `pool` and wait for it."""
    return pool.submit(run_point, spec).result()


Compute = Callable[[PointSpec, Executor], PointResult]


def run_sweep(
    specs: Sequence[PointSpec],
    *,
    workers: int = WORKERS,
    on_done: Callable[[int, int], None] | None = None,
    compute: Compute = in_pool,
) -> list[PointResult]:
    """Results of `specs`, in order, computed `workers` processes at a time.

    Each point is handed to `compute(spec, pool)` on its own thread, so a cache in `compute` answers at
    once and only misses reach the pool; `on_done(done, total)` runs in the caller's thread. The first
    failing point cancels the rest and its exception propagates.
    """
    results: list[PointResult | None] = [None] * len(specs)
    spawn = multiprocessing.get_context("spawn")  # no fork from a threaded server
    with (
        ProcessPoolExecutor(workers, mp_context=spawn) as pool,
        ThreadPoolExecutor(min(max(len(specs), 1), THREADS)) as threads,
    ):
        futures: dict[Future[PointResult], int] = {
            threads.submit(compute, spec, pool): i for i, spec in enumerate(specs)
        }
        try:
            for done, future in enumerate(as_completed(futures), start=1):
                results[futures[future]] = future.result()
                if on_done is not None:
                    on_done(done, len(specs))
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return [r for r in results if r is not None]
