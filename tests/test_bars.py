"""Progress: the drivers' watchers hear every point and request once, in order; the bars are drawn only
on a terminal, on stderr, and leave what a script reads unchanged."""

from __future__ import annotations

import io
import itertools
from pathlib import Path

import pytest

from cli.bars import bar, wanted
from cli.main import main
from runs.config import RunConfig, RunFiles, workload_points
from runs.tally import Tally
from sim.options import SimOptions
from sim.points import run_points
from sim.search import SearchOptions, Slo, search
from sim.sweep import Cache, Point, evaluate
from tests.factories import fake_runner

GRID = ["--gpus", "2", "--layouts", "2C", "1P1C", "--num-requests", "20", "--cost", "analytic", "--jobs", "1"]


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_bars_only_on_a_terminal_that_is_not_dumb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm")
    assert wanted(Terminal()) and not wanted(io.StringIO())
    monkeypatch.setenv("TERM", "dumb")
    assert not wanted(Terminal())


def test_no_terminal_no_watcher_and_nothing_written() -> None:
    stream = io.StringIO()
    with bar("sweep", "points", stream) as watch:
        assert watch is None
    assert stream.getvalue() == ""


def test_a_terminal_gets_a_bar_with_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm")
    stream = Terminal()
    with bar("sweep", "points", stream) as watch:
        assert watch is not None
        watch(Tally(3, 8, "half way"))
        watch(Tally(8, 8))
    assert "sweep" in stream.getvalue()


SEARCH = ["search", *GRID, "--slo", "mean_e2el_s=3", "--granularity", "1"]


@pytest.mark.parametrize("command", [["sweep", *GRID, "--qps", "1", "4"], SEARCH])
def test_on_a_terminal_stdout_and_files_are_unchanged_and_the_bar_goes_to_stderr(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TERM", "xterm")
    out = "--out"

    def run(name: str) -> tuple[str, str, bytes]:
        target = tmp_path / (name if command[0] == "sweep" else f"{name}.csv")
        assert main([*command, out, str(target)]) == 0
        printed = capsys.readouterr()
        table = target / "sweep.csv" if command[0] == "sweep" else target
        return printed.out.replace(str(target), "OUT"), printed.err, table.read_bytes()

    piped = run("piped")
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    on_terminal = run("terminal")
    assert piped[1] == "" and terminal.getvalue() != ""  # a bar was drawn, only on the terminal
    assert _without_wall_time(on_terminal[0]) == _without_wall_time(piped[0])
    assert on_terminal[2] == piped[2]


def _without_wall_time(text: str) -> str:
    import re

    return re.sub(r"\(\d+\.\d s\)", "(T s)", text)


def test_evaluate_tells_the_cached_points_first_then_one_tally_per_point(tmp_path: Path) -> None:
    points = [Point(RunConfig(qps=q), SimOptions()) for q in (1, 2, 3, 4)]
    cache = Cache(tmp_path)
    evaluate(points[:1], fake_runner(lambda cfg: cfg.qps), cache)
    heard: list[Tally] = []
    evaluate(points, fake_runner(lambda cfg: cfg.qps), cache, watch=heard.append)
    assert heard == [Tally(1, 4), Tally(2, 4), Tally(3, 4), Tally(4, 4)]


def test_a_search_tells_every_point_once_and_ends_at_its_total(tmp_path: Path) -> None:
    configs = [Point(RunConfig(), SimOptions()), Point(RunConfig(budget=512), SimOptions())]
    heard: list[Tally] = []
    knee = {1024: 7.3, 512: 3.1}
    runner = fake_runner(lambda cfg: 1000 * cfg.qps / knee[cfg.budget])  # meets 1 s up to the knee
    slo = Slo("mean_e2el_ms", 1000.0, "mean_e2el_s=1")
    options = SearchOptions(granularity=0.1)
    answers = search(configs, [slo], [0, 1], runner, Cache(None), options, watch=heard.append)
    assert [a.max_qps for a in answers] == [7.3, 3.1]
    points = 2 * sum(len(a.probes) for a in answers)
    steps = [b.done - a.done for a, b in itertools.pairwise(heard)]
    assert set(steps) == {0, 1}  # one point at a time (0: a round starts, its estimate updated)
    assert steps.count(1) == points
    assert heard[-1] == Tally(points, points, "2/2 answered")
    assert all(t.total is not None and t.done <= t.total for t in heard)


def test_simulate_tells_each_request_as_it_ends_across_points() -> None:
    base = RunConfig(num_requests=30, gpus=2, mode="1P1C")
    points = workload_points(base, [2.0, 5.0])
    from profiles.analytic import AnalyticCostModel
    from sangam.hardware import lookup_gpu, lookup_model

    cost = AnalyticCostModel(lookup_model(base.model), lookup_gpu(base.gpu))
    heard: list[Tally] = []
    run_points(points, cost, "analytic", SimOptions(), RunFiles(), heard.append)
    done = [t.done for t in heard]
    assert done == sorted(done) and done[0] == 0 and done[-1] == 60 and 30 in done
    assert len(set(done)) > 30 and {t.total for t in heard} == {60}  # told as they end (some end together)


def test_sim_over_several_points_draws_on_a_terminal_and_prints_the_same_table(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TERM", "xterm")
    argv = ["sim", "--mode", "2C", "--qps", "1", "3", "--num-requests", "30", "--cost", "analytic"]
    assert main(argv) == 0
    piped = capsys.readouterr()
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main(argv) == 0
    assert capsys.readouterr().out == piped.out and piped.err == ""
    assert "sim" in terminal.getvalue()
