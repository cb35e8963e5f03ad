"""Where a sweep's points run: a local process pool, or Ray tasks on a Ray cluster, behind one interface.

An engine (`Engine`, a `sim.sweep.Runner`) takes points and yields `(index, summary)` as each finishes,
in any order. A point's summary depends only on the point and the code (`sim.sweep.run_point`), so every
engine gives the same summaries and the tidy table, sorted by configuration, is the same byte for byte
whichever ran it. A Ray worker
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
from typing import Any, Protocol

from runs.args import positive_int
from runs.options import option
from sim.sweep import Point, code_version, run_point

STOP_S = 5.0  # a stopped worker's time to end on SIGTERM before it is killed
LOCAL_RAY = "local"  # `--ray` without an address: start a local Ray instance (or join RAY_ADDRESS's)


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """Which engine runs the points of `sangam sweep` and `sangam search`."""

    jobs: int | None = option(
        None, "simulations run at once, in a local process pool (1: in this process)",
        parse=positive_int, aliases=("-j",), default_text="the number of cores",
    )  # fmt: skip
    ray: str | None = option(
        None, "run the points as Ray tasks on the Ray cluster at ADDRESS (ray://host:10001, host:6379); "
        "alone: a local Ray instance, or the cluster RAY_ADDRESS names (needs sangam[ray])",
        metavar="ADDRESS", bare=LOCAL_RAY, default_text="the local process pool of --jobs",
    )  # fmt: skip


class Engine(Protocol):
    """A `Runner` that holds resources (processes, a Ray connection) until `close`."""

    def __call__(self, points: Sequence[Point]) -> Iterator[tuple[int, dict[str, Any]]]: ...

    def close(self) -> None: ...


def runner(options: EngineOptions) -> Engine:
    """The engine the options choose: Ray if `--ray` was given, else the local pool; ValueError for both."""
    if options.ray is None:
        return LocalPool(local_jobs(options))
    if options.jobs is not None:
        raise ValueError("--jobs is for the local pool: with --ray, the Ray cluster's CPUs set how many run")
    return RayTasks(options.ray)


def local_jobs(options: EngineOptions) -> int:
    """How many processes the local pool runs: `--jobs`, else one per core."""
    return options.jobs or os.cpu_count() or 1


class LocalPool:
    """Run points `jobs` at a time in spawned processes (no state of this one leaks in), started on the
    first call and kept until `close`, so a search's rounds reuse them; with one job (or one point) in
    this process. Yields (index, summary) as each finishes."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self._pool: ProcessPoolExecutor | None = None

    def __call__(self, points: Sequence[Point]) -> Iterator[tuple[int, dict[str, Any]]]:
        if self.jobs == 1 or len(points) <= 1:
            for i, point in enumerate(points):
                yield i, run_point(point)
            return
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("spawn"))
        futures: dict[Future[dict[str, Any]], int] = {
            self._pool.submit(run_point, p): i for i, p in enumerate(points)
        }
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=futures.__getitem__):
                    yield futures[future], future.result()
        finally:
            for future in pending:  # a point failed, or the caller stopped early: run no more
                future.cancel()

    def close(self) -> None:
        if self._pool is not None:
            stop_workers(self._pool)
            self._pool = None


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """Shut `pool` down at once: points not started are cancelled, and those running are ended, not waited
    for (a stopped sweep loses them anyway, and one point can take a minute of a core that other work is
    waiting for: a stopped search, or an explorer page whose run a user replaced). Python 3.14 has this as
    `ProcessPoolExecutor.terminate_workers`, without the end of file below."""
    processes = list((pool._processes or {}).values())  # shutdown forgets them; None once shut down
    results = pool._result_queue
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(STOP_S)
        if process.is_alive():  # one that inherited SIGTERM ignored
            process.kill()
            process.join()
    if results is not None:  # None: shut down before
        # a worker ended part-way through sending a result leaves the pool's reader waiting for the rest on
        # a pipe whose write end this process holds too: closing it is the end of file that frees the reader
        results._writer.close()  # type: ignore[attr-defined]


class RayTasks:
    """Run every point as one Ray task (one CPU each) on the cluster at `address` (`LOCAL_RAY`: a local
    instance, or RAY_ADDRESS's cluster); joins the Ray instance this process has already started, if
    any. Yields (index, summary) as each finishes."""

    def __init__(self, address: str) -> None:
        try:
            import ray
        except ImportError:
            raise RuntimeError("--ray needs Ray: pip install 'sangam[ray]'") from None
        self.address = address
        self._ray = ray

    def __call__(self, points: Sequence[Point]) -> Iterator[tuple[int, dict[str, Any]]]:
        ray = self._ray
        if not points:
            return
        if not ray.is_initialized():
            ray.init(
                address=None if self.address == LOCAL_RAY else self.address, logging_level=logging.WARNING
            )
        task = ray.remote(num_cpus=1)(_checked_point)
        code = code_version()
        refs = {task.remote(point, code): i for i, point in enumerate(points)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                yield refs[ref], ray.get(ref)

    def close(self) -> None:
        """Ray is left running for this process (a later engine joins it); it stops at exit."""


def _checked_point(point: Point, code: str) -> dict[str, Any]:
    """`run_point` on a Ray worker, refused where its sources are not the driver's."""
    mine = code_version()
    if mine != code:
        raise RuntimeError(f"this Ray worker runs sangam code {mine}, the driver {code}: install the same")
    return run_point(point)
