"""`sangam search`: the SLO syntax, bracketing and bisection, the answer checked against `sangam sim`
on both sides of a knee, the ranking of several configurations, and bad input."""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path

import pytest

from cli.main import main
from runs.config import RunConfig
from sim.options import SimOptions
from sim.search import Bracket, SearchOptions, Slo, default_granularity, parse_slo, search
from sim.steady import resolution_bound
from sim.sweep import Cache, Point
from tests.factories import backlog_runner, fake_runner

SMALL = ["--num-requests", "60", "--cost", "analytic", "--jobs", "1"]


def test_slo_names_map_seconds_to_the_summarys_milliseconds() -> None:
    assert parse_slo("p99_e2el_s=20") == Slo("p99_e2el_ms", 20000.0, "p99_e2el_s=20")
    assert parse_slo("p50_queue_ms<=500").key == "median_queue_ms"
    assert parse_slo("mean_prefill_queue_s=0.5").key == "mean_prefill_queue_ms"
    assert parse_slo("overflow_rate=0.1") == Slo("overflow_rate", 0.1, "overflow_rate=0.1")


@pytest.mark.parametrize("start", [1, 17, 18, 40, 1000])
def test_bracketing_then_bisection_finds_the_last_passing_rate(start: int) -> None:
    bracket = Bracket(start, cap=10_000)
    while (rate := bracket.next()) is not None:
        bracket.record(rate, rate <= 17, {})
    assert (bracket.lo, bracket.hi) == (17, 18)
    assert len(bracket.probes) <= 2 * 11  # doubling, then halving: logarithmic


def test_a_rate_that_never_fails_stops_at_the_cap_and_says_so() -> None:
    bracket = Bracket(3, cap=50)
    while (rate := bracket.next()) is not None:
        bracket.record(rate, True, {})
    assert bracket.lo == 48 and bracket.capped


def test_a_probe_meets_the_slo_when_its_mean_over_the_seeds_does() -> None:
    """One seed's metric is the rate, the other's 3 s above it: the mean meets 2 s up to 0.5 QPS, while
    the first seed alone would meet it up to 2, the second at no rate."""

    def metric(cfg: RunConfig) -> float:
        return 1000 * (cfg.qps + (3 if cfg.seed == 1 else 0))

    slo = Slo("mean_e2el_ms", 2000.0, "mean_e2el_s=2")
    options = SearchOptions(granularity=0.1, start_qps=1.0)
    config = [Point(RunConfig(), SimOptions())]
    (both,) = search(config, [slo], [0, 1], fake_runner(metric), Cache(None), options)
    (first,) = search(config, [slo], [0], fake_runner(metric), Cache(None), options)
    (second,) = search(config, [slo], [1], fake_runner(metric), Cache(None), options)
    assert (both.max_qps, first.max_qps, second.max_qps) == (0.5, 2.0, 0.0)
    assert all(values["mean_e2el_s=2"] == 1000 * (q + 1.5) for q, _, values in both.probes)


def test_a_probe_that_meets_the_slo_but_does_not_keep_up_fails() -> None:
    """Latency meets the SLO at every rate (as in a run too short for a backlog to show), but above
    5 QPS the number of requests in the system grows: the answer is 5, the probes above it are marked
    ^, and the runs (500 requests, a resolution of 0.19 requests/s) are too short for a granularity of
    0.1 but not of 0.5."""

    slo = Slo("mean_e2el_ms", 2000.0, "mean_e2el_s=2")
    options = SearchOptions(granularity=0.5, start_qps=1.0)
    (answer,) = search(
        [Point(RunConfig(), SimOptions())], [slo], [0], backlog_runner(5.0), Cache(None), options
    )
    assert answer.max_qps == 5.0 and not answer.capped
    assert answer.marks() == "1+ 2+ 4+ 8^ 6^ 5+ 5.5^"
    assert answer.steadiness is not None and answer.steadiness.growth_qps == 0.0
    assert answer.too_short(0.5) is None and answer.too_short(0.1) == 1800  # 500 x (0.186 / 0.1)^2


def test_the_answer_does_not_depend_on_the_run_length(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """8 colocated GPUs under p99_e2el_s=20 found 20.5 QPS in runs of 500 requests and 12.5 in runs of
    4000 (granularity 0.5): a short run ends before an overloaded system's backlog, and with it its
    latency, has grown. Probes that do not keep up fail now, and the answers at 500, 2000 and 4000
    requests agree within the granularity plus each one's resolution; the short runs say they are."""
    answers = {}
    for n in (500, 2000, 4000):
        out = tmp_path / f"{n}.csv"
        args = [
            "--gpus",
            "8",
            "--layouts",
            "8C",
            "-n",
            str(n),
            "--slo",
            "p99_e2el_s=20",
            "--granularity",
            "1",
        ]
        assert main(["search", *args, "--start-qps", "8", "--jobs", "1", "--out", str(out)]) == 0
        (answers[n],) = csv.DictReader(out.open())
    printed = capsys.readouterr().out
    found = {n: float(a["max_qps_under_slo"]) for n, a in answers.items()}
    for a, b in itertools.combinations(answers, 2):
        spread = 1 + float(answers[a]["resolution_qps"]) + float(answers[b]["resolution_qps"])
        assert abs(found[a] - found[b]) <= spread, (found, answers)
    assert answers[500]["requests_needed"] and "too short to tell" in printed


def test_the_answer_meets_the_slo_in_sangam_sim_and_one_step_above_does_not(tmp_path: Path) -> None:
    out = tmp_path / "search.json"
    slo = ["--slo", "mean_e2el_s=3", "--slo", "p99_e2el_s=60", "--granularity", "0.1"]
    assert main(["search", "--layouts", "1C", *SMALL, *slo, "--out", str(out)]) == 0
    (answer,) = json.loads(out.read_text())
    found = answer["max_qps_under_slo"]
    assert 1.0 < found < 2.0 and not answer["capped"]  # 1C serves about 1.8 requests/s at most

    def mean_e2el_s(qps: float) -> float:
        run = tmp_path / f"sim-{qps:g}"
        assert main(["sim", "--mode", "1C", "--qps", f"{qps:g}", *SMALL[:4], "--out", str(run)]) == 0
        return float(json.loads((run / "summary.json").read_text())["mean_e2el_ms"]) / 1000

    assert mean_e2el_s(found) <= 3 < mean_e2el_s(round(found + 0.1, 10))


@pytest.mark.parametrize(
    ("gpus", "requests", "start", "expected"),
    [
        (8, 4000, None, 1.0),
        (2, 4000, None, 0.2),
        (8, 4000, 1.0, 0.1),
        (8, 500, None, 2.0),
        (8, 10, None, 10.0),
    ],
)
def test_the_default_granularity_is_the_resolution_bound_at_the_start_rate_rounded_up(
    gpus: int, requests: int, start: float | None, expected: float
) -> None:
    configs = [Point(RunConfig(gpus=gpus, mode="colocated", num_requests=requests), SimOptions())]
    found = default_granularity(SearchOptions(start_qps=start), configs)
    bound = resolution_bound(start or gpus, max(requests, 40))
    assert found == expected and bound <= found < 2.5 * bound


def test_a_default_search_resolves_its_granularity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's search at its defaults (4000 requests) on 8 colocated GPUs: its runs resolve the
    default granularity, so it does not say they are too short (at 0.1 QPS it did, every time)."""
    out = tmp_path / "search.csv"
    assert main(["search", "--gpus", "8", "--layouts", "8C", "--slo", "p99_e2el_s=20", "--jobs", "1",
                 "--out", str(out)]) == 0  # fmt: skip
    (answer,) = csv.DictReader(out.open())
    assert "too short to tell" not in capsys.readouterr().out and answer["requests_needed"] == ""
    assert float(answer["resolution_qps"]) <= 1.0 and float(answer["max_qps_under_slo"]).is_integer()


def test_several_configurations_are_ranked_and_the_best_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "search.csv"
    args = ["--gpus", "2", "--layouts", "1C", "2C", "--slo", "mean_e2el_s=3", "--granularity", "0.5"]
    cache = ["--cache", str(tmp_path / "cache")]
    assert main(["search", *args, *SMALL, *cache, "--seeds", "0", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = list(csv.DictReader(out.open()))
    assert [r["layout"] for r in rows] == ["2C", "1C"] and [r["rank"] for r in rows] == ["1", "2"]
    assert float(rows[0]["max_qps_under_slo"]) > float(rows[1]["max_qps_under_slo"]) > 0
    assert "best: 2C" in printed
    assert main(["search", *args, *SMALL, *cache, "--seeds", "0", "1", "--out", str(out)]) == 0
    assert "0 points run" in capsys.readouterr().out  # every probe from the cache


def test_a_search_models_its_testbed_and_time_scale(tmp_path: Path) -> None:
    args = ["search", "--layouts", "1C", *SMALL, "--slo", "mean_e2el_s=3", "--granularity", "0.1",
            "--cache", str(tmp_path / "cache")]  # fmt: skip
    answers = {}
    for name, extra in (
        ("ours", []),
        ("slow", ["--time-scale", "2"]),
        ("ref", ["--testbed", "reference-h100"]),
    ):
        out = tmp_path / f"{name}.csv"
        assert main([*args, *extra, "--out", str(out)]) == 0
        (answers[name],) = csv.DictReader(out.open())
    assert [answers[n]["testbed"] for n in ("ours", "slow", "ref")] == ["sangam-h100"] * 2 + [
        "reference-h100"
    ]
    assert (answers["ours"]["time_scale"], answers["slow"]["time_scale"]) == ("1.0", "2.0")
    ours, slow = (float(answers[n]["max_qps_under_slo"]) for n in ("ours", "slow"))
    assert slow < 0.75 * ours  # twice as slow an executor: about half the capacity
    assert (
        answers["ref"]["probes"] != answers["ours"]["probes"]
    )  # its own pages and arrivals, not the cache's


@pytest.mark.parametrize(
    "bad",
    [
        ["--slo", "nonsense"],
        ["--slo", "p99_latency_s=3"],
        ["--slo", "p99_e2el_s=fast"],
        ["--slo", "p99_e2el_s=3", "--granularity", "0"],
        ["--slo", "p99_e2el_s=3", "--granularity", "-0.1"],
        [],
    ],
)
def test_bad_input_is_one_line_and_status_2(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "--layouts", "1C", *SMALL, *bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sangam: error:") and err.count("\n") == 1 and "Traceback" not in err


def test_the_first_probe_is_one_qps_per_gpu_unless_given() -> None:
    configs = [Point(RunConfig(mode=mode), SimOptions()) for mode in ("1C", "4C", "3P5C")]
    slo = Slo("mean_e2el_ms", 2000.0, "mean_e2el_s=2")
    firsts = [a.probes[0][0] for a in search(configs, [slo], [0], fake_runner(lambda c: 0.0), Cache(None),
                                             SearchOptions(max_qps=10))]  # fmt: skip
    assert sorted(firsts) == [1.0, 4.0, 8.0]
    given = search(configs, [slo], [0], fake_runner(lambda c: 0.0), Cache(None), SearchOptions(start_qps=3))
    assert [a.probes[0][0] for a in given] == [3.0, 3.0, 3.0]


def test_an_out_without_csv_or_json_is_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "search"
    assert main(["search", "--layouts", "1C", *SMALL, "--slo", "mean_e2el_s=3", "--granularity", "0.5",
                 "--out", f"{out}/"]) == 0  # fmt: skip
    rows = list(csv.DictReader((out / "search.csv").open()))
    assert [r["layout"] for r in rows] == ["1C"]
    assert f"wrote {out / 'search.csv'}" in capsys.readouterr().out
    nested = tmp_path / "a" / "b" / "ranking.json"  # a file's missing directories are made
    assert main(["search", "--layouts", "1C", *SMALL, "--slo", "mean_e2el_s=3", "--granularity", "0.5",
                 "--out", str(nested)]) == 0  # fmt: skip
    assert json.loads(nested.read_text())[0]["layout"] == "1C"
