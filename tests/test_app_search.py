"""The explorer's search page through Streamlit's AppTest: a small search ranked and drawn with its CSVs,
the same answers as `sangam search`, and bad input answered with a message in the page."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from app.capacity import Capacity, CapacityQuery, probes_frame, ranking_frame, run_query
from app.search_page import probes_figure
from cli.main import main
from runs.config import RunConfig
from sim.options import SimOptions
from sim.search import MARKS, SearchOptions, Slo, legend, search
from sim.sweep import Cache, Point
from tests.factories import backlog_runner

PAGE = """
if __name__ == "__main__":  # the search's spawned workers re-import this script
    from app.search_page import main

    main()
"""
SMALL = {
    "s_gpus": 2,
    "s_layouts": "2C, 1C",
    "s_requests": 60,
    "s_slos": "mean_e2el_s=3",
    "s_granularity": 0.5,
}


def search_page(**values: Any) -> AppTest:
    at = AppTest.from_string(PAGE, default_timeout=120)
    at.run()
    assert not at.exception
    at.selectbox(key="s_cost").set_value("analytic")
    for key, value in values.items():
        kind = "text_input" if isinstance(value, str) else "number_input"
        getattr(at, kind)(key=key).set_value(value)
    at.button[0].click().run()
    return at


def test_a_search_is_ranked_and_drawn_with_its_csvs() -> None:
    at = search_page(**SMALL)
    assert not at.exception and not at.error
    assert len(at.get("plotly_chart")) == 2  # the answers, the probes of the one SLO
    assert [b.proto.label for b in at.get("download_button")] == [
        "Download max_qps_under_slo.csv", "Download probes_0.csv"
    ]  # fmt: skip
    table = at.dataframe[0].value
    assert list(table["layout"]) == ["2C", "1C"] and list(table["rank"]) == [1, 2]
    assert table["max_qps_under_slo"].iloc[0] > table["max_qps_under_slo"].iloc[1] > 0
    assert at.metric[0].value == "2C τ1024 θ8192"
    assert any(legend() in caption.value for caption in at.caption)  # the marks' legend


def test_probes_that_did_not_keep_up_are_marked_as_sangam_search_marks_them() -> None:
    """Latency meets the SLO at every rate, but above 5 QPS the backlog grows: the page's ranking,
    probes table and chart mark those probes ^ (as `sangam search` prints them), not -, with a key."""
    slo = Slo("mean_e2el_ms", 2000.0, "mean_e2el_s=2")
    options = SearchOptions(granularity=0.5, start_qps=1.0)
    answers = search(
        [Point(RunConfig(), SimOptions())], [slo], [0], backlog_runner(5.0), Cache(None), options
    )
    capacity = Capacity(CapacityQuery(), (slo,), tuple(answers), 0.5)
    assert list(ranking_frame(capacity)["probes"]) == ["1+ 2+ 4+ 8^ 6^ 5+ 5.5^"]
    probes = probes_frame(capacity)
    assert list(zip(probes["qps"], probes["mark"], strict=True)) == [
        (1.0, "+"), (2.0, "+"), (4.0, "+"), (5.0, "+"), (5.5, "^"), (6.0, "^"), (8.0, "^")
    ]  # fmt: skip
    figure = probes_figure(capacity, 0)
    assert list(figure.data[0].marker.symbol) == ["circle"] * 4 + ["triangle-up"] * 3
    assert all(meaning in figure.layout.title.text for meaning in MARKS.values())


@pytest.mark.parametrize(("given", "used"), [(0.5, 0.5), (None, 2.0)])
def test_the_page_answers_as_sangam_search_does(tmp_path: Path, given: float | None, used: float) -> None:
    """With a precision given, and without: then both use the one their runs resolve."""
    query = CapacityQuery(gpus=2, layouts="2C 1P1C", num_requests=30, slos="mean_e2el_s=3, p99_e2el_s=8",
                          granularity=given, seeds="0, 1", cost="analytic")  # fmt: skip
    capacity = run_query(query)
    assert capacity.granularity == used
    out = tmp_path / "search.csv"
    argv = ["search", "--gpus", "2", "--layouts", "2C", "1P1C", "--num-requests", "30", "--cost", "analytic",
            "--slo", "mean_e2el_s=3", "--slo", "p99_e2el_s=8", "--seeds", "0", "1", "--jobs", "1",
            "--out", str(out)]  # fmt: skip
    assert main(argv + ([] if given is None else ["--granularity", str(given)])) == 0
    cli = list(csv.DictReader(out.open()))
    page = ranking_frame(capacity)
    assert [(r["layout"], float(r["max_qps_under_slo"]), r["probes"]) for r in cli] == list(
        zip(page["layout"], page["max_qps_under_slo"], page["probes"], strict=True)
    )
    probes = probes_frame(capacity)
    assert len(probes) == sum(len(a.probes) for a in capacity.answers)
    met = probes[probes["met"]]
    assert (met["mean_e2el_s=3"] <= 3).all() and (met["p99_e2el_s=8"] <= 8).all()  # seconds, as written


def test_values_apart_by_spaces_are_several_values() -> None:
    """τ '512 1024' and seeds '1 2 3' are two and three values, as layouts apart by spaces are (they once
    ran into τ 5121024 and seed 123)."""
    from app.capacity import parse_query

    _, grid, _ = parse_query(
        CapacityQuery(layouts="2C 1P1C", budgets="512 1024", thetas="8192; 4096", seeds="1 2,3")
    )
    assert (grid.layouts, grid.budgets, grid.thetas, grid.seeds) == (
        ("2C", "1P1C"),
        (512, 1024),
        (8192, 4096),
        (1, 2, 3),
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"s_slos": "p99_latency_s=3"}, "unknown SLO metric"),
        ({"s_slos": ""}, "at least one"),
        ({"s_layouts": "5X"}, "layouts"),
        ({"s_budgets": "big"}, "τ"),
        ({"s_thetas": "99999999999999999999999"}, "θ: expected a positive integer up to 2147483647"),
        ({"s_start": 8.0, "s_max": 4.0}, "start QPS"),
        ({"s_seeds": "1 x"}, "seeds: seeds are whole numbers, got 'x'"),
        ({"s_gpus": 256, "s_layouts": "all"}, "511 layouts x 1 τ x 1 θ x 1 seed is 511 runs a probe"),
        (
            {"s_gpus": 8, "s_layouts": "all", "s_seeds": "0 1", "s_requests": 50_000},
            "15 layouts x 1 τ x 1 θ x 2 seeds of 50,000 requests is too many for one probe",
        ),
        ({"s_max": 1e11, "s_granularity": 0.01}, "max QPS 1e+11 is over 1e+12 steps of the precision 0.01"),
    ],
)
def test_bad_input_is_a_message_in_the_page(values: dict[str, Any], message: str) -> None:
    at = search_page(**{**SMALL, **values})
    assert not at.exception
    assert (
        len(at.error) == 1 and message in at.error[0].value and "Cannot run this search" in at.error[0].value
    )
