"""`sangam fit --loop`: our worker loop's time between steps, from live iteration logs, as a testbed term."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calib.worker_loop import MIN_ITERATIONS, fit_loop, loop_samples
from cli.main import main
from profiles.testbeds import load_testbed
from sim.setup import Resolver

COLUMNS = ("worker", "start", "end", "gpu_s", "items", "cycle_s")


def write_log(directory: Path, rows: list[tuple[float, float, str, float]]) -> Path:
    """An iterations.csv of (start, end, items, cycle_s) rows."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "iterations.csv").open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(COLUMNS)
        out.writerows((0, start, end, 0.001, items, cycle) for start, end, items, cycle in rows)
    return directory


def items_of(decodes: int, prefills: int = 0) -> str:
    return ";".join(["p:512:512"] * prefills + ["d:32:600"] * decodes)


def exact_rows(a: float, b: float, n: int = 120) -> list[tuple[float, float, str, float]]:
    """Steps of 5 ms whose loop then takes exactly a + b * items, items cycling 1..4 (one a prefill)."""
    rows, now = [], 0.0
    for i in range(n):
        decodes, prefills = i % 4, 1 if i % 4 == 0 else 0
        items = decodes + prefills
        rows.append((now, now + 0.005, items_of(decodes, prefills), 0.005 + a + b * items))
        now += 0.005 + a + b * items
    return rows


def test_the_fit_recovers_a_loop_of_known_cost(tmp_path: Path) -> None:
    run = write_log(tmp_path / "run", exact_rows(1e-4, 2e-5))
    samples = loop_samples([run])
    assert {items for items, _ in samples} == {1, 2, 3}
    assert fit_loop(samples) == pytest.approx((1e-4, 2e-5), rel=1e-6)


def test_only_iterations_the_loop_went_straight_on_from_count(tmp_path: Path) -> None:
    rows = exact_rows(1e-4, 0.0)
    rows[5] = (*rows[5][:3], 0.0)  # the loop idled after it: no cycle
    rows[6] = (*rows[6][:2], "", 0.5)  # no items
    run = write_log(tmp_path / "run", rows)
    assert len(loop_samples([run])) == len(rows) - 2


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 64), st.floats(0.0, 1e-3)), min_size=MIN_ITERATIONS, max_size=300))
def test_a_fitted_loop_is_never_negative_or_an_error_says_so(samples: list[tuple[int, float]]) -> None:
    try:
        a, b = fit_loop(samples)
    except ValueError as err:
        assert "is negative" in str(err)
    else:
        assert a >= 0 and b >= 0


def test_too_few_iterations_and_a_run_without_a_log_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^--loop: 99 iterations .* 100 at least$"):
        fit_loop([(1, 1e-4)] * 99)
    with pytest.raises(ValueError, match=r"no iterations.csv \(run sangam live with --iteration-log\)$"):
        loop_samples([tmp_path])
    (tmp_path / "iterations.csv").write_text("worker,start,end,items\n0,1,2,d:32:40\n")
    with pytest.raises(
        ValueError, match=r"iterations.csv: not an iteration log with cycles \(no cycle_s column\)$"
    ):
        loop_samples([tmp_path])
    write_log(tmp_path, [(0.0, 0.005, "d:32:x", 0.006)])
    with pytest.raises(ValueError, match=r"iterations.csv, line 2: not an iteration log row"):
        loop_samples([tmp_path])


def test_fit_loop_writes_a_testbed_whose_simulations_charge_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run, out = write_log(tmp_path / "run", exact_rows(2e-4, 5e-5)), tmp_path / "looped.json"
    assert main(["fit", "--loop", str(run), "--testbed", "sangam-h200", "--out", str(out)]) == 0
    assert "worker loop: 0.2 ms + 0.05 ms per item + 0 ns per token per iteration" in capsys.readouterr().out
    testbed = load_testbed(str(out))
    assert testbed.loop is not None and testbed.loop.other_ms.value == pytest.approx(0.2)
    assert (
        str(run.resolve()) in testbed.loop.other_ms.source
        and testbed.version == load_testbed("sangam-h200").version + 1
    )
    _, name, _ = Resolver(testbed).priced("llada-8b")
    assert name.endswith("plus a loop of 0.2 ms + 0.05 ms per item + 0 ns per token per iteration")
    assert (
        main(["fit", "--loop", str(run), "--testbed", str(out), "--out", str(tmp_path / "again.json")]) == 2
    )
    assert "already charges a worker loop" in capsys.readouterr().err
