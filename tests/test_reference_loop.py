"""calib/reference_loop.py: the reference's worker loop, KV handoff and control delay as testbed terms, each
derived from the measurement files; the shipped reference testbeds carry exactly what they give."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calib import reference_loop as rl
from profiles.testbeds import load_testbed


def test_the_report_fit_recovers_a_line_through_the_timers_medians() -> None:
    rows = [
        {"batch_size": b, "seq_len": s, "total_ms": 0.8 + 90e-6 * b * s}
        for b in (1, 8, 64)
        for s in (1024, 1536)
    ]
    a, c = rl.report_fit(rows)
    assert a == pytest.approx(0.8, rel=1e-9) and c == pytest.approx(90.0, rel=1e-9)


def test_a_path_measured_on_a_slow_machine_is_put_in_the_h200_hosts_time(tmp_path: Path) -> None:
    rows = [{"batch_size": b, "seq_len": 1000, "total_ms": 1.0 + 1e-3 * b * 1000} for b in (1, 2, 4)]
    # on the H200 host a one-request report of 1000 tokens takes 1 + 1 = 2 ms; here it took 6 ms
    summary = {
        "meta": {"mean_seq_len": 1000.0},
        "per_block_ms": {"prefill_report_rpc": {"median": 6.0}, "prefill_end_to_kv_send": {"median": 9.0}},
    }
    (tmp_path / rl.LOW_LOAD).mkdir()
    (tmp_path / rl.LOW_LOAD / "summary.json").write_text(json.dumps(summary))
    got = rl.host_path_ms(tmp_path, rows, "prefill_end_to_kv_send", "a test")
    assert got.value == pytest.approx(3.0) and "median 9.00 ms there" in got.source


@pytest.fixture(scope="module")
def terms() -> rl.Terms:
    return rl.loop_terms()


def test_the_shipped_reference_testbeds_carry_the_measured_terms(terms: rl.Terms) -> None:
    for name in ("reference-h200", "reference-h100"):
        testbed = load_testbed(name)
        assert (testbed.loop, testbed.handoff_ms, testbed.control_ms) == (
            terms.loop,
            terms.handoff_ms,
            terms.control_ms,
        ), f"{name}: rerun python -m calib.reference_loop and re-ship it"
    for name in ("sangam-h100", "sangam-h200"):
        assert load_testbed(name).loop is None and load_testbed(name).handoff_ms is None


def test_the_loop_leaves_nothing_of_the_replay_over_its_alone_requests(terms: rl.Terms) -> None:
    per_forward, n, forwards = rl.forward_residual_ms(load_testbed("reference-h200"), rl.REPLAY)
    assert abs(per_forward) < 1e-6 and (n, forwards) == (15, 696)
    assert terms.loop.other_ms.value == pytest.approx(3.54, abs=0.01)  # docs/calibration.md's figure


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
