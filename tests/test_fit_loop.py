"""`sangam fit --loop`: our worker loop's time between steps, from live iteration logs, as a testbed term."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calib.worker_loop import MIN_ITERATIONS, MIN_PER_COUNT, LoopFit, fit_loop, loop_samples
from cli.main import main
from profiles.store import DATA
from profiles.testbeds import load_testbed
from sim.setup import Resolver

COLUMNS = ("worker", "start", "end", "gpu_s", "items", "cycle_s")


def write_run(directory: Path, rows: list[tuple[float, float, str, float]], gpu: str = "h200") -> Path:
    """A live run's iterations.csv of (start, end, items, cycle_s) rows, and a summary.json naming `gpu`."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "iterations.csv").open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(COLUMNS)
        out.writerows((0, start, end, 0.001, items, cycle) for start, end, items, cycle in rows)
    (directory / "summary.json").write_text(json.dumps({"config": {"gpu": gpu}}))
    return directory


def items_of(decodes: int, prefills: int = 0) -> str:
    return ";".join(["p:512:512"] * prefills + ["d:32:600"] * decodes)


def exact_rows(a: float, b: float, cap: int = 99, n: int = 600) -> list[tuple[float, float, str, float]]:
    """Steps of 5 ms whose loop then takes exactly a + b * min(items, cap), items cycling 1..5 (one of the
    iterations of 1 a prefill)."""
    rows, now = [], 0.0
    for i in range(n):
        decodes = i % 6
        prefills = 1 if decodes == 0 else 0
        loop = a + b * min(decodes + prefills, cap)
        rows.append((now, now + 0.005, items_of(decodes, prefills), 0.005 + loop))
        now += 0.005 + loop
    return rows


@pytest.mark.parametrize(("a", "b", "cap"), [(1e-4, 2e-5, 5), (9e-5, 3e-5, 3), (1.5e-4, 0.0, 1)])
def test_the_fit_recovers_a_loop_of_known_cost_and_where_it_levels_off(
    tmp_path: Path, a: float, b: float, cap: int
) -> None:
    run = write_run(tmp_path / "run", exact_rows(a, b, cap))
    samples = loop_samples([run])
    assert {items for items, _ in samples} == {1, 2, 3, 4, 5}
    fit = fit_loop(samples)
    assert (fit.a, fit.b) == pytest.approx((a, b), rel=1e-6, abs=1e-12)
    assert fit.cap == cap or (b == 0 and fit.cap >= 1)  # a flat loop: any cap fits


def test_only_iterations_the_loop_went_straight_on_from_count(tmp_path: Path) -> None:
    rows = exact_rows(1e-4, 0.0)
    rows[5] = (*rows[5][:3], 0.0)  # the loop idled after it: no cycle
    rows[6] = (*rows[6][:2], "", 0.5)  # no items
    run = write_run(tmp_path / "run", rows)
    assert len(loop_samples([run])) == len(rows) - 2


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 64), st.floats(0.0, 1e-3)), min_size=MIN_ITERATIONS, max_size=400))
def test_a_fitted_loop_is_never_negative_nor_carried_past_the_counts_seen_often(
    samples: list[tuple[int, float]],
) -> None:
    fit = fit_loop(samples)
    often = [n for n in {n for n, _ in samples} if sum(m == n for m, _ in samples) >= MIN_PER_COUNT]
    assert fit.a >= 0 and fit.b >= 0
    assert fit.cap in {min(n for n, _ in samples), *often}


def test_too_few_iterations_and_a_run_without_a_log_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^--loop: 99 iterations .* 100 at least$"):
        fit_loop([(1, 1e-4)] * 99)
    with pytest.raises(ValueError, match=r"no iterations.csv \(run sangam live with --iteration-log\)$"):
        loop_samples([tmp_path])
    (tmp_path / "iterations.csv").write_text("worker,start,end,items\n0,1,2,d:32:40\n")
    with pytest.raises(ValueError, match=r"csv: not an iteration log with cycles \(no cycle_s column\)$"):
        loop_samples([tmp_path])
    write_run(tmp_path, [(0.0, 0.005, "d:32:x", 0.006)])
    with pytest.raises(ValueError, match=r"iterations.csv, line 2: not an iteration log row"):
        loop_samples([tmp_path])
    for start, end, cycle in [(0.0, 0.005, math.inf), (math.nan, 0.005, 0.006), (0.0, -5.0, 0.006)]:
        write_run(tmp_path, [(start, end, "d:32:40", cycle)])  # an Infinity loop was once fitted and written
        with pytest.raises(ValueError, match=r"line 2: not an iteration log row \(a step from "):
            loop_samples([tmp_path])
    (tmp_path / "iterations.csv").write_bytes(b"\xff\xfe start,end")
    with pytest.raises(ValueError, match=r"iterations.csv: not UTF-8 text$"):
        loop_samples([tmp_path])


def profiled(tmp_path: Path, directory: Path, name: str) -> Path:
    """A testbed (on sangam-h200) priced by the profile in `directory`, written under `tmp_path`."""
    out = tmp_path / f"{name}.json"
    assert main(["fit", "--profile", str(directory), "--testbed", "sangam-h200", "--out", str(out)]) == 0
    return out


def test_fit_loop_writes_a_testbed_whose_simulations_charge_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = profiled(tmp_path, DATA / "h200-fp8-kvfp8", "base")  # measured by sangam profile alone
    run, out = write_run(tmp_path / "run", exact_rows(2e-4, 5e-5, cap=4)), tmp_path / "looped.json"
    same = run / ".." / "run"  # the same run under another name: counted once
    assert main(["fit", "--loop", str(run), str(same), "--testbed", str(base), "--out", str(out)]) == 0
    label = "0.2 ms + 0.05 ms per item up to 4 + 0 ns per token per iteration"
    assert f"worker loop: {label}" in capsys.readouterr().out
    testbed = load_testbed(str(out))
    assert testbed.loop is not None and testbed.loop.other_ms.value == pytest.approx(0.2)
    assert testbed.loop_costs().items_cap == 4 and testbed.version == load_testbed(str(base)).version + 1
    assert (
        f"over 600 iterations the loop went straight on from ({run.resolve()})"
        in testbed.loop.other_ms.source
    )
    _, name, _ = Resolver(testbed).priced("llada-8b")
    assert name.endswith(f"plus a loop of {label}")
    again = ["fit", "--loop", str(run), "--testbed", str(out), "--out", str(tmp_path / "again.json")]
    assert main(again) == 2
    assert "already charges a worker loop" in capsys.readouterr().err
    other = write_run(tmp_path / "h100", exact_rows(2e-4, 5e-5), gpu="h100")
    assert main(["fit", "--loop", str(other), "--testbed", str(base), "--out", str(tmp_path / "x.json")]) == 2
    assert "a run on h100, not base's h200" in capsys.readouterr().err


def test_a_profile_refitted_from_live_logs_is_not_charged_the_loop_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A refit (`sangam profile --from-log`) prices each live iteration to the loop's next start: the
    shipped H200 profile of LLaDA-8B is one, so sangam-h200 itself is refused."""
    run = write_run(tmp_path / "run", exact_rows(2e-4, 5e-5))
    for base in ("sangam-h200", str(profiled(tmp_path, DATA / "h200", "refitted"))):
        assert main(["fit", "--loop", str(run), "--testbed", base, "--out", str(tmp_path / "x.json")]) == 2
        err = capsys.readouterr().err
        assert "profile of llada-8b" in err and "was refitted from live iteration logs" in err, err
    assert not (tmp_path / "x.json").exists()
    copy = tmp_path / "copy"
    shutil.copytree(DATA / "h200-fp8-kvfp8", copy)
    base = profiled(tmp_path, copy, "copied")
    meta = json.loads((copy / "llada-8b.meta.json").read_text())
    for pages in (-5, 1.5, "abc"):  # a testbed of them was once written, which no run could load
        (copy / "llada-8b.meta.json").write_text(json.dumps({**meta, "kv_pages": pages}))
        assert (
            main(
                ["fit", "--profile", str(copy), "--testbed", "sangam-h200", "--out", str(tmp_path / "y.json")]
            )
            == 2
        )
        assert (
            f"llada-8b.meta.json: kv_pages must be a positive whole number, got {pages!r}"
            in capsys.readouterr().err
        )
    (copy / "llada-8b.meta.json").write_text(json.dumps(meta))
    (copy / "dream-7b.meta.json").write_text("[1, 2")  # edited since
    assert main(["fit", "--loop", str(run), "--testbed", str(base), "--out", str(tmp_path / "x.json")]) == 2
    assert "dream-7b.meta.json: not a profile's metadata (JSON)" in capsys.readouterr().err


def test_a_loop_fit_is_what_the_simulator_charges() -> None:
    fit = LoopFit(1e-4, 2e-5, 3)
    assert fit.text() == "0.100 ms + 0.020 ms per item up to 3"
