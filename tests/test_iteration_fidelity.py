"""`benchmarks.iteration_fidelity` over the shipped FP8 live run, against the profile named by --profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import iteration_fidelity

RESULTS = Path(__file__).parent.parent / "benchmarks/results"
FP8_RUN = RESULTS / "live-colocated-fp8-llada-8b-h200-11/seed13/live-qps1.84"


def rows(out: str) -> dict[str, list[str]]:
    """Each kind's columns (n, live ms, step ms, GPU ms, profile ms, error, time %) from the printed table."""
    split = [
        line.split() for line in out.splitlines() if line.startswith(("  decode x", "  mixed", "  prefill"))
    ]
    return {" ".join(words[:-7]): words[-7:] for words in split}


def test_profile_picks_the_profile_the_live_iterations_are_compared_with(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/executor-performance.md's figures (the tenth round): the FP8 profile prices the FP8 run's single
    decodes 1.7% over their time (the bf16 one 14.9%), its mixed iterations 1.4% under, its decodes of 5+
    items 5.0% under."""
    iteration_fidelity.main([str(FP8_RUN), "--profile", "h200-fp8-kvfp8"])
    fp8 = rows(capsys.readouterr().out)
    iteration_fidelity.main([str(FP8_RUN)])
    bf16 = rows(capsys.readouterr().out)
    assert fp8["decode x1"][:2] == bf16["decode x1"][:2] == ["1405", "5.33"]  # the same live iterations
    assert (fp8["decode x1"][-2], bf16["decode x1"][-2]) == ("+1.7%", "+14.9%")
    assert (fp8["mixed"][-2], fp8["decode x5+"][-2]) == ("-1.4%", "-5.0%")


def test_the_live_time_splits_into_the_loop_the_step_and_its_gpu_call(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/executor-performance.md's eleventh round: of a prefill's 28.61 ms live, the worker loop took
    0.24 ms between steps and the step 1.87 ms beyond its GPU call; of a lone decode's 5.33 ms, 0.10 and
    0.42."""
    iteration_fidelity.main([str(FP8_RUN), "--profile", "h200-fp8-kvfp8"])
    table = rows(capsys.readouterr().out)
    assert table["prefill"][1:4] == ["28.61", "28.37", "26.50"]
    assert table["decode x1"][1:4] == ["5.33", "5.23", "4.81"]


def test_graphed_decodes_are_priced_by_their_longest_context(capsys: pytest.CaptureFixture[str]) -> None:
    """Each graph bucket's own line prices a replay by its longest context: what a live replay costs beyond
    its price no longer follows how unequal its contexts are (priced by their sum, decodes of 5 items of the
    third round's run ran 1.86 ms over, correlated +0.60 with the imbalance; by the lines -0.03 there, and
    -0.05 in this run)."""
    iteration_fidelity.main([str(FP8_RUN), "--profile", "h200-fp8-kvfp8"])
    lines = [line for line in capsys.readouterr().out.splitlines() if " decodes: " in line]
    assert lines[3] == (
        "  5 decodes: 178 iterations, GPU over profile -0.60 ms, correlation with imbalance -0.05 "
        "(mean imbalance 3283 tokens)"
    )
    correlations = [float(line.split("imbalance ")[1].split()[0]) for line in lines[:4]]  # 2-5 decodes
    assert all(abs(c) < 0.2 for c in correlations), correlations


def test_a_missing_profile_is_one_line() -> None:
    with pytest.raises(
        SystemExit, match=r"^iteration_fidelity: no profile of llada-8b on h200 in profiles/data/no"
    ):
        iteration_fidelity.main([str(FP8_RUN), "--profile", "nowhere"])


def test_the_gpu_time_against_the_price_per_window_shows_how_fast_each_call_ran(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/executor-performance.md's tenth round: both runs, in the profile's own call, ran their forwards
    0-9% faster than the profile prices them in every 10-second window."""
    windows = []
    for seed in (13, 14):
        run = Path(str(FP8_RUN).replace("seed13", f"seed{seed}"))
        iteration_fidelity.main([str(run), "--profile", "h200-fp8-kvfp8"])
        (line,) = [line for line in capsys.readouterr().out.splitlines() if "per 10 s window" in line]
        windows.append([int(w) for w in line.split(": ")[1].split()])
    assert windows[0] == [-7, -5, -4, -5, -4, 0, -2, -8]
    assert (min(windows[1]), max(windows[1])) == (-9, -1)
