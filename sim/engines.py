"""Where a sweep's points run: a local process pool, or Ray tasks on a Ray cluster, behind one interface.

A `Runner` takes points and yields `(index, summary)` as each finishes, in any order. A point's summary
depends only on the point and the code (`sim.sweep.run_point`), so every engine gives the same summaries
and the tidy table, sorted by configuration, is the same byte for byte whichever ran it. A Ray worker
whose sources differ from the driver's (`code_version`) refuses its point instead of answering for other
code.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from sangam.args import positive_int
from sangam.options import option
from sim.sweep import Point, Runner, code_version, run_point

LOCAL_RAY = "local"  # `--ray` without an address: start a local Ray instance (or join RAY_ADDRESS's)


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """Which engine runs the points of `sangam sweep` and `sangam search`."""

    jobs: int = option(
        os.cpu_count() or 1, "simulations run at once, in a local process pool (1: in this process)",
        parse=positive_int, aliases=("-j",), default_text="the number of cores",
    )  # fmt: skip
    ray: str | None = option(
        None, "run the points as Ray tasks on the Ray cluster at ADDRESS (ray://host:10001, host:6379); "
        "alone: a local Ray instance, or the cluster RAY_ADDRESS names (needs sangam[ray])",
        metavar="ADDRESS", bare=LOCAL_RAY, default_text="the local process pool of --jobs",
    )  # fmt: skip


def runner(options: EngineOptions) -> Runner:
    """The engine the options choose: Ray if `--ray` was given, else the local pool."""
    return ray_runner(options.ray) if options.ray is not None else pool_runner(options.jobs)


def pool_runner(jobs: int) -> Runner:
    """Run points `jobs` at a time in fresh processes (spawned: no state of this one leaks in), or in
    this process with one job; yields (index, summary) as each finishes."""

    def run(points: Sequence[Point]) -> Iterator[tuple[int, dict[str, Any]]]:
        if jobs == 1 or len(points) <= 1:
            for i, point in enumerate(points):
                yield i, run_point(point)
            return
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(min(jobs, len(points)), mp_context=context) as pool:
            futures: dict[Future[dict[str, Any]], int] = {
                pool.submit(run_point, p): i for i, p in enumerate(points)
            }
            pending = set(futures)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=futures.__getitem__):
                    yield futures[future], future.result()

    return run


def ray_runner(address: str) -> Runner:
    """Run every point as one Ray task (one CPU each) on the cluster at `address` (`LOCAL_RAY`: a local
    instance, or RAY_ADDRESS's cluster); joins the Ray instance this process has already started, if any.
    Yields (index, summary) as each finishes."""
    try:
        import ray
    except ImportError:
        raise RuntimeError("--ray needs Ray: pip install 'sangam[ray]'") from None

    def run(points: Sequence[Point]) -> Iterator[tuple[int, dict[str, Any]]]:
        if not points:
            return
        if not ray.is_initialized():
            ray.init(address=None if address == LOCAL_RAY else address, logging_level=logging.WARNING)
        task = ray.remote(num_cpus=1)(_checked_point)
        code = code_version()
        refs = {task.remote(point, code): i for i, point in enumerate(points)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                yield refs[ref], ray.get(ref)

    return run


def _checked_point(point: Point, code: str) -> dict[str, Any]:
    """`run_point` on a Ray worker, refused where its sources are not the driver's."""
    mine = code_version()
    if mine != code:
        raise RuntimeError(f"this Ray worker runs sangam code {mine}, the driver {code}: install the same")
    return run_point(point)
