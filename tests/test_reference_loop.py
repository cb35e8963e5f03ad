"""calib/reference_loop.py: the reference's worker loop, KV handoff and control delay as testbed terms, each
derived from the measurement files; the shipped reference testbeds carry exactly what they give."""

from __future__ import annotations

from pathlib import Path

import pytest

from calib import reference_loop as rl
from profiles.testbed import LoopEntry, Sourced
from profiles.testbeds import load_testbed


def test_the_report_fit_recovers_a_line_through_the_timers_medians() -> None:
    rows = [
        {"batch_size": b, "seq_len": s, "total_ms": 0.8 + 90e-6 * b * s}
        for b in (1, 8, 64)
        for s in (1024, 1536)
    ]
    a, c = rl.report_fit(rows)
    assert a == pytest.approx(0.8, rel=1e-9) and c == pytest.approx(90.0, rel=1e-9)


def test_the_rest_of_the_loop_is_a_line_in_the_items_beyond_the_report_fit() -> None:
    report = (0.75, 100.0)  # ms, ns per token
    points = [
        {"D": 8, "decodes": n, "n": 20, "beyond_gpu": 0.75 + 100e-6 * n * rl.LOOPS_SEQ + 1.0 + 0.2 * n}
        for n in (1, 4, 16, 64)
    ]
    # a point of too few iterations (a straggler between batch sizes) does not pull the line
    points.append({"D": 8, "decodes": 30, "n": rl.MIN_ITERATIONS - 1, "beyond_gpu": 99.0})
    a, b = rl.rest_fit(points, report)
    assert a == pytest.approx(1.0, rel=1e-9) and b == pytest.approx(0.2, rel=1e-9)


def test_the_control_delay_is_a_lone_blocks_gap_less_the_loops_last_iteration() -> None:
    loop = LoopEntry(*(Sourced(v, "a test") for v in (0.5, 1000.0, 0.25, 0.25)))
    # the loop of one item of LOOPS_SEQ tokens: 0.5 + 0.25 + 0.25 ms + 1 us per token
    last = 1.0 + rl.LOOPS_SEQ * 1e-3
    gaps = {
        "batch-B1-D8": {"gap": {"median": last + 1.0}},
        "batch-B1-D16": {"gap": {"median": last + 2.0}},
        "batch-B2-D8": {"gap": {"median": 500.0}},  # queued behind another request: not a lone block
    }
    got = rl.control_term(gaps, loop, "a test")
    assert got.value == pytest.approx(1.5) and "batch-B1-D8" in got.source
    with pytest.raises(ValueError, match="no lone-request phase"):
        rl.control_term({"batch-B2-D8": gaps["batch-B2-D8"]}, loop, "a test")


@pytest.fixture(scope="module")
def terms() -> rl.Terms:
    return rl.loop_terms()


def test_the_shipped_reference_testbeds_carry_the_measured_terms(terms: rl.Terms) -> None:
    for name in ("reference-h200", "reference-h100"):
        testbed = load_testbed(name)
        assert (testbed.loop, testbed.handoff_ms, testbed.control_ms, testbed.time_scales[rl.SCALED]) == (
            terms.loop,
            terms.handoff_ms,
            terms.control_ms,
            terms.scales,
        ), f"{name}: rerun python -m calib.reference_loop and re-ship it"
    for name in ("sangam-h100", "sangam-h200"):
        assert load_testbed(name).loop is None and load_testbed(name).handoff_ms is None


def test_the_shipped_reference_h200_predicts_its_held_out_replay() -> None:
    # the reference's own server at 0.5 and 1.5 QPS (benchmarks/h200_ref_replay.sh): no term is derived from
    # these runs; docs/calibration.md gives the figures (mean -8% and -3%)
    errors = rl.replay_errors(load_testbed("reference-h200"))
    assert set(errors) == {"qps0.5", "qps1.5"}
    for load, e in errors.items():
        assert e["requests"] == {"qps0.5": 30, "qps1.5": 60}[load]
        assert abs(e["sim_mean"] / e["live_mean"] - 1) < 0.10, (load, e)
        assert abs(e["sim_p99"] / e["live_p99"] - 1) < 0.10, (load, e)


def test_the_command_writes_a_new_version_and_checks_a_shipped_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mine.json"
    assert rl.main(["--testbed", "sangam-h200", "--out", str(out)]) == 0
    mine = load_testbed(str(out))
    assert mine.version == load_testbed("sangam-h200").version + 1 and mine.loop is not None
    assert rl.main(["--testbed", "reference-h200", "--check"]) == 0
    assert rl.main(["--testbed", "sangam-h200", "--check"]) == 1
    assert rl.main(["--testbed", "sangam-h200", "--name", "reference-h200", "--out", str(tmp_path)]) == 2
    assert "shipped testbed" in capsys.readouterr().err
