"""`sangam sweep`: the tidy table, the per-point cache (hits and resumption) and identical tables
whatever the number of jobs."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from cli.main import main
from sim.sweep import FIRST_COLUMNS, expand_layouts

GRID = ["--gpus", "2", "--layouts", "2C", "1P1C", "--num-requests", "20", "--cost", "analytic"]


def sweep(out: Path, *extra: str, qps: tuple[str, ...] = ("1", "4"), jobs: str = "1") -> tuple[int, int]:
    """Run a sweep into `out`; (points run, points from the cache) as it printed them."""
    import io
    from contextlib import redirect_stdout

    printed = io.StringIO()
    with redirect_stdout(printed):
        assert main(["sweep", *GRID, "--qps", *qps, "--jobs", jobs, "--out", str(out), *extra]) == 0
    m = re.search(r"(\d+) run, (\d+) from the cache", printed.getvalue())
    assert m, printed.getvalue()
    return int(m[1]), int(m[2])


def read(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sweep") / "one"
    assert sweep(out) == (4, 0)
    return out


def test_table_is_tidy_one_row_per_point_config_then_metrics(first: Path) -> None:
    rows = read(first / "sweep.csv")
    header = next(csv.reader((first / "sweep.csv").open()))
    assert tuple(header[: len(FIRST_COLUMNS)]) == FIRST_COLUMNS
    assert header.index("kv_pages") < header.index("completed") < header.index("p99_e2el_ms")
    assert "sim_wall_s" not in header  # differs run to run
    assert [(r["layout"], r["qps"]) for r in rows] == [("1P1C", "1.0"), ("1P1C", "4.0"), ("2C", "1.0"),
                                                       ("2C", "4.0")]  # fmt: skip
    assert {r["completed"] for r in rows} == {"20"} and {r["seed"] for r in rows} == {"0"}
    for layout in ("1P1C", "2C"):  # more load, more latency
        low, high = (r for r in rows if r["layout"] == layout)
        assert float(high["mean_e2el_ms"]) > float(low["mean_e2el_ms"]) > 0
    assert (first / "sweep.parquet").exists() == _has("pyarrow")
    for fmt in ("png", "pdf"):
        assert (first / f"latency-llada-8b-sharegpt.{fmt}").exists() == _has("matplotlib")


def test_a_repeated_sweep_runs_no_point_and_writes_the_same_table(first: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    assert sweep(again, "--cache", str(first / "cache")) == (0, 4)
    assert (again / "sweep.csv").read_bytes() == (first / "sweep.csv").read_bytes()


def test_an_interrupted_sweep_runs_only_the_missing_points(tmp_path: Path, first: Path) -> None:
    cache = tmp_path / "cache"
    assert sweep(tmp_path / "part", "--cache", str(cache), qps=("4",)) == (2, 0)  # half the points
    cut = sorted(cache.glob("*.json"))[0]  # a file an interruption left half written
    cut.write_text(cut.read_text()[:100])
    assert sweep(tmp_path / "all", "--cache", str(cache)) == (3, 1)
    assert (tmp_path / "all" / "sweep.csv").read_bytes() == (first / "sweep.csv").read_bytes()
    assert sweep(tmp_path / "all", "--cache", str(cache), "--budgets", "512") == (4, 0)  # a new config


def test_two_jobs_write_the_table_one_job_writes(first: Path, tmp_path: Path) -> None:
    assert sweep(tmp_path / "two", jobs="2") == (4, 0)
    assert (tmp_path / "two" / "sweep.csv").read_bytes() == (first / "sweep.csv").read_bytes()


def test_all_layouts_are_colocated_then_every_split() -> None:
    assert expand_layouts(["all"], 3) == ["3C", "1P2D", "2P1D", "1P2C", "2P1C"]
    assert expand_layouts(["colocated", "8c", "5p3c", "all"], 8)[:3] == ["8C", "5P3C", "1P7D"]
    assert len(expand_layouts(["all"], 8)) == 15


def test_bad_layout_is_a_one_line_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["sweep", "--layouts", "5X", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sangam: error:") and "5X" in err and err.count("\n") == 1


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_the_cache_key_is_the_resolved_config_and_the_code_version() -> None:
    import dataclasses

    from runs.config import RunConfig
    from sim.options import SimOptions
    from sim.sweep import Point

    point = Point(RunConfig(), SimOptions())
    assert point.key("v1") == Point(RunConfig(mode="colocated", gpus=8), SimOptions()).key("v1")
    others = [
        point.key("v2"),
        dataclasses.replace(point, config=RunConfig(theta=4096)).key("v1"),
        dataclasses.replace(point, sim=SimOptions(control_ms=0)).key("v1"),
        dataclasses.replace(point, progress="fixed:4").key("v1"),
    ]
    assert len({point.key("v1"), *others}) == 5


def test_a_sweep_models_its_testbed_and_time_scale_and_the_cache_tells_them_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from profiles.store import DATA

    cache = ("--cost", "profile", "--cache", str(tmp_path / "cache"))
    assert sweep(tmp_path / "ours", *cache, "--testbed", "sangam-h100") == (4, 0)
    assert sweep(tmp_path / "reference", *cache, "--testbed", "reference-h100") == (4, 0)
    assert sweep(tmp_path / "slow", *cache, "--time-scale", "1.5") == (4, 0)
    assert sweep(tmp_path / "default", *cache) == (0, 4)  # no --testbed: sangam-h100's points
    ours, reference, slow = (read(tmp_path / name / "sweep.csv") for name in ("ours", "reference", "slow"))
    assert (tmp_path / "default" / "sweep.csv").read_bytes() == (tmp_path / "ours" / "sweep.csv").read_bytes()
    assert {r["sim_testbed"] for r in ours} == {"sangam-h100"} == {r["sim_testbed"] for r in slow}
    assert {r["sim_testbed"] for r in reference} == {"reference-h100"}
    assert {(r["kv_pages"], r["arrival_clip"]) for r in reference} == {("5632", "3.0")}  # its own
    assert {r["sim_time_scale"] for r in ours} == {"1.0"} and {r["sim_time_scale"] for r in slow} == {"1.5"}
    for a, b, c in zip(ours, reference, slow, strict=True):
        assert (a["layout"], a["qps"]) == (b["layout"], b["qps"]) == (c["layout"], c["qps"])
        assert a["mean_e2el_ms"] != b["mean_e2el_ms"] and float(c["mean_e2el_ms"]) > float(a["mean_e2el_ms"])
    assert {r["cost_model"] for r in slow} == {"derived from h200, times 1.5"}
    run = tmp_path / "sim"  # a row is what sangam sim gives on the same testbed
    assert main(["sim", "--testbed", "reference-h100", "--mode", "2C", "--qps", "4", "-n", "20",
                 "--out", str(run)]) == 0  # fmt: skip
    (row,) = [r for r in reference if (r["layout"], r["qps"]) == ("2C", "4.0")]
    assert float(row["mean_e2el_ms"]) == json.loads((run / "summary.json").read_text())["mean_e2el_ms"]
    mine = tmp_path / "mine.json"  # a testbed file edited under the same name: its points run again
    raw = json.loads((DATA / "testbeds" / "sangam-h100.json").read_text()) | {"name": "mine"}
    for scale in (2.0, 3.0):
        raw["time_scales"] = {"llada-8b": {"decode": {"value": scale, "source": "a test"}}}
        mine.write_text(json.dumps(raw))
        assert sweep(tmp_path / f"mine-{scale:g}", *cache, "--testbed", str(mine)) == (4, 0)
    capsys.readouterr()
    assert main(["sweep", "--testbed", "reference-h100", "--gpu", "h200", "--out", str(tmp_path)]) == 2
    assert "models the h100, not --gpu h200" in capsys.readouterr().err


def test_the_code_version_hashes_sources_and_data_not_what_the_install_built(tmp_path: Path) -> None:
    from sim.sweep import SOURCES, code_version

    for package in SOURCES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "a.py").write_text("A = 1\n")
    (tmp_path / "profiles" / "data.json").write_text("{}")
    version = code_version.__wrapped__(tmp_path)  # (uncached: a process reads its own sources once)
    (tmp_path / "sim" / "a.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF built on this machine")
    (tmp_path / "runs").mkdir(exist_ok=True)
    (tmp_path / "runs" / "native.json").write_text('{"sim.a": "..."}')
    assert code_version.__wrapped__(tmp_path) == version
    (tmp_path / "profiles" / "data.json").write_text('{"b": 2}')
    assert code_version.__wrapped__(tmp_path) != version


def test_a_point_that_does_not_keep_up_is_flagged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One GPU serves about 1.8 requests/s: at 0.5 it keeps up, at 20 the number of requests in the
    system grows (served well below offered). sweep.csv says which in its steady column, and the printed
    table marks the point."""
    args = ["--gpus", "1", "--layouts", "1C", "-n", "200", "--cost", "analytic", "--qps", "0.5", "20"]
    assert main(["sweep", *args, "--jobs", "1", "--out", str(tmp_path)]) == 0
    rows = read(tmp_path / "sweep.csv")
    assert [(r["qps"], r["steady"]) for r in rows] == [("0.5", "True"), ("20.0", "False")]
    assert float(rows[1]["served_qps"]) < 0.2 * float(rows[1]["offered_qps"])
    printed = capsys.readouterr().out
    assert re.search(r"1C +20 +\S+ +\S+ +\S+ +NO \*", printed), printed
    assert "* 1 of 2 points did not reach a steady state" in printed


def test_the_table_names_each_fact_once(first: Path) -> None:
    from test_results import ALIASES

    header = next(csv.reader((first / "sweep.csv").open()))
    assert not set(header) & set(ALIASES), set(header) & set(ALIASES)
    assert len(header) == len(set(header))
    assert {"duration", "failed", "control_ms", "kv_pages", "layout"} <= set(header)


def test_sigterm_stops_a_pooled_sweep_like_ctrl_c_and_leaves_no_process(tmp_path: Path) -> None:
    """`kill -TERM` of `sangam sweep --jobs 2` while its pool runs: exit 143, 'terminated', the finished
    points kept, and no pool process left behind (they were orphaned before)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    args = ["sweep", "--gpus", "4", "--layouts", "all", "--qps", "2", "4", "-n", "6000", "--jobs", "2"]
    run = subprocess.Popen(
        [sys.executable, "-m", "cli.main", *args, "--out", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not any((tmp_path / "cache").glob("*")):  # the pool has finished a point
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()
        time.sleep(0.1)
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 143 and err.strip().splitlines()[-1] == "sangam: terminated", err
    deadline = time.monotonic() + 10
    while True:  # the whole process group is gone: the pool's workers with it
        try:
            os.killpg(run.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "a process of the sweep outlived it"
        time.sleep(0.1)
    assert any((tmp_path / "cache").glob("*"))
