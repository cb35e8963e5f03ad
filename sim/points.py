"""`sangam sim`'s run: every point of a workload through the simulator, results written as asked."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from runs.config import RunConfig, RunFiles, load_progress
from runs.outdir import point_dirs
from runs.results import ITERATION_COLUMNS, write_csv, write_results
from runs.tally import Tally, Watcher
from sangam.cost import CostModel
from sangam.workload import TraceRow
from sim.options import SimOptions
from sim.run import SimResult, simulate


def run_points(
    points: Sequence[tuple[RunConfig, list[TraceRow]]],
    cost: CostModel,
    cost_name: str,
    options: SimOptions,
    files: RunFiles,
    watch: Watcher | None = None,
) -> list[SimResult]:
    """Simulate each (config, rows) point; write its results under `files.out` and its iteration log.
    `watch` hears the requests simulated of all the points' as each ends."""
    progress = load_progress(files.progress)
    link = options.link_spec()
    failures = options.failures()
    if options.restart_after is not None and not failures:
        raise ValueError("--restart-after needs --fail")
    rates = [cfg.qps for cfg, _ in points]
    dirs = point_dirs(files.out, rates) if files.out else []
    results = []
    total, before = sum(len(rows) for _, rows in points), 0
    for i, (cfg, rows) in enumerate(points):
        on_request = None
        if watch is not None:
            on_request = _offset(watch, before, total)
            watch(Tally(before, total))
        result = simulate(
            cfg,
            rows,
            cost,
            progress=progress,
            link=link,
            control_s=options.control_ms / 1000,
            log_iterations=bool(files.iteration_log),
            failures=failures,
            restart_after_s=options.restart_after,
            on_request=on_request,
        )
        before += len(rows)
        result.summary.update(
            cost_model=cost_name,
            kv_link=options.kv_link(),
            control_ms=options.control_ms,
            testbed=options.testbed,
        )
        results.append(result)
        if dirs:
            write_results(dirs[i], result.requests, result.summary)
        if files.iteration_log and result.iterations is not None:
            log = files.iteration_log
            path = log.with_name(f"{log.stem}-qps{cfg.qps:g}{log.suffix}") if len(points) > 1 else log
            write_csv(path, ITERATION_COLUMNS, result.iterations)
    return results


def _offset(watch: Watcher, before: int, total: int) -> Callable[[int], None]:
    return lambda ended: watch(Tally(before + ended, total))
