"""`benchmarks.iteration_fidelity` over the shipped FP8 live run, against the profile named by --profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import iteration_fidelity

FP8_RUN = (
    Path(__file__).parent.parent / "benchmarks/results/live-colocated-fp8-llada-8b-h200-3/seed13/live-qps1.52"
)


def rows(out: str) -> dict[str, list[str]]:
    """Each kind's columns (n, live ms, GPU ms, profile ms, error, time %) from the printed table."""
    split = [
        line.split() for line in out.splitlines() if line.startswith(("  decode x", "  mixed", "  prefill"))
    ]
    return {" ".join(words[:-6]): words[-6:] for words in split}


def test_profile_picks_the_profile_the_live_iterations_are_compared_with(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/executor-performance.md's figures: the FP8 run's single decodes 4.6% under its FP8 profile
    (8.6% over the bf16 one), its mixed iterations 1.8% over, its decodes of 5+ items 24.0% under."""
    iteration_fidelity.main([str(FP8_RUN), "--profile", "h200-fp8-kvfp8"])
    fp8 = rows(capsys.readouterr().out)
    iteration_fidelity.main([str(FP8_RUN)])
    bf16 = rows(capsys.readouterr().out)
    assert fp8["decode x1"][:2] == bf16["decode x1"][:2] == ["1761", "5.66"]  # the same live iterations
    assert (fp8["decode x1"][-2], bf16["decode x1"][-2]) == ("-4.6%", "+8.6%")
    assert (fp8["mixed"][-2], fp8["decode x5+"][-2]) == ("+1.8%", "-24.0%")


def test_graphed_decodes_of_mixed_contexts_cost_more_the_more_their_contexts_differ(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The figures behind the FP8 validation's cause: decodes of 5 items, replayed in the 8-item graph,
    take 1.86 ms more than the profile prices, and the more so the more their contexts differ."""
    iteration_fidelity.main([str(FP8_RUN), "--profile", "h200-fp8-kvfp8"])
    lines = [line for line in capsys.readouterr().out.splitlines() if " decodes: " in line]
    assert lines[0].startswith("  2 decodes: 1168 iterations, GPU over profile -0.34 ms")
    assert lines[3] == (
        "  5 decodes: 142 iterations, GPU over profile +1.86 ms, correlation with imbalance +0.60 "
        "(mean imbalance 3187 tokens)"
    )


def test_a_missing_profile_is_one_line() -> None:
    with pytest.raises(
        SystemExit, match=r"^iteration_fidelity: no profile of llada-8b on h200 in profiles/data/no"
    ):
        iteration_fidelity.main([str(FP8_RUN), "--profile", "nowhere"])
