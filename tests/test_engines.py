"""The engines of `sangam sweep` and `sangam search`: Ray tasks give the local pool's tidy table byte for
byte (a local Ray instance on CPU), `--ray [ADDRESS]` parses, and a missing Ray or a worker running other
code is refused."""

from __future__ import annotations

import importlib.util
import io
import logging
import multiprocessing
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from cli.main import build_parser, main
from runs.config import RunConfig
from sim.engines import LOCAL_RAY, EngineOptions, LocalPool, RayTasks, _checked_point, runner, stop_workers
from sim.options import SimOptions
from sim.sweep import Point, code_version

GRID = ["--gpus", "2", "--layouts", "2C", "1P1C", "--num-requests", "20", "--cost", "analytic"]
HAS_RAY = importlib.util.find_spec("ray") is not None


def quiet(argv: list[str]) -> str:
    printed = io.StringIO()
    with redirect_stdout(printed):
        assert main(argv) == 0
    return printed.getvalue()


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    if not HAS_RAY:
        pytest.skip("ray is not installed (pip install 'sangam[ray]')")
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    yield
    ray.shutdown()


def test_ray_tasks_write_the_local_pools_table_byte_for_byte(local_ray: None, tmp_path: Path) -> None:
    sweep = ["sweep", *GRID, "--qps", "1", "4", "--seeds", "0", "1"]
    quiet([*sweep, "--jobs", "1", "--out", str(tmp_path / "local")])
    quiet([*sweep, "--ray", "--out", str(tmp_path / "ray")])
    local, ray = (tmp_path / name / "sweep.csv" for name in ("local", "ray"))
    assert len(local.read_text().splitlines()) == 1 + 8
    assert ray.read_bytes() == local.read_bytes()


def test_a_search_on_ray_answers_as_the_local_pool_does(local_ray: None, tmp_path: Path) -> None:
    search = ["search", *GRID, "--slo", "mean_e2el_s=3", "--granularity", "0.5"]
    quiet([*search, "--jobs", "2", "--out", str(tmp_path / "local.csv")])
    quiet([*search, "--ray", "--out", str(tmp_path / "ray.csv")])
    assert (tmp_path / "ray.csv").read_bytes() == (tmp_path / "local.csv").read_bytes()


def test_ray_flag_alone_means_a_local_instance_and_takes_an_address() -> None:
    parser = build_parser()
    base = ["sweep", "--out", "x"]
    assert parser.parse_args(base).ray is None
    assert parser.parse_args([*base, "--ray"]).ray == LOCAL_RAY
    assert parser.parse_args([*base, "--ray", "ray://head:10001"]).ray == "ray://head:10001"
    assert parser.parse_args(["search", "--ray", "--slo", "p99_e2el_s=3"]).ray == LOCAL_RAY


def test_the_option_picks_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen: list[object] = []
    monkeypatch.setattr("sim.engines.RayTasks", lambda address: chosen.append(("ray", address)))
    monkeypatch.setattr("sim.engines.LocalPool", lambda jobs: chosen.append(("pool", jobs)))
    runner(EngineOptions(jobs=3))
    runner(EngineOptions(ray="head:6379"))
    runner(EngineOptions())
    assert chosen == [("pool", 3), ("ray", "head:6379"), ("pool", os.cpu_count() or 1)]


def test_jobs_with_ray_is_a_one_line_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["sweep", *GRID, "--ray", "--jobs", "2", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sangam: error: --jobs is for the local pool") and err.count("\n") == 1
    assert not (tmp_path / "sweep.csv").exists()  # refused before any point ran


def test_without_ray_installed_ray_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(RuntimeError, match=r"sangam\[ray\]"):
        RayTasks(LOCAL_RAY)
    assert main(["sweep", *GRID, "--ray", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sangam: error: --ray needs Ray") and err.count("\n") == 1


def test_a_ray_worker_with_other_code_refuses_its_point() -> None:
    point = Point(RunConfig(num_requests=5, gpus=1), SimOptions(cost="analytic"))
    assert _checked_point(point, code_version())["completed"] == 5
    with pytest.raises(RuntimeError, match="install the same"):
        _checked_point(point, "not-this-code")


def test_the_pool_yields_every_point_once_and_keeps_its_processes_between_calls() -> None:
    points = [Point(RunConfig(num_requests=5, gpus=1, qps=q), SimOptions(cost="analytic")) for q in (1, 2, 3)]
    pool = LocalPool(2)
    results = dict(pool(points))
    assert sorted(results) == [0, 1, 2]
    assert [results[i]["config"]["qps"] for i in range(3)] == [1, 2, 3]
    processes = set(pool._pool._processes) if pool._pool is not None else set()  # type: ignore[attr-defined]
    assert dict(pool(points[:2])).keys() == {0, 1}
    assert pool._pool is not None and set(pool._pool._processes) == processes  # type: ignore[attr-defined]
    pool.close()
    assert pool._pool is None


def big_result() -> bytes:
    return bytes(256 << 20)  # 256 MiB: a while to send through the pool's pipe


def test_a_pool_stopped_while_it_reads_a_result_is_not_wedged() -> None:
    """A worker ended part-way through sending its result once left the pool's reader thread waiting for
    the rest for good (this process holds the pipe's write end too): the future never finished, and the
    interpreter could not exit (found by a review)."""
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    future = pool.submit(big_result)
    reader = pool._executor_manager_thread
    assert reader is not None and reader.ident is not None

    def reading() -> bool:  # part-way through a result
        stack = traceback.extract_stack(sys._current_frames()[reader.ident])  # type: ignore[index]
        return "_recv_bytes" in [frame.name for frame in stack]

    while not (reading() or future.done()):
        time.sleep(0.0005)
    assert not future.done(), "the result arrived before the stop: nothing was tested"
    stop_workers(pool)
    deadline = time.monotonic() + 60
    while (reader.is_alive() or not future.done()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert future.done() and not reader.is_alive()
    assert isinstance(future.exception(), BrokenProcessPool)


def test_closing_the_pool_ends_the_points_still_running() -> None:
    """A stopped sweep or search (Ctrl-C, SIGTERM, an explorer page rerun) loses its running points anyway:
    they are ended, not waited for (a point can take a minute of a core)."""
    quick = Point(RunConfig(num_requests=5, gpus=1), SimOptions(cost="analytic"))
    slow = Point(RunConfig(num_requests=200_000, gpus=1), SimOptions(cost="analytic"))
    pool = LocalPool(2)
    stream = pool([quick, slow, slow])
    assert next(stream)[0] == 0
    processes = list(pool._pool._processes.values()) if pool._pool is not None else []  # type: ignore[attr-defined]
    stream.close()
    pool.close()
    deadline = time.monotonic() + 60  # the pool's own thread may be the one that reaps them: until it has
    while any(p.exitcode is None for p in processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p.exitcode for p in processes] == [-signal.SIGTERM] * 2  # ended, not waited out (0)
