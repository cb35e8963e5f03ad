"""Layout-by-rate sweeps over the simulator, one process per point at a time (no Streamlit here).

A point is one `RunConfig` (layout, rate, seed, ...) resolved on its testbed (`sim.setup.Resolver`), plus
the progress model, trace rows and simulator options it runs with: plain data, which a worker process
prices with its own resolver of the testbed. `run_point` simulates it in whatever process calls it and
keeps what the charts need, small enough to cache and to send between processes: the summary, each
request's latencies and binned per-worker series. `run_sweep` runs points in worker processes; its `compute`
hook lets the app put a cache in front.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import multiprocessing
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from app.series import WorkerSeries, record_table, worker_series
from profiles.testbeds import choose_testbed, load_testbed
from runs.config import RunConfig, synthetic_rows, with_arrival_times
from runs.results import request_row
from sangam.progress import parse_progress
from sangam.workload import TraceRow
from sim.engines import stop_workers
from sim.options import SimOptions
from sim.run import simulate
from sim.setup import Resolver, Setup

WORKERS = 2  # processes per sweep: the cores of the machine the explorer was sized on
THREADS = 64  # points handed out at once (a thread each, mostly waiting on the pool or the cache)
COSTS = ("profile", "analytic")  # as `sangam sim --cost`
LATENCY_COLUMNS = ("e2el", "queue", "decode")  # seconds per request that the CDFs draw


@dataclass(frozen=True, slots=True)
class PointSpec:
    """One simulation: the config, the progress model spec ('' = the model and trace's default), for a
    trace file its rows (arrival times missing ones drawn at `cfg.qps`) and their digest, and the
    simulator's options: the testbed whose profile prices it (None: `sangam-<gpu>`), `--cost`, the KV
    link and the control delay."""

    cfg: RunConfig
    progress: str = ""
    rows: tuple[TraceRow, ...] | None = None  # None: the synthetic trace `cfg.trace`
    trace_digest: str = ""  # names `rows` in `key`
    options: SimOptions = SimOptions()

    @property
    def key(self) -> str:
        """Everything that decides the result, as text: the cache key."""
        config = self.cfg.resolved()  # its "layout" names the workers whichever way the mode was spelt
        parts = [config, self.progress, self.trace_digest, dataclasses.asdict(self.options)]
        return json.dumps(parts, sort_keys=True, default=str)


@dataclass(frozen=True, slots=True, eq=False)  # an array field: no elementwise ==
class PointResult:
    layout: str  # the layout's name, e.g. 8C, 5P3D
    qps: float
    seed: int
    summary: dict[str, Any]  # runs.results.summarize, plus the resolved config
    # one row per request, columns LATENCY_COLUMNS: a whole request row per request took ~20x the memory
    # (25 MB for a point of 50,000 requests, and the page's cache holds 400 points)
    latencies: np.ndarray
    series: WorkerSeries
    sim_wall_s: float


@functools.cache  # once per process: loading a profile reads and hashes its data
def resolver(testbed: str | None, gpu: str, cost: str = "profile", time_scale: float = 1.0) -> Resolver:
    """The resolver of runs on `testbed` (None: `sangam-<gpu>`) priced by `cost` (one of COSTS)."""
    bed = load_testbed(testbed) if testbed else choose_testbed(None, gpu)
    return Resolver(bed, {"cost": cost, "time_scale": time_scale})


def resolve(
    base: RunConfig,
    cost: str = "profile",
    testbed: str | None = None,
    given: dict[str, Any] | None = None,
    progress: str | None = None,
) -> Setup:
    """`base` as `sangam sim --cost cost --testbed testbed` resolves it (`sim.setup.Resolver.resolve`)."""
    return resolver(testbed, base.gpu, cost).resolve(base, given, progress)


def profile_label(model: str, gpu: str) -> str:
    """The GPU profile `--cost profile` prices `model` on `gpu` with, named by where it comes from (as
    `profiles.store` records it): 'h200 profile, measured', 'h100 profile, derived from h200'."""
    return f"{gpu} profile, {resolver(None, gpu).priced(model)[1]}"


def point_rows(spec: PointSpec) -> list[TraceRow]:
    """The requests of a point, with arrival times, as `sangam sim` builds them."""
    if spec.rows is None:
        return synthetic_rows(spec.cfg)
    return with_arrival_times(spec.cfg, spec.rows[: spec.cfg.num_requests])


def run_point(spec: PointSpec) -> PointResult:
    """Simulate one point in this process."""
    progress = parse_progress(spec.progress) if spec.progress else None
    options = spec.options
    priced = resolver(options.testbed, spec.cfg.gpu, options.cost, options.time_scale)
    cost, cost_name, _ = priced.priced(spec.cfg.model)
    result = simulate(
        spec.cfg,
        point_rows(spec),
        cost,
        progress=progress,
        link=options.link_spec(),
        control_s=options.control_ms / 1000,
    )
    result.summary["cost_model"] = cost_name
    rows = [request_row(r) for r in result.requests]
    latencies = np.array([[row[c] for c in LATENCY_COLUMNS] for row in rows], dtype=float)
    series = worker_series(record_table(result.requests), spec.cfg.layout.num_workers)
    return PointResult(
        layout=spec.cfg.layout.name,
        qps=spec.cfg.qps,
        seed=spec.cfg.seed,
        summary=result.summary,
        latencies=latencies.reshape(len(rows), len(LATENCY_COLUMNS)),
        series=series,
        sim_wall_s=result.wall_s,
    )


def point_specs(
    setup: Setup,
    layouts: Iterable[str],
    rates: Iterable[float],
    seeds: Iterable[int],
    *,
    rows: tuple[TraceRow, ...] | None = None,
    trace_digest: str = "",
) -> list[PointSpec]:
    """Every (layout, rate, seed) combination of the resolved `setup`, in that order."""
    config, progress, options = setup.config, setup.progress, setup.options
    return [
        PointSpec(replace(config, mode=mode, qps=qps, seed=seed), progress, rows, trace_digest, options)
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
        except BaseException:  # a failed point, or Streamlit stopping the run: its points end now
            stop_workers(pool)
            raise
    return [r for r in results if r is not None]
