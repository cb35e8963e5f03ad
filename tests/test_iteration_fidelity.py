"""`benchmarks.iteration_fidelity` over the shipped FP8 live run, against the profile named by --profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import iteration_fidelity

FP8_RUN = Path(__file__).parent.parent / "benchmarks/results/live-colocated-fp8-llada-8b-h200/live-qps1.12"


def rows(out: str) -> dict[str, list[str]]:
    """Each kind's columns (n, live ms, GPU ms, profile ms, error, time %) from the printed table."""
    split = [
        line.split() for line in out.splitlines() if line.startswith(("  decode x", "  mixed", "  prefill"))
    ]
    return {" ".join(words[:-6]): words[-6:] for words in split}


def test_profile_picks_the_profile_the_live_iterations_are_compared_with(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/executor-performance.md's figures: the FP8 run's single decodes 10.0% under its FP8 profile
    (11.1% under the bf16 one), its prefills 5.3% over."""
    iteration_fidelity.main([str(FP8_RUN), "--profile", "h200-fp8-kvfp8"])
    fp8 = rows(capsys.readouterr().out)
    iteration_fidelity.main([str(FP8_RUN)])
    bf16 = rows(capsys.readouterr().out)
    assert fp8["decode x1"][:2] == bf16["decode x1"][:2] == ["2765", "6.94"]  # the same live iterations
    assert (fp8["decode x1"][-2], bf16["decode x1"][-2], fp8["prefill"][-2]) == ("-10.0%", "-11.1%", "+5.3%")


def test_a_missing_profile_is_one_line() -> None:
    with pytest.raises(
        SystemExit, match=r"^iteration_fidelity: no profile of llada-8b on h200 in profiles/data/no"
    ):
        iteration_fidelity.main([str(FP8_RUN), "--profile", "nowhere"])
