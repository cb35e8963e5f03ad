"""The figures' house style (`runs.plotting`): a style per series that never repeats within a figure,
latency axes that saturated series do not set, and every figure written as a PNG and a PDF."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("matplotlib")

from runs.plotting import (
    DISTINCT,
    DPI,
    REACH,
    cap_latency,
    figure,
    house_style,
    latency_top,
    line,
    save,
    styles,
)


@given(st.integers(1, DISTINCT))
def test_no_two_series_of_a_figure_share_a_style_and_neighbours_differ_in_all_three(n: int) -> None:
    drawn = styles(n)
    assert len(set(drawn)) == n
    for a, b in itertools.pairwise(drawn):
        assert a.color != b.color and a.marker != b.marker and a.linestyle != b.linestyle


def test_more_series_than_distinct_styles_are_refused() -> None:
    with pytest.raises(ValueError, match=f"at most {DISTINCT}"):
        styles(DISTINCT + 1)


@given(
    base=st.floats(0.01, 1e4),
    spread=st.lists(st.floats(1.0, REACH), min_size=1, max_size=60),
    excess=st.lists(st.floats(1.001, 1e3), max_size=20),
)
def test_saturated_points_do_not_set_the_latency_axis(
    base: float, spread: list[float], excess: list[float]
) -> None:
    """Points within a factor REACH of each other all stay on the axis; points beyond REACH times the
    largest of them, fewer than a quarter of all, never set it."""
    ordinary = [base * s for s in spread]
    saturated = [REACH * max(ordinary) * e for e in excess[: (len(ordinary) - 1) // 3]]
    assert latency_top(ordinary + saturated) == max(ordinary)
    assert latency_top(saturated + ordinary) == max(ordinary)


def test_a_saturated_series_lies_in_a_band_above_the_axes_it_shares_and_does_not_set() -> None:
    rates = [4.0, 6.0, 8.0, 10.0]
    ordinary = [[1.0 + 0.1 * i + 0.2 * r for r in rates] for i in range(5)]
    saturated = [21.0, 50.0, 90.0, 165.0]
    with house_style():
        fig = figure(6, 3)
        left, right = fig.subplots(1, 2)
        drawn = styles(7)
        for i, ys in enumerate(ordinary):
            line(left, rates, ys, drawn[i], f"layout {i}")
        line(right, rates, [2.0, 2.5, 3.0, 3.5], drawn[5], "another")
        line(right, rates, saturated, drawn[6], "saturated")
        assert cap_latency([left, right]) == [right]
    top = max(max(ys) for ys in ordinary)
    for ax in (left, right):
        low, high = ax.get_ylim()
        assert low < 1.8 and top < high < min(saturated) / 3  # the saturated series would flatten the rest
    band = right.get_lines()[-1]  # the saturated points, drawn in the band in their own marker
    assert list(band.get_xdata()) == rates and band.get_marker() == drawn[6].marker
    assert all(top < y < right.get_ylim()[1] for y in band.get_ydata())


def test_an_axis_without_saturated_points_shows_them_all() -> None:
    with house_style():
        ax = figure(3, 3).subplots()
        line(ax, [1.0, 2.0, 3.0], [2.0, 4.0, 5.9], styles(1)[0], "one")
        assert cap_latency([ax]) == []
    low, high = ax.get_ylim()
    assert low < 2.0 and high > 5.9 and len(ax.get_lines()) == 1


def test_a_figure_is_a_png_at_the_house_dpi_and_a_pdf_with_embeddable_fonts(tmp_path: Path) -> None:
    from PIL import Image

    with house_style():
        fig = figure(3, 2)
        ax = fig.subplots()
        line(ax, [1.0, 2.0], [1.0, 2.0], styles(1)[0], "one")
        ax.set_title("a title")
        paths = save(fig, tmp_path / "fig")
    assert paths == [tmp_path / "fig.png", tmp_path / "fig.pdf"]
    with Image.open(paths[0]) as png:
        assert png.size == (3 * DPI, 2 * DPI) and DPI >= 200
    pdf = paths[1].read_bytes()
    assert pdf.startswith(b"%PDF") and b"/FontFile2" in pdf and b"/Type3" not in pdf  # TrueType, not Type 3


def test_a_sweep_with_more_lines_than_styles_draws_no_figure_and_says_why(tmp_path: Path) -> None:
    from sim.sweep import expand_layouts, plot_latency

    layouts = expand_layouts(["all"], 8)  # 15 layouts
    rows = [
        {"model": "llada-8b", "trace": "sharegpt", "layout": layout, "budget": budget, "theta": 8192,
         "qps": qps, "mean_e2el_ms": 1000.0, "p99_e2el_ms": 3000.0}
        for layout in layouts for budget in range(1, 18) for qps in (4.0, 8.0)
    ]  # fmt: skip
    plots = plot_latency(rows, tmp_path)
    assert plots.paths == [] and not list(tmp_path.iterdir())
    assert plots.skipped == [f"no figure of llada-8b on sharegpt: 255 lines, more than {DISTINCT} styles"]
    few = [r for r in rows if r["budget"] <= 2]  # 30 lines
    assert [p.name for p in plot_latency(few, tmp_path).paths] == [
        "latency-llada-8b-sharegpt.png",
        "latency-llada-8b-sharegpt.pdf",
    ]
