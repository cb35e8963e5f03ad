"""Run one configuration through the simulated cluster."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from runs.build import build
from runs.config import CONTROL_MS, RunConfig, build_requests
from runs.results import RecoveryCounts, request_row, summarize
from sangam.cost import CostModel
from sangam.faults import Failure
from sangam.progress import ProgressModel
from sangam.request import Request
from sangam.router import Router
from sangam.workload import TraceRow
from sim.cluster import Cluster, ClusterConfig, LinkSpec
from sim.early_stop import EarlyStop, Exceeds


@dataclass(frozen=True, slots=True)
class SimResult:
    config: RunConfig
    requests: list[Request]
    summary: dict[str, Any]
    iterations: list[tuple[Any, ...]] | None  # rows of the iteration log, if asked for
    num_iterations: int
    wall_s: float


def simulate(
    cfg: RunConfig,
    rows: Sequence[TraceRow],
    cost: CostModel,
    *,
    progress: ProgressModel | None = None,
    link: LinkSpec = LinkSpec(),
    control_s: float = CONTROL_MS / 1000,
    log_iterations: bool = False,
    failures: Sequence[Failure] = (),
    restart_after_s: float | None = None,
    on_request: Callable[[int], None] | None = None,
    stop: Sequence[Exceeds] = (),
) -> SimResult:
    """Simulate `rows` (with arrival times) under `cfg`; every request runs to completion, or ends
    with ERROR (`Request.error`) where failures leave the layout unable to serve it.

    `control_s`: the control plane's delay on every dispatch (default: as measured live).
    `failures`: workers lost at given times (`sangam.faults.parse_failures`); if `restart_after_s` is
    given, each is restarted under the live launcher's back-off (`sangam.restarts`) and comes back empty
    `restart_after_s` after its restart starts, else never.
    `on_request`: told how many requests have ended so far, each time some have (a progress bar).
    `stop`: end the run as soon as one of these limits is certain to be exceeded (`sim.early_stop`); the
    summary of such a run covers the requests ended by then, and adds `stopped_at_s` and `lower_bounds`
    (each limit's summary key -> the bound, ms).
    """
    started = time.perf_counter()
    requests = build_requests(cfg, rows, progress)
    cluster_config = ClusterConfig(
        layout=cfg.layout,
        batch=cfg.batch_config(),
        prefill_batch=cfg.prefill_batch_config(),
        theta=cfg.theta,
        pages=cfg.kv_pages,
        kv_bytes_per_token=cfg.kv_bytes_per_token,
        link=link,
        control_s=control_s,
    )
    router = Router(cfg.layout, cfg.kv_pages, cfg.rng("router"), cfg.theta, policy=cfg.policy)
    log: list[tuple[Any, ...]] | None = [] if log_iterations else None
    early = EarlyStop(stop, requests) if stop else None
    cluster = Cluster(
        cluster_config, cost, router, log, failures=failures, restart_after_s=restart_after_s,
        on_request=on_request, stop=early.ended if early is not None else None,
    )  # fmt: skip
    cluster.run(requests)
    recovery = RecoveryCounts(
        router.workers_lost, router.requests_recovered, router.forwards_redone, router.requests_failed
    )
    done = [request_row(r) for r in requests if r.finished]
    summary = summarize(done, cfg.kv_bytes_per_token, recovery)
    wall = time.perf_counter() - started
    if early is not None and cluster.stopped_at is not None:
        summary.update(stopped_at_s=cluster.stopped_at, lower_bounds=early.bounds)
    summary.update(sim_wall_s=wall, sim_iterations=cluster.iterations, build=build(), config=cfg.resolved())
    return SimResult(cfg, requests, summary, log, cluster.iterations, wall)
